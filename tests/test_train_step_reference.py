"""One `train_step` against a re-derivation of bilm-tf's step (tests/reference/train_step.py): the loss of
both LMs from the ELMo equations with one sampled softmax per group of rows, differentiated at
`loss * unroll_steps`, clipped to a global norm over every variable, then Adagrad from accumulators of
1.0, in that order. Parameters, Adagrad accumulators and metrics must agree within 1e-5.

The reference's forward pass is checked against the float64 NumPy loop of tests/reference first, so the
comparison rests on the equations, not on the reference's own transcription. The candidates are those
of the step's key (`train_step.step_keys`, one draw per direction and group: tests/test_candidate_groups.py
checks that rule, tests/test_softmax.py the sampler's law).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.model.char_cnn import content_bucket
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.params import BiLMParams
from elmo_jax.training.optimizers import Optimizer
from elmo_jax.training.softmax import sample_candidates
from elmo_jax.training.train_step import (
    StepConfig,
    TrainState,
    init_train_state,
    step_keys,
    train_step,
)
from tests.reference.elmo_equations import np_lm_outputs
from tests.reference.train_step import jnp_lm_outputs, jnp_scaled_loss, np_tf_update
from tests.support.models import random_char_ids, randomize, tiny_bilm_config, to_numpy

ATOL = 1e-5
D, B, T, C, V, S, GROUP = 2, 4, 5, 12, 30, 6, 2


def make_batch(rng, C):
    """A window of short random tokens; a few masked tail positions, one reset, one row without carry."""
    chars = np.stack([random_char_ids(rng, [T] * B, C, max_bytes=6) - 1 for _ in range(D)]).astype(np.int32)
    mask = np.ones((D, B, T), bool)
    mask[0, 1, 3:] = mask[1, 2, 4:] = False
    reset = np.zeros((D, B, T), bool)
    reset[0, 3, 2] = reset[1, 0, 1] = True
    carry = np.ones((D, B), bool)
    carry[1, 1] = False
    targets = rng.integers(0, 10, (D, B, T)).astype(np.int32)  # frequent ids: accidental hits happen
    return {"char_ids": chars, "targets": targets, "mask": mask, "carry": carry, "reset": reset}


@pytest.fixture(scope="module")
def setup():
    """(model config, step config, a TrainState at step 0, a batch, the step's candidates per direction
    and group). The state is built from shapes (`jax.eval_shape`), not by running the initialisers."""
    config = tiny_bilm_config(proj_clip=3.0, max_characters_per_token=C)
    cfg = StepConfig(
        model=config, vocab_size=V, unroll_steps=T, dropout=0.0, n_negative_samples=S, negative_sample_group_rows=GROUP
    )
    optimizer = Optimizer(learning_rate=0.2, clip_norm=10.0, initial_accumulator=1.0)
    shapes = jax.eval_shape(lambda: init_train_state(jax.random.key(0), cfg, optimizer, B))
    rng = np.random.default_rng(0)
    bilm = randomize(BiLMParams(weights=shapes.params["bilm"], config=config), seed=5).weights
    # Softmax rows of std 2 (bilm-tf starts at 1/sqrt(P)) make the gradient norm exceed 10.
    rows = shapes.params["softmax"]["b"].shape[0]
    W = np.where(np.arange(rows)[:, None] < V, rng.normal(0.0, 2.0, (rows, config.projection_dim)), 0.0)
    b = np.where(np.arange(rows) < V, 0.1, 0.0)
    params = {"bilm": bilm, "softmax": {"W": jnp.asarray(W, jnp.float32), "b": jnp.asarray(b, jnp.float32)}}
    lstm = LSTMState(
        c=jnp.asarray(rng.normal(0.0, 1.0, shapes.lstm.c.shape).clip(-3, 3), jnp.float32),
        h=jnp.asarray(rng.normal(0.0, 0.5, shapes.lstm.h.shape).clip(-1, 1), jnp.float32),
    )
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        key=jax.random.key_data(jax.random.key(1)),
        lstm=lstm,
    )
    batch = make_batch(rng, config.max_characters_per_token)
    # The candidates of step 0: one draw per direction and group of GROUP rows.
    _, k_sample = step_keys(state.key, 0)
    candidates = [
        [np.asarray(sample_candidates(jax.random.fold_in(k, g), V, S)) for g in range(B // GROUP)]
        for k in jax.random.split(k_sample, D)
    ]
    return config, cfg, state, batch, candidates


def test_the_reference_forward_is_the_numpy_loop(setup):
    """The jax.numpy transcription the gradient comes from equals the float64 loop of the equations."""
    config, _, state, batch, _ = setup
    # The NumPy loop has no resets: compare on a batch without them.
    no_reset = {**batch, "reset": np.zeros_like(batch["reset"])}
    got = jax.jit(lambda w: jnp_lm_outputs(w, config, no_reset, state.lstm.c, state.lstm.h))(state.params["bilm"])
    want, _, _ = np_lm_outputs(
        to_numpy(state.params["bilm"]),
        config,
        batch["char_ids"],
        batch["mask"],
        np.asarray(state.lstm.c, np.float64),
        np.asarray(state.lstm.h, np.float64),
        batch["carry"],
    )
    np.testing.assert_allclose(np.asarray(got), want, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_one_train_step_equals_bilm_tfs_order_of_operations(setup):
    """Loss, gradient norm (of the scaled loss, before clipping), every parameter and every Adagrad
    accumulator after one step, within 1e-5; the clip at 10 is live (the norm exceeds it)."""
    config, cfg, state, batch, candidates = setup
    lr, initial, clip_norm = 0.2, 1.0, 10.0
    params = jax.device_get(state.params)

    (scaled, loss), grads = jax.jit(
        jax.value_and_grad(
            lambda p: jnp_scaled_loss(p, config, batch, state.lstm.c, state.lstm.h, candidates, V, T), has_aux=True
        )
    )(params)
    assert float(scaled) == pytest.approx(T * float(loss), rel=1e-6)
    want_params, want_accumulators, norm = np_tf_update(params, grads, lr, clip_norm, initial)
    assert norm > 1.2 * clip_norm, f"test setup: the clip must be live (norm {norm})"

    optimizer = Optimizer(learning_rate=lr, clip_norm=clip_norm, initial_accumulator=initial)
    positions = content_bucket(np.where(batch["mask"][..., None], batch["char_ids"] + 1, 0), C)
    assert positions < C  # the char CNN's position bound is live too
    new, metrics = train_step(
        jax.tree.map(jnp.array, state), batch, cfg=cfg, optimizer=optimizer, content_positions=positions
    )
    assert float(metrics["loss"]) == pytest.approx(float(loss), abs=ATOL)
    assert float(metrics["grad_norm"]) == pytest.approx(norm, rel=1e-5)
    for path, got in jax.tree_util.tree_leaves_with_path(new.params):
        want = _at(want_params, path)
        np.testing.assert_allclose(np.asarray(got), want, atol=ATOL, rtol=0, err_msg=jax.tree_util.keystr(path))
    accumulators = new.opt_state[1][0].sum_of_squares  # chain(clip, adagrad): adagrad's scale_by_rss state
    for path, got in jax.tree_util.tree_leaves_with_path(accumulators):
        want = _at(want_accumulators, path)
        np.testing.assert_allclose(np.asarray(got), want, atol=ATOL, rtol=0, err_msg=jax.tree_util.keystr(path))
    moved = np.abs(np.asarray(new.params["softmax"]["W"]) - np.asarray(params["softmax"]["W"]))
    assert moved[V:].max() == 0.0 and moved[:V].max() > 1e-3  # padding rows never move; real ones do


def _at(tree, path):
    for entry in path:
        tree = tree[entry.key]
    return tree
