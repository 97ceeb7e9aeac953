"""Each distinct token of a batch through the char CNN once.

A token's vector depends only on its characters, and a training batch repeats words: in text that
follows Zipf's law over the 1B Word Benchmark's 793k-word vocabulary, about 57% of the 5,120 tokens
one device holds in a `bilm_large` step (128 rows x 20 steps x 2 directions) are distinct (see
docs/TPU.md, "Distinct tokens"). The char CNN, whose cost follows its token count, then runs on each
device's distinct tokens only, and its vectors are copied back to every use.

The batch's token axis is split into `shards` contiguous blocks, one per device of the mesh's batch
axis (the layout of `training.lm.lm_outputs`); each block is de-duplicated on its own, so no device
needs another's tokens. Shapes are static: the host counts the most distinct tokens any block holds
(`distinct_capacity`, in steps of 1/8 of a block, so that a stream compiles few variants) and every
block keeps that many slots. The numbers are the char CNN's on every token, up to the order of float
sums: a repeated token's gradient is summed over its uses before the CNN's backward pass, not after.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from elmo_jax.model.char_cnn import token_embedding
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.precision import ComputeOptions

# Capacities are rounded up to a multiple of 1/CAPACITY_STEPS of a block's tokens.
CAPACITY_STEPS = 8
# Character ids below 2**9 (262 ids, shifted), packed three to a uint32 sort key.
_ID_BITS = 9


def distinct_capacity(char_ids: np.ndarray, shards: int) -> int | None:
    """Host-side: the slots each block needs, or None when de-duplicating would not shrink a block.

    Args:
      char_ids: int (N, C), the tokens in the order the model flattens them (`lm_outputs`).
      shards: the contiguous blocks of N the tokens are split into (the batch axis's devices held by
        this process).

    Returns:
      The largest count of distinct rows of any block, rounded up to a multiple of ceil(n / 8) for
      n = N / shards; None if that is n.
    """
    N = char_ids.shape[0]
    if shards < 1 or N % shards:
        raise ValueError(f"{N} tokens do not split into {shards} equal blocks")
    n = N // shards
    rows = np.ascontiguousarray(char_ids.reshape(shards, n, -1))
    most = max(len(np.unique(block.view(np.dtype((np.void, block.dtype.itemsize * block.shape[1]))))) for block in rows)
    return rounded_slots(most, n)


def rounded_slots(count: int, n: int) -> int | None:
    """`count` distinct tokens of a block of n rounded up to a multiple of ceil(n / 8); None if that is n."""
    step = -(-n // CAPACITY_STEPS)
    capacity = min(n, -(-count // step) * step)
    return None if capacity >= n else capacity


def _sort_keys(ids: jax.Array) -> list[jax.Array]:
    """ids int (S, n, C) in [0, 2**9) -> ceil(C / 3) uint32 (S, n) keys, three ids each."""
    C = ids.shape[-1]
    padded = jnp.pad(ids, ((0, 0), (0, 0), (0, -C % 3))).astype(jnp.uint32)
    triples = padded.reshape(*ids.shape[:2], -1, 3)
    packed = (triples[..., 0] << (2 * _ID_BITS)) | (triples[..., 1] << _ID_BITS) | triples[..., 2]
    return [packed[..., k] for k in range(packed.shape[-1])]


def distinct_rows(ids: jax.Array, shards: int, capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Device-side: each block's distinct rows and where every token's row went.

    Args:
      ids: int (N, C) shifted character ids (< 2**9), N = shards * n.
      shards: contiguous blocks, each de-duplicated on its own.
      capacity: slots per block (`distinct_capacity`).

    Returns:
      distinct int (shards * capacity, C): block s's distinct rows in slots [s * capacity, ...), in
        sorted order, the unused slots holding the block's first row again; inverse int32 (shards, n):
        each token's slot within its block; overflow bool (): some block has more distinct rows than
        `capacity` (its tokens past the last slot are then wrong: callers must not use the result).
    """
    N, C = ids.shape
    n = N // shards
    blocks = ids.reshape(shards, n, C)
    keys = _sort_keys(blocks)
    order = lax.broadcasted_iota(jnp.int32, (shards, n), 1)
    *sorted_keys, order = lax.sort((*keys, order), dimension=1, num_keys=len(keys))
    differs = jnp.zeros((shards, n - 1), bool)
    for k in sorted_keys:
        differs = differs | (k[:, 1:] != k[:, :-1])
    first = jnp.concatenate([jnp.ones((shards, 1), bool), differs], axis=1)  # (shards, n), in sorted order
    slot = jnp.cumsum(first, axis=1, dtype=jnp.int32) - 1
    overflow = jnp.any(slot[:, -1] >= capacity)

    def one_block(rows, first, order, slot):
        inverse = jnp.zeros((n,), jnp.int32).at[order].set(slot)
        # Each slot's row: the first token of its run in sorted order (others point past the slots: dropped).
        source = jnp.zeros((capacity,), jnp.int32).at[jnp.where(first, slot, capacity)].set(order, mode="drop")
        return rows[source], inverse

    distinct, inverse = jax.vmap(one_block)(blocks, first, order, slot)
    return distinct.reshape(shards * capacity, C), inverse, overflow


def expand(vectors: jax.Array, inverse: jax.Array) -> jax.Array:
    """Every token's vector from its block's slots: vectors (shards * capacity, P), inverse (shards, n)
    -> (shards * n, P). Batched over blocks, so a mesh splitting the blocks gathers nothing from other
    devices (a gather by global index made XLA's partitioner all-gather every device's vectors)."""
    shards, n = inverse.shape
    per_block = vectors.reshape(shards, -1, vectors.shape[-1])
    return jax.vmap(lambda v, i: v[i])(per_block, inverse).reshape(shards * n, -1)


def distinct_token_embedding(weights, config: BiLMConfig, ids: jax.Array, compute: ComputeOptions) -> jax.Array:
    """`token_embedding(weights, config, ids, compute, token_block=None)` computed once per distinct row of
    each of `compute.token_shards` blocks with `compute.distinct_tokens` slots each: ids int (N, C)
    shifted -> float32 (N, P). All NaN if a block has more distinct rows than slots (so that a wrong
    capacity stops training at its non-finite check instead of training on wrong vectors)."""
    distinct, inverse, overflow = distinct_rows(ids, compute.token_shards, compute.distinct_tokens)
    vectors = token_embedding(weights, config, distinct, compute, token_block=None)
    return jnp.where(overflow, jnp.nan, expand(vectors, inverse))
