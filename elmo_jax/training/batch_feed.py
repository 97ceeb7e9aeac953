"""From the batch stream to the devices: a stream window as the (D, B, ...) arrays the jitted steps
read, and the stream's position as one state holding every process's rows (what a checkpoint stores).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

import jax
import numpy as np

from elmo_jax.data.batch_stream import DIRECTIONS, merge_states
from elmo_jax.model.char_cnn import content_bucket
from elmo_jax.model.chars import PAD_CHAR
from elmo_jax.model.distinct_tokens import distinct_capacity
from elmo_jax.runtime import processes

BATCH_KEYS = ("char_ids", "targets", "mask", "carry", "reset")


def device_batch(
    window: dict[str, dict[str, np.ndarray]], max_chars: int, pad: int = PAD_CHAR + 1
) -> tuple[dict[str, np.ndarray], int]:
    """A stream window's directions stacked on a leading D axis, and the char CNN's position bucket.

    Args:
      window: `BiLMBatchStream`'s {"forward": {...}, "backward": {...}} of (b, T, ...) arrays.
      max_chars: C, character slots per token.
      pad: the shifted id of the padding character (`model.vocabulary.pad_id`: a model with its own
        characters has its own).

    Returns:
      ({key: (D, b, ...)} for `BATCH_KEYS`, the content-position bucket of the window's real tokens).
    """
    batch = {k: np.stack([window[d][k] for d in DIRECTIONS]) for k in BATCH_KEYS}
    # content_bucket reads shifted ids with 0 for "no token": shift the real positions only.
    shifted = np.where(batch["mask"][..., None], batch["char_ids"] + 1, 0)
    return batch, content_bucket(shifted, max_chars, pad)


def step_shape(
    needed: tuple[int, int | None], met: Mapping[tuple, int], compiled: Collection[tuple]
) -> tuple[int, int | None]:
    """The char CNN buckets (positions, distinct-token slots; None: every token) a training step runs with.

    A batch needs `needed` (`device_batch`, `distinct_bucket`); more positions or more slots compute the
    same numbers (up to float32 summation order), only a little slower. The first time a shape is met
    (`met[needed]` is 1: it counts this batch), the step runs with the cheapest compiled shape that holds
    it, if one does: a batch that is rare (one with short words only, met once in the demo's 600 steps)
    then costs one slightly slower step instead of a compile of the whole step (seconds on a CPU, a
    minute or more for the large model on a TPU) that no ETA foresees. A shape met again has earned its
    own program, so a text whose first batch was wide does not run every later batch wide.

    Args:
      needed: (positions, slots) the batch needs.
      met: steps that needed each shape so far, this one included.
      compiled: the shapes the training step is compiled for.
    """
    if needed in compiled or met.get(needed, 0) > 1:
        return needed
    positions, distinct = needed

    def holds(shape: tuple[int, int | None]) -> bool:
        return shape[0] >= positions and (shape[1] is None or (distinct is not None and shape[1] >= distinct))

    covering = [shape for shape in compiled if holds(shape)]
    if not covering:
        return needed
    return min(covering, key=lambda shape: (shape[0], math.inf if shape[1] is None else shape[1]))


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
