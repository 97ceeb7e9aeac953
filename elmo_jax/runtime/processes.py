"""The meetings of the processes of one run (one process per host or per GPU, all running the same
command): starting `jax.distributed`, waiting for each other, agreeing on host values, exchanging text,
and the global arrays built from each process's rows. Training and the file pipeline both use them.

With one process every function here is a no-op or a plain conversion. JAX's collectives do the work
(ICI/DCN on TPU, NCCL on GPU, gloo on CPU).

When another process of the run dies (killed, crashed), the next meeting fails at once (gloo: the
connection was closed by the peer) and raises `ProcessLost` naming it, so the survivors stop instead of
waiting for it; a command then exits at once (JAX's own shutdown would wait for the dead process's
heartbeat to time out, 100 s, and then abort).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

MAX_TEXT_BYTES = 4096  # a path or digest exchanged between processes


class ProcessLost(RuntimeError):
    """Another process of this run stopped or failed: a meeting of the processes could not complete."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How a command runs as one of several processes: its --distributed, --coordinator_address,
    --num_processes, --process_id (and --local_device_ids) flags (`cli.define_distributed_flags`)."""

    distributed: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None

    def start(self) -> bool:
        """`initialize` when this is one of several processes: --distributed, any of the three
        coordinator flags (which go together), or JAX_COORDINATOR_ADDRESS in the environment. Returns
        whether it did (call it before any device use)."""
        explicit = (self.coordinator_address, self.num_processes, self.process_id)
        if not (self.distributed or any(v is not None for v in explicit) or "JAX_COORDINATOR_ADDRESS" in os.environ):
            return False
        if any(v is not None for v in explicit) and any(v is None for v in explicit):
            raise ValueError(
                "--coordinator_address, --num_processes and --process_id go together; found "
                f"{self.coordinator_address!r}, {self.num_processes!r}, {self.process_id!r}"
            )
        devices = None if self.local_device_ids is None else list(self.local_device_ids)
        initialize(*explicit, devices)
        return True


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: list[int] | None = None,
) -> None:
    """`jax.distributed.initialize` before anything touches a device.

    Without arguments JAX detects the cluster (Cloud TPU pod slices, SLURM, Open MPI) or reads
    JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID. CPU processes talk through gloo.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # only affects the CPU backend
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
    )
    logging.info(
        "process %d of %d: %d local devices, %d in all",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def share() -> tuple[int, int]:
    """(this process's index, the number of processes)."""
    return jax.process_index(), jax.process_count()


def barrier(name: str) -> None:
    """Waits until every process gets here (e.g. process 0 has prepared the corpus)."""
    if jax.process_count() > 1:
        with _meeting(name):
            multihost_utils.sync_global_devices(name)


def agree_max(value: int) -> int:
    """The largest of every process's `value` (e.g. the char CNN's position bucket, a static argument:
    all processes must compile the same program)."""
    if jax.process_count() == 1:
        return value
    with _meeting("agreeing on a value"):
        return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def agree_max_each(values: np.ndarray) -> np.ndarray:
    """The element-wise largest of every process's int32 `values` (n,): several host values agreed in
    one collective."""
    return gather(values.astype(np.int32)).max(axis=0)


def gather(array: np.ndarray) -> np.ndarray:
    """Every process's `array` (same shape and dtype on each), stacked by process index: (processes, ...).
    Every process must call it."""
    if jax.process_count() == 1:
        return array[None]
    with _meeting("gathering host values"):
        return np.asarray(multihost_utils.process_allgather(array)).reshape((jax.process_count(),) + array.shape)


def fetch(tree: Any) -> Any:
    """NumPy copies of (possibly sharded, multi-process) arrays, whole on every process; every process
    must call it."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    with _meeting("fetching arrays"):
        return multihost_utils.process_allgather(tree, tiled=True)


def global_batch(
    local: dict[str, np.ndarray], sharding: jax.sharding.Sharding, batch_size: int
) -> dict[str, jax.Array]:
    """The global batch arrays (D, B, ...) from this process's rows (D, b, ...) of each."""
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (v.shape[0], batch_size) + v.shape[2:])
        for k, v in local.items()
    }


def gather_text(text: str) -> list[str]:
    """Every process's `text`, by process index (every process must call it)."""
    if jax.process_count() == 1:
        return [text]
    data = text.encode("utf-8")
    if len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"internal error: {len(data)} bytes to exchange between processes, at most {MAX_TEXT_BYTES}")
    padded = np.zeros(MAX_TEXT_BYTES + 2, np.uint8)
    padded[:2] = divmod(len(data), 256)
    padded[2 : 2 + len(data)] = np.frombuffer(data, np.uint8)
    with _meeting("exchanging paths and digests"):
        gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(jax.process_count(), -1)
    return [bytes(row[2 : 2 + int(row[0]) * 256 + int(row[1])]).decode("utf-8") for row in gathered]


def check_same(what: str, value: str) -> None:
    """Raises ValueError unless every process has the same `value` (e.g. the input's digest)."""
    values = gather_text(value)
    if len(set(values)) > 1:
        differing = [i for i, v in enumerate(values) if v != values[0]]
        raise ValueError(
            f"the processes see different {what}: process 0 and process(es) {differing} differ; every process "
            "must read the same input with the same arguments"
        )


@contextlib.contextmanager
def _meeting(name: str) -> Iterator[None]:
    """A collective of every process: its failure (a runtime error of the collective) is `ProcessLost`."""
    try:
        yield
    except RuntimeError as e:  # jax.errors.JaxRuntimeError (XlaRuntimeError before jax 0.4.36) of the collective
        index, count = share()
        other = f"process {1 - index} of 2" if count == 2 else f"another of the {count} processes"
        cause = " ".join(str(e).split())
        raise ProcessLost(
            f"{other} of this run stopped or failed while process {index} waited for it at {name!r} ({cause})"
        ) from e
