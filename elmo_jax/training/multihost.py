"""What changes when training runs as several processes (hosts): start-up, per-process batches, and the
few host values the processes must agree on.

One process per host (or per GPU), all running the same `train.py` command: each reads only its own
rows of the global batch and hands them to `jax.make_array_from_process_local_data`; JAX's collectives
(ICI/DCN on TPU, NCCL on GPU, gloo on CPU) do the rest. With one process every function here is a
no-op or a plain conversion.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from elmo_jax.data.batch_stream import DIRECTIONS, merge_states


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: list[int] | None = None) -> None:
    """`jax.distributed.initialize` before anything touches a device.

    Without arguments JAX detects the cluster (Cloud TPU pod slices, SLURM, Open MPI) or reads
    JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID. CPU processes talk through gloo.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # only affects the CPU backend
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids)
    logging.info("process %d of %d: %d local devices, %d in all", jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count())


def global_batch(local: dict[str, np.ndarray], sharding: jax.sharding.Sharding, batch_size: int) -> dict[str, jax.Array]:
    """The global batch arrays (D, B, ...) from this process's rows (D, b, ...) of each."""
    return {k: jax.make_array_from_process_local_data(sharding, v, (v.shape[0], batch_size) + v.shape[2:])
            for k, v in local.items()}


def agree_max(value: int) -> int:
    """The largest of every process's `value` (e.g. the char CNN's position bucket, a static argument:
    all processes must compile the same program)."""
    if jax.process_count() == 1:
        return value
    return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def gather_stream_state(state: dict[str, Any]) -> dict[str, Any]:
    """One batch-stream state holding the rows of every process (what a checkpoint stores, so that a run
    with N processes resumes with M). Each process passes its own `BiLMBatchStream.get_state()`."""
    if jax.process_count() == 1:
        return state
    rows = sorted(int(r) for r in state[DIRECTIONS[0]])
    table = np.array([[r] + [v for d in DIRECTIONS for v in state[d][str(r)]] for r in rows], np.int64)
    # int64 travels as pairs of int32 (JAX without x64 would truncate stream positions past 2**31).
    gathered = multihost_utils.process_allgather(table.view(np.int32))
    per_process = []
    for t in np.asarray(gathered).view(np.int64):  # (rows, 1 + 2 * len(DIRECTIONS))
        part = {k: v for k, v in state.items() if k not in DIRECTIONS}
        for i, d in enumerate(DIRECTIONS):
            part[d] = {str(int(row[0])): [int(row[1 + 2 * i]), int(row[2 + 2 * i])] for row in t}
        per_process.append(part)
    return merge_states(per_process)


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
