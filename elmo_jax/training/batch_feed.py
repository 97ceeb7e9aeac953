"""From the batch stream to the devices: a stream window as the (D, B, ...) arrays the jitted steps
read, and the stream's position as one state holding every process's rows (what a checkpoint stores).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from elmo_jax.data.batch_stream import DIRECTIONS, merge_states
from elmo_jax.model.char_cnn import content_bucket
from elmo_jax.model.distinct_tokens import distinct_capacity
from elmo_jax.runtime import processes

BATCH_KEYS = ("char_ids", "targets", "mask", "carry", "reset")


def device_batch(window: dict[str, dict[str, np.ndarray]], max_chars: int) -> tuple[dict[str, np.ndarray], int]:
    """A stream window's directions stacked on a leading D axis, and the char CNN's position bucket.

    Args:
      window: `BiLMBatchStream`'s {"forward": {...}, "backward": {...}} of (b, T, ...) arrays.
      max_chars: C, character slots per token.

    Returns:
      ({key: (D, b, ...)} for `BATCH_KEYS`, the content-position bucket of the window's real tokens).
    """
    batch = {k: np.stack([window[d][k] for d in DIRECTIONS]) for k in BATCH_KEYS}
    # content_bucket reads shifted ids with 0 for "no token": shift the real positions only.
    shifted = np.where(batch["mask"][..., None], batch["char_ids"] + 1, 0)
    return batch, content_bucket(shifted, max_chars)


def distinct_bucket(batch: dict[str, np.ndarray], shards: int) -> int | None:
    """The char CNN's distinct-token slots per device for a `device_batch` (`ComputeOptions.distinct_tokens`),
    or None when de-duplicating would not shrink any device's tokens.

    shards: the blocks of rows this process's devices hold (`Steps.local_token_shards`); their tokens are
    flattened as the model flattens them (rows, directions, steps: `lm.lm_outputs`).
    """
    char_ids = batch["char_ids"]  # (D, b, T, C)
    flat = np.swapaxes(char_ids, 0, 1).reshape(-1, char_ids.shape[-1])
    return distinct_capacity(flat, shards)


def gather_stream_state(state: dict[str, Any]) -> dict[str, Any]:
    """One batch-stream state holding the rows of every process (what a checkpoint stores, so that a run
    with N processes resumes with M). Each process passes its own `BiLMBatchStream.get_state()`."""
    if jax.process_count() == 1:
        return state
    rows = sorted(int(r) for r in state[DIRECTIONS[0]])
    table = np.array([[r] + [v for d in DIRECTIONS for v in state[d][str(r)]] for r in rows], np.int64)
    # int64 travels as pairs of int32 (JAX without x64 would truncate stream positions past 2**31).
    gathered = processes.gather(table.view(np.int32))
    per_process = []
    for t in gathered.view(np.int64):  # (rows, 1 + 2 * len(DIRECTIONS))
        part = {k: v for k, v in state.items() if k not in DIRECTIONS}
        for i, d in enumerate(DIRECTIONS):
            part[d] = {str(int(row[0])): [int(row[1 + 2 * i]), int(row[2 + 2 * i])] for row in t}
        per_process.append(part)
    return merge_states(per_process)
