"""The char CNN once per distinct token (`model.distinct_tokens`): each block's distinct rows against NumPy,
the host's slot count worked by hand, the token vectors and gradients against the char CNN over every
token, and a training step on an 8-device mesh against the same step without it.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.model.char_cnn import token_embedding
from elmo_jax.model.distinct_tokens import distinct_capacity, distinct_rows, distinct_token_embedding
from elmo_jax.model.params import init_params
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.training import jitted_steps, sharding
from elmo_jax.training.batch_feed import distinct_bucket
from elmo_jax.training.optimizers import Optimizer
from elmo_jax.training.train_step import StepConfig
from tests.support.models import tiny_bilm_config
from tests.support.tolerance import assert_close_up_to_order

C = 12
MODEL = tiny_bilm_config(max_characters_per_token=C, n_layers=1)


def words(rng, pool: int, count: int) -> np.ndarray:
    """`count` raw char-id rows (C,) drawn from `pool` distinct words of 1-6 bytes: BOW, bytes, EOW, PAD."""
    vocab = np.full((pool, C), 260, np.int32)
    for w in range(pool):
        length = 1 + w % 6
        vocab[w, 0], vocab[w, 1 : 1 + length], vocab[w, 1 + length] = 258, rng.integers(0, 256, length), 259
    return vocab[rng.integers(0, pool, count)]


def test_each_block_keeps_its_distinct_rows_once_and_every_token_finds_its_own():
    rng = np.random.default_rng(0)
    blocks = [words(rng, 4, 12), words(rng, 9, 12)]  # 2 blocks of 12 tokens
    ids = np.concatenate(blocks) + 1
    counts = [len(np.unique(b, axis=0)) for b in blocks]
    capacity = max(counts)
    distinct, inverse, overflow = jax.jit(distinct_rows, static_argnums=(1, 2))(jnp.asarray(ids), 2, capacity)
    distinct, inverse = np.asarray(distinct), np.asarray(inverse)
    assert not overflow and distinct.shape == (2 * capacity, C) and inverse.shape == (2, 12)
    for s, block in enumerate(blocks):
        np.testing.assert_array_equal(distinct[s * capacity + inverse[s]], block + 1, err_msg=f"block {s}")
        used = distinct[s * capacity + np.unique(inverse[s])]
        assert len(used) == counts[s] == len(np.unique(used, axis=0)), "one slot per distinct row"
    assert bool(jax.jit(distinct_rows, static_argnums=(1, 2))(jnp.asarray(ids), 2, capacity - 1)[2]), "overflow"


def test_slots_are_the_largest_block_count_rounded_up_to_eighths_of_a_block():
    rng = np.random.default_rng(1)
    # Blocks of 16 tokens (a step of 2 slots): 3 and 5 distinct rows -> 6 slots.
    ids = np.concatenate([words(rng, 3, 16), words(rng, 5, 16)])
    assert [len(np.unique(b, axis=0)) for b in ids.reshape(2, 16, C)] == [3, 5]
    assert distinct_capacity(ids, 2) == 6
    assert distinct_capacity(ids, 1) == 8  # one block of 32 (steps of 4) with 3 + 5 distinct rows
    # 15 of 16 distinct rows round up to the whole block: nothing to save.
    assert distinct_capacity(np.concatenate([ids[:1], np.arange(15 * C).reshape(15, C)]), 1) is None
    with pytest.raises(ValueError, match="32 tokens do not split into 3 equal blocks"):
        distinct_capacity(ids, 3)


def test_the_batch_s_tokens_are_counted_in_the_order_the_model_flattens_them():
    """`distinct_bucket` flattens (D, b, T) as rows, directions, steps: row 0 of both directions is block 0."""
    rng = np.random.default_rng(2)
    char_ids = np.empty((2, 2, 4, C), np.int32)
    char_ids[:, 0] = words(rng, 1, 1)  # row 0: one word in both directions -> block 0 has 1 distinct row
    char_ids[:, 1] = words(rng, 8, 8).reshape(2, 4, C)  # row 1: up to 8 words
    per_row = len(np.unique(char_ids[:, 1].reshape(-1, C), axis=0))
    assert distinct_bucket({"char_ids": char_ids}, 2) == (per_row if per_row < 8 else None)


def embed(weights, ids, compute):
    return token_embedding(weights, MODEL, ids, compute, token_block=None)


def distinct_problem():
    """64 tokens of 10 words in 2 blocks, the weights, a cotangent, and the blocks' slots."""
    ids = jnp.asarray(words(np.random.default_rng(3), 10, 64) + 1)
    capacity = distinct_capacity(np.asarray(ids), 2)
    assert capacity is not None and capacity < 32
    g = jax.random.normal(jax.random.key(1), (64, MODEL.projection_dim))
    return ids, init_params(MODEL, jax.random.key(0)).weights, g, capacity


def vectors_and_gradient(ids, weights, g, dtype: str, capacity: int | None):
    compute = ComputeOptions(dtype=dtype, content_positions=8, token_shards=2, distinct_tokens=capacity)

    def vectors(w):
        if capacity is None:
            return token_embedding(w, MODEL, ids, compute, token_block=None)
        return distinct_token_embedding(w, MODEL, ids, compute)

    return jax.jit(lambda w: (vectors(w), jax.grad(lambda v: jnp.sum(vectors(v) * g))(w)))(weights)


def flat(tree) -> dict[str, jax.Array]:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_float32_vectors_and_gradients_equal_the_char_cnn_over_every_token():
    ids, weights, g, capacity = distinct_problem()
    vectors, gradient = vectors_and_gradient(ids, weights, g, "float32", capacity)
    want_vectors, want_gradient = vectors_and_gradient(ids, weights, g, "float32", None)
    # Each token's vector comes from the same computation on its own row: the same sums.
    assert_close_up_to_order(vectors, want_vectors, terms=MODEL.n_filters)
    for name, want in flat(want_gradient).items():
        # Sums over the 64 tokens (and a kernel's over their starts), grouped by word first.
        assert_close_up_to_order(flat(gradient)[name], want, terms=64 * C, err_msg=name)


def test_bfloat16_gradient_is_as_close_to_float32_as_over_every_token():
    """In bfloat16 a repeated word's gradient is rounded once, summed over its uses, instead of per use."""
    ids, weights, g, capacity = distinct_problem()
    truth = flat(vectors_and_gradient(ids, weights, g, "float32", None)[1])

    def error(capacity):
        got = flat(vectors_and_gradient(ids, weights, g, "bfloat16", capacity)[1])
        return max(float(jnp.linalg.norm(got[k] - truth[k]) / jnp.linalg.norm(truth[k])) for k in truth)

    once, every = error(capacity), error(None)
    assert once < 0.05 and once <= 1.1 * every, (once, every)


def test_too_few_slots_make_every_vector_nan_rather_than_wrong():
    ids = jnp.asarray(words(np.random.default_rng(4), 10, 32) + 1)
    weights = init_params(MODEL, jax.random.key(0)).weights
    compute = ComputeOptions(content_positions=8, distinct_tokens=2)
    vectors = jax.jit(lambda w: distinct_token_embedding(w, MODEL, ids, compute))(weights)
    assert bool(jnp.all(jnp.isnan(vectors)))


# ----------------------------------------------------------------------------- a training step on a mesh

B, T, VOCAB = 8, 5, 40
CFG = StepConfig(model=MODEL, vocab_size=VOCAB, unroll_steps=T, n_negative_samples=8, dropout=0.0)
OPTIMIZER = Optimizer(learning_rate=0.2, clip_norm=10.0, initial_accumulator=1.0)


def step_on_mesh(mesh, batch: dict[str, np.ndarray], distinct: bool):
    steps = jitted_steps.jit_steps(mesh, CFG, OPTIMIZER, B)
    slots = distinct_bucket(batch, steps.local_token_shards) if distinct else None
    state = steps.init(jax.random.key(0), None, None)
    placed = {k: jax.device_put(v, steps.batch) for k, v in batch.items()}
    compiled = steps.train.lower(state, placed, 8, slots).compile()
    state, metrics = compiled(state, placed)
    return slots, float(metrics["loss"]), jax.device_get(state.params), compiled.as_text()


def test_a_training_step_on_a_mesh_equals_the_step_over_every_token_and_gathers_no_vectors():
    """8 x 1: one row (10 tokens) per device, each de-duplicated on its own device."""
    rng = np.random.default_rng(5)
    batch = {
        "char_ids": words(rng, 4, 2 * B * T).reshape(2, B, T, C),
        "targets": rng.integers(0, VOCAB, (2, B, T)).astype(np.int32),
        "mask": np.ones((2, B, T), bool),
        "carry": np.zeros((2, B), bool),
        "reset": np.zeros((2, B, T), bool),
    }
    mesh = sharding.make_mesh(8, 1)
    slots, loss, params, hlo = step_on_mesh(mesh, batch, distinct=True)
    assert slots is not None and slots <= 6, "4 words in 10 tokens per device: at most 6 slots of 10"
    _, want_loss, want_params, _ = step_on_mesh(mesh, batch, distinct=False)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(want_params)):
        assert_close_up_to_order(got, want, terms=2 * B * T * C, err_msg=jax.tree_util.keystr(path))
    # Every device's tokens find their vectors on that device: no collective moves the (8 x slots, P)
    # vectors (a gather by global slot made the partitioner all-gather them).
    vectors = f"f32[{8 * slots},{MODEL.projection_dim}]"
    collectives = re.findall(r"= (\S+) (?:all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)", hlo)
    assert collectives and vectors not in [shape.split("{")[0] for shape in collectives]
