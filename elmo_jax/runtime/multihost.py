"""What changes when training runs as several processes (hosts): start-up, per-process batches, and the
few host values the processes must agree on.

One process per host (or per GPU), all running the same `train.py` command: each reads only its own
rows of the global batch and hands them to `jax.make_array_from_process_local_data`; JAX's collectives
(ICI/DCN on TPU, NCCL on GPU, gloo on CPU) do the rest. With one process every function here is a
no-op or a plain conversion.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils


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


def start(
    distributed: bool,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: list[int] | None = None,
) -> bool:
    """`initialize` when a command runs as one of several processes: --distributed, any of the three
    coordinator flags (which go together), or JAX_COORDINATOR_ADDRESS in the environment. Returns whether
    it did (before any device use)."""
    explicit = (coordinator_address, num_processes, process_id)
    if not (distributed or any(v is not None for v in explicit) or "JAX_COORDINATOR_ADDRESS" in os.environ):
        return False
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        raise ValueError(
            "--coordinator_address, --num_processes and --process_id go together; found "
            f"{coordinator_address!r}, {num_processes!r}, {process_id!r}"
        )
    initialize(coordinator_address, num_processes, process_id, local_device_ids)
    return True


def global_batch(
    local: dict[str, np.ndarray], sharding: jax.sharding.Sharding, batch_size: int
) -> dict[str, jax.Array]:
    """The global batch arrays (D, B, ...) from this process's rows (D, b, ...) of each."""
    return {
        k: jax.make_array_from_process_local_data(sharding, v, (v.shape[0], batch_size) + v.shape[2:])
        for k, v in local.items()
    }


def agree_max(value: int) -> int:
    """The largest of every process's `value` (e.g. the char CNN's position bucket, a static argument:
    all processes must compile the same program)."""
    if jax.process_count() == 1:
        return value
    return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def fetch(tree: Any) -> Any:
    """NumPy copies of (possibly sharded, multi-process) arrays, whole on every process; every process
    must call it."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def barrier(name: str) -> None:
    """Waits until every process gets here (e.g. process 0 has prepared the corpus)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
