"""The sparse softmax update (training/row_update.py) against the dense one: one train step of the tiny
biLM both ways gives the same parameters, Adagrad accumulators and metrics (within 1e-6), with the
global-norm clip live and ids repeated among the candidates, the groups, both directions and the
targets; rows no step read stay bit-identical. The per-id sums are checked against NumPy's `np.add.at`.

The optimiser (training/optimizers.py): the default is bilm-tf's explicit chain, clip + Adagrad, bit for
bit on both update paths; an optimiser not declared row-sparse (Adam, or any plain optax transformation)
gets the dense update even when the sparse one is asked for, since its state changes at rows no step read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl import logging

from configs import default
from elmo_jax.training import settings, sharding
from elmo_jax.training.jitted_steps import jit_steps
from elmo_jax.training.optimizers import Optimizer
from elmo_jax.training.row_update import distinct_rows, row_slots, sum_rows
from elmo_jax.training.train_step import (
    SPARSE_ROW_COST,
    StepConfig,
    init_train_state,
    softmax_row_slots,
    train_step,
)
from tests.support.compare import assert_trees_equal
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
    optimizer = Optimizer(learning_rate=0.2, clip_norm=1.0, initial_accumulator=1.0)
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
    assert softmax_row_slots(sparse, B, optimizer) == V and softmax_row_slots(dense, B, optimizer) is None
    results = {name: two_steps(state, batch, cfg, optimizer) for name, cfg in (("sparse", sparse), ("dense", dense))}
    assert results["dense"][2]["grad_norm"] > 1.5  # the clip at 1 is live
    for (path, got), want in zip(
        jax.tree_util.tree_leaves_with_path(results["sparse"]), jax.tree.leaves(results["dense"]), strict=True
    ):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6, err_msg=jax.tree_util.keystr(path))
    W0, W = np.asarray(state.params["softmax"]["W"]), results["sparse"][0]["softmax"]["W"]
    moved = np.any(W != W0, axis=1)
    assert 8 <= moved.sum() < V and not moved[V:].any()  # some rows were never read: bit-identical


def test_the_sparse_update_is_used_only_when_it_reads_fewer_rows(states):
    """The slot count when twice a step's reads, repeats counted, are fewer than one vocabulary shard's
    rows, V' / vocab_shards (sparse; `train_step.SPARSE_ROW_COST`), else the dense update (full softmax,
    a large batch, many candidate groups, the vocabulary split over devices)."""
    _, _, sparse, _, adagrad = states
    assert SPARSE_ROW_COST == 2
    assert softmax_row_slots(sparse, B, adagrad) == V  # min(2 x (2 x 6 + 4 x 5), 40); 2 x 64 reads < V' = 256
    # 16 groups of 2 rows: 2 x (16 x 6 + 32 x 5) = 512 reads of V' = 256 rows, though only 40 are distinct
    # (U = V): the per-read work would exceed one pass over the softmax.
    assert softmax_row_slots(sparse, 32, adagrad) is None
    assert softmax_row_slots(sparse, 6, adagrad) == V  # 2 x (3 x 6 + 6 x 5) = 96 reads: 192 < 256
    assert softmax_row_slots(sparse, 8, adagrad) is None  # 2 x (4 x 6 + 8 x 5) = 128 reads: 256, not < 256
    # The vocabulary over two devices: each updates 128 rows densely, against 2 x 64 reads sparsely.
    assert softmax_row_slots(dataclasses.replace(sparse, vocab_shards=2), B, adagrad) is None
    big = dataclasses.replace(sparse, vocab_size=102_400)  # a multiple of 256: V = V'
    assert softmax_row_slots(big, B, adagrad) == 2 * (2 * S + B * T)
    assert softmax_row_slots(dataclasses.replace(big, full_softmax=True), B, adagrad) is None
    fewer_groups = dataclasses.replace(big, negative_sample_group_rows=0, n_negative_samples=60_000)
    assert softmax_row_slots(fewer_groups, B, adagrad) is None
    # Only an optimiser declared row-sparse: not Adam, not a plain optax transformation (even Adagrad's).
    assert softmax_row_slots(big, B, Optimizer(name="adam")) is None
    assert softmax_row_slots(big, B, adagrad.transform) is None


def two_steps(state, batch, cfg: StepConfig, optimizer) -> Any:
    """(params, opt_state, metrics of step 1, metrics of step 2) of two `train_step`s from `state`, on the host."""
    s = jax.tree.map(jnp.array, state)
    s, m1 = train_step(s, batch, cfg=cfg, optimizer=optimizer)
    s, m2 = train_step(s, batch, cfg=cfg, optimizer=optimizer)
    return jax.device_get((s.params, s.opt_state, m1, m2))


class DeclaredRowSparse(NamedTuple):
    """A plain optax transformation declared row-sparse, as the step before `optimizers` treated every
    optimiser: the sparse update with the explicit chain."""

    init: Any
    update: Any
    row_sparse: bool = True


@pytest.mark.slow
def test_the_default_optimizer_is_bilm_tfs_explicit_chain_bit_for_bit(states):
    """The default config's optimiser against `chain(clip_by_global_norm, adagrad(eps=0))` written out
    here: two steps of each update path give the same parameters, Adagrad state (its structure too, so
    checkpoints written before `optimizers` restore) and metrics, bit for bit."""
    state, batch, sparse, dense, _ = states
    config = default.get_config()
    config.clip_norm = 1.0  # the states' gradient norm exceeds it: the clip is live
    optimizer = settings.optimizer(config)
    assert optimizer.name == "adagrad"
    explicit = optax.chain(
        optax.clip_by_global_norm(config.clip_norm),
        optax.adagrad(config.learning_rate, initial_accumulator_value=config.adagrad_initial_accumulator, eps=0.0),
    )
    assert_trees_equal(optimizer.init(state.params), explicit.init(state.params))
    assert_trees_equal(two_steps(state, batch, dense, optimizer), two_steps(state, batch, dense, explicit))
    explicit_sparse = DeclaredRowSparse(explicit.init, explicit.update)
    assert_trees_equal(two_steps(state, batch, sparse, optimizer), two_steps(state, batch, sparse, explicit_sparse))


@pytest.mark.slow
def test_adam_gets_the_dense_update_even_when_the_sparse_one_is_asked_for(states):
    """Adam's moments decay at rows no step read, so the sparse update would leave a row read by the first
    step but not the second where the dense one moves it again. Asked for the sparse update, a plain
    clip + Adam chain gives exactly the dense update of the config's "adam" (which also shows that
    "adam" is that chain); the chain forced through the sparse update (as before `optimizers`) differs."""
    state, batch, sparse, dense, _ = states
    adam = Optimizer(name="adam", learning_rate=0.01, clip_norm=1.0)
    plain = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.01))
    assert softmax_row_slots(sparse, B, adam) is None and softmax_row_slots(sparse, B, plain) is None
    state = state.replace(opt_state=adam.init(state.params))
    want = two_steps(state, batch, dense, adam)
    assert_trees_equal(two_steps(state, batch, sparse, plain), want)
    forced = two_steps(state, batch, sparse, DeclaredRowSparse(plain.init, plain.update))
    moved_apart = np.any(forced[0]["softmax"]["W"] != want[0]["softmax"]["W"], axis=1)
    assert 0 < moved_apart.sum() < V, moved_apart.sum()  # rows the second step did not read


def test_the_trainer_logs_why_the_softmax_is_updated_densely(states, caplog):
    """`jit_steps` with an optimiser not declared row-sparse says so in one line (no compile)."""
    _, _, sparse, _, adagrad = states
    mesh = sharding.make_mesh(B, 8 // B)
    with caplog.at_level(logging.INFO):
        jit_steps(mesh, sparse, adagrad, B)
        assert not any("updated densely" in r.getMessage() for r in caplog.records)
        jit_steps(mesh, sparse, Optimizer(name="adam", learning_rate=0.01, clip_norm=1.0), B)
    lines = [r.getMessage() for r in caplog.records if "updated densely" in r.getMessage()]
    assert len(lines) == 1 and "optimizer adam is not known to leave a row" in lines[0], lines
