"""The sparse softmax update (training/row_update.py) against the dense one: one train step of the tiny
biLM both ways gives the same parameters, Adagrad accumulators and metrics (within 1e-6), with the
global-norm clip live and ids repeated among the candidates, the groups, both directions and the
targets; rows no step read stay bit-identical. The per-id sums are checked against NumPy's `np.add.at`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.training.row_update import distinct_rows, row_slots, sum_rows
from elmo_jax.training.train_step import StepConfig, init_train_state, make_optimizer, softmax_row_slots, train_step
from tests.support.models import random_char_ids, tiny_bilm_config

D, B, T, C, V, S, GROUP = 2, 4, 5, 10, 40, 6, 2


def test_rows_are_summed_per_distinct_id():
    """Every use of an id lands in its slot, and each slot holds the sum of its uses (np.add.at)."""
    rng = np.random.default_rng(0)
    candidates = rng.integers(0, 12, (D, 3, 4)).astype(np.int32)
    targets = rng.integers(0, 12, (D, B, T)).astype(np.int32)
    slots = row_slots(D, 3, 4, B, T, 12)
    ids, c_slots, t_slots = distinct_rows(jnp.asarray(candidates), jnp.asarray(targets), slots, fill=99)
    ids, c_slots, t_slots = np.asarray(ids), np.asarray(c_slots), np.asarray(t_slots)
    distinct = np.unique(np.concatenate([candidates.ravel(), targets.ravel()]))
    np.testing.assert_array_equal(ids[: len(distinct)], distinct)
    assert np.all(ids[len(distinct) :] == 99)
    np.testing.assert_array_equal(ids[c_slots], candidates)
    np.testing.assert_array_equal(ids[t_slots], targets)
    grads = {
        "candidate_W": rng.normal(size=(D, 3, 4, 3)).astype(np.float32),
        "candidate_b": rng.normal(size=(D, 3, 4)).astype(np.float32),
        "true_W": rng.normal(size=(D, B, T, 3)).astype(np.float32),
        "true_b": rng.normal(size=(D, B, T)).astype(np.float32),
    }
    summed = sum_rows(jax.tree.map(jnp.asarray, grads), jnp.asarray(c_slots), jnp.asarray(t_slots), slots)
    for key, tail in (("W", (3,)), ("b", ())):
        want = np.zeros((100, *tail), np.float64)
        np.add.at(want, candidates.ravel(), grads[f"candidate_{key}"].reshape(-1, *tail))
        np.add.at(want, targets.ravel(), grads[f"true_{key}"].reshape(-1, *tail))
        np.testing.assert_allclose(np.asarray(summed[key])[: len(distinct)], want[distinct], atol=1e-6)


@pytest.fixture(scope="module")
def states():
    """(state, batch, sparse cfg, dense cfg): a fresh tiny biLM whose softmax rows have std 2, so the
    gradient norm exceeds the clip of 1; frequent targets, so ids repeat."""
    config = tiny_bilm_config(max_characters_per_token=C)
    cfg = StepConfig(
        model=config, vocab_size=V, unroll_steps=T, dropout=0.1, n_negative_samples=S, negative_sample_group_rows=GROUP
    )
    optimizer = make_optimizer(0.2, 1.0, 1.0)
    state = init_train_state(jax.random.key(0), cfg, optimizer, B)
    W = state.params["softmax"]["W"]
    state = state.replace(params={**state.params, "softmax": {**state.params["softmax"], "W": W * 2 * np.sqrt(8)}})
    rng = np.random.default_rng(1)
    chars = np.stack([random_char_ids(rng, [T] * B, C, max_bytes=6) - 1 for _ in range(D)]).astype(np.int32)
    batch = {
        "char_ids": chars,
        "targets": rng.integers(0, 8, (D, B, T)).astype(np.int32),  # frequent ids, also among the candidates
        "mask": rng.random((D, B, T)) < 0.9,
        "carry": np.ones((D, B), bool),
    }
    return state, batch, cfg, dataclasses.replace(cfg, sparse_softmax_update=False), optimizer


@pytest.mark.slow
def test_the_sparse_update_is_the_dense_update(states):
    """Two steps each way from the same state: every parameter, accumulator and metric within 1e-6."""
    state, batch, sparse, dense, optimizer = states
    assert softmax_row_slots(sparse, B) == V and softmax_row_slots(dense, B) is None
    results = {}
    for name, cfg in (("sparse", sparse), ("dense", dense)):
        s = jax.tree.map(jnp.array, state)
        s, m1 = train_step(s, batch, cfg=cfg, optimizer=optimizer)
        s, m2 = train_step(s, batch, cfg=cfg, optimizer=optimizer)
        results[name] = jax.device_get((s.params, s.opt_state, m1, m2))
    assert results["dense"][2]["grad_norm"] > 1.5  # the clip at 1 is live
    for (path, got), want in zip(
        jax.tree_util.tree_leaves_with_path(results["sparse"]), jax.tree.leaves(results["dense"]), strict=True
    ):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6, err_msg=jax.tree_util.keystr(path))
    W0, W = np.asarray(state.params["softmax"]["W"]), results["sparse"][0]["softmax"]["W"]
    moved = np.any(W != W0, axis=1)
    assert 8 <= moved.sum() < V and not moved[V:].any()  # some rows were never read: bit-identical


def test_the_sparse_update_is_used_only_when_it_reads_fewer_rows(states):
    """The slot count: fewer rows than V' (sparse), or the dense update (full softmax, a large batch)."""
    _, _, sparse, _, _ = states
    assert softmax_row_slots(sparse, B) == V  # min(2 x (2 x 6 + 4 x 5), 40)
    big = dataclasses.replace(sparse, vocab_size=102_400)  # a multiple of 256: V = V'
    assert softmax_row_slots(big, B) == 2 * (2 * S + B * T)
    assert softmax_row_slots(dataclasses.replace(big, full_softmax=True), B) is None
    assert (
        softmax_row_slots(dataclasses.replace(big, negative_sample_group_rows=0, n_negative_samples=60_000), B) is None
    )
