"""elmo-jax against NumPy re-derivations of the ELMo equations (docs/ELMO.md).

The references (tests/reference/elmo_equations.py) are written from the equations, in float64, with
plain loops over tokens, time steps and filter positions; they share no code with elmo_jax. Random
weights are scaled so that the LSTM cell clip is actually hit. Float32 tolerance: 1e-5 absolute.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import elmo_jax
import elmo_jax.model.char_cnn
import elmo_jax.model.lstm
from tests.reference.elmo_equations import (
    BOS,
    PAD,
    np_bilm_sentence,
    np_boundary_ids,
    np_highway,
    np_lstm_step,
    np_scalar_mix_layer_norm,
    np_token_embedding,
)
from tests.support.models import random_char_ids, randomize, tiny_bilm_config, to_numpy

ATOL = 1e-5


# ----------------------------------------------------------------------------- LSTM step


def _random_cell(rng, P, H, projected, scale):
    cell = {"W_0": rng.normal(0, scale, (2 * P, 4 * H)), "B": rng.normal(0, scale, (4 * H,))}
    if projected:
        cell["W_P_0"] = rng.normal(0, scale, (H, P))
    return cell


def _one_lstm_step(cell, config, x, c_prev, h_prev):
    """One time step of `lstm.lstm_layer` (its scan body) for one direction: (c, h) as float32 (B, H), (B, P)."""
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    stacked = {"W_0": f32(cell["W_0"])[None], "B": f32(cell["B"])[None]}
    if "W_P_0" in cell:
        stacked["W_P"] = f32(cell["W_P_0"])[None]
    inputs = f32(x)[None, None]  # (T=1, D=1, B, P)
    mask = jnp.ones(inputs.shape[:3], bool)
    outputs, (c, h) = elmo_jax.model.lstm.lstm_layer(
        stacked, config, inputs, mask, f32(c_prev)[None], f32(h_prev)[None]
    )
    np.testing.assert_array_equal(np.asarray(outputs[0, 0]), np.asarray(h[0]))  # a live step outputs its h
    return c[0], h[0]


@pytest.mark.parametrize("projected", [True, False], ids=["projection", "no_projection"])
def test_lstm_step_matches_numpy(projected):
    """One step of `lstm_layer` equals the equations, with ~10% of cells hitting cell_clip and some
    projected outputs hitting proj_clip (so clipping and the carried clipped state are exercised)."""
    rng = np.random.default_rng(0)
    B, H = 64, 16
    P = 8 if projected else H
    config = tiny_bilm_config(lstm_dim=H, projection_dim=P, filters=((1, 8), (2, 8)), cell_clip=3.0, proj_clip=1.5)
    cell = _random_cell(rng, P, H, projected, scale=0.7)
    x, h_prev = rng.normal(0, 1.0, (B, P)), rng.normal(0, 1.0, (B, P))
    c_prev = rng.normal(0, 2.5, (B, H))

    c_ref, h_ref = np_lstm_step(cell["W_0"], cell["B"], cell.get("W_P_0"), x, c_prev, h_prev, 3.0, 1.5)
    clipped = np.mean(np.abs(c_ref) >= 3.0)
    assert 0.03 < clipped < 0.3, f"test setup should clip some cells, clipped {clipped:.1%}"
    if projected:
        assert np.mean(np.abs(h_ref) >= 1.5) > 0.02, "test setup should clip some projected outputs"

    c, h = _one_lstm_step(cell, config, x, c_prev, h_prev)
    assert c.shape == (B, H) and h.shape == (B, P)
    np.testing.assert_allclose(np.asarray(c), c_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(h), h_ref, atol=ATOL, rtol=0)


def test_lstm_without_projection_ignores_proj_clip():
    """bilm-tf builds `LSTMCell(H, proj_clip=...)` without num_proj when P == H, and TF's LSTMCell applies
    proj_clip only to a projected output. So with no W_P_0 and proj_clip < 1, h = sig(o) tanh(c) unclipped."""
    rng = np.random.default_rng(1)
    B, H = 64, 8
    config = tiny_bilm_config(lstm_dim=H, projection_dim=H, filters=((1, 8),), proj_clip=0.25)
    cell = _random_cell(rng, H, H, projected=False, scale=0.7)
    x, h_prev, c_prev = rng.normal(0, 1, (B, H)), rng.normal(0, 1, (B, H)), rng.normal(0, 1, (B, H))
    c_ref, h_ref = np_lstm_step(cell["W_0"], cell["B"], None, x, c_prev, h_prev, 3.0, 0.25)
    assert np.mean(np.abs(h_ref) > 0.25) > 0.1, "test setup: some outputs must exceed proj_clip"

    c, h = _one_lstm_step(cell, config, x, c_prev, h_prev)
    np.testing.assert_allclose(np.asarray(c), c_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(h), h_ref, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- char CNN


def test_highway_matches_numpy():
    """The gate from W_carry weights the relu branch (bilm-tf's naming), not the identity."""
    rng = np.random.default_rng(2)
    F = 24
    layer = {
        "W_carry": rng.normal(0, 0.5, (F, F)),
        "b_carry": rng.normal(0, 1, (F,)),
        "W_transform": rng.normal(0, 0.5, (F, F)),
        "b_transform": rng.normal(0, 1, (F,)),
    }
    x = rng.normal(0, 1, (16, F))
    got = elmo_jax.model.char_cnn.highway(
        jnp.asarray(x, jnp.float32), {k: jnp.asarray(v, jnp.float32) for k, v in layer.items()}
    )
    np.testing.assert_allclose(np.asarray(got), np_highway(x, layer), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(activation="tanh"),
        dict(n_highway=0),
        dict(n_highway=2, activation="tanh"),
        dict(projection_dim=18, lstm_dim=18),  # sum(filters) == P: no CNN projection
    ],
    ids=["relu", "tanh", "no_highway", "two_highway_tanh", "no_projection"],
)
def test_token_embedding_matches_numpy(overrides):
    """Embedding (zero row for id 0), valid 1-D convolutions, max over positions, bias, activation,
    highway and projection, for random tokens of every length plus an all-padding token."""
    config = tiny_bilm_config(**overrides)
    assert config.has_cnn_projection == ("projection_dim" not in overrides)
    params = randomize(elmo_jax.init_params(config, jax.random.key(0)), seed=3)
    assert ("CNN_proj" in params.weights) == config.has_cnn_projection
    rng = np.random.default_rng(4)
    C = config.max_characters_per_token
    ids = random_char_ids(rng, [C + 2], C)[0]  # (C + 2, C)
    n_bytes = np.sum(ids != PAD + 1, axis=1) - 2  # all but BOW, EOW and PAD
    assert set(n_bytes) == set(range(C - 1)), "test setup: every token length 0..C-2 must appear"
    ids = np.concatenate([ids, np.zeros((1, C), np.int64), np_boundary_ids(BOS, C)[None]])
    got = elmo_jax.model.char_cnn.token_embedding(params.weights, config, jnp.asarray(ids, jnp.int32))
    expected = np_token_embedding(to_numpy(params.weights), config, ids)
    assert got.shape == (len(ids), config.projection_dim)
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- full biLM


@pytest.mark.parametrize(
    "overrides,max_bytes",
    [
        (dict(), 10),
        (dict(), 48),
        (dict(n_layers=3), 10),
        (dict(use_skip_connections=False), 10),
        (dict(projection_dim=18, lstm_dim=18, cell_clip=None, proj_clip=None), 10),
    ],
    ids=["two_layers", "two_layers_48_byte_tokens", "three_layers", "no_skip", "no_projections_no_clip"],
)
def test_bilm_matches_numpy(overrides, max_bytes):
    """`embed` equals a per-sentence, per-time-step NumPy biLM for a batch of different lengths incl. an
    empty sentence: padding must not leak into any row, and the backward stack must reverse each
    sentence within its own length. Short tokens (<= 10 bytes of 50 slots) and full-width ones
    (48 bytes) both appear, since only the all-PAD tail of a token may be skipped."""
    config = tiny_bilm_config(**overrides)
    params = randomize(elmo_jax.init_params(config, jax.random.key(1)), seed=5)
    weights = to_numpy(params.weights)
    lengths = [5, 1, 0, 7, 3]
    ids = random_char_ids(np.random.default_rng(6), lengths, config.max_characters_per_token, max_bytes)

    layers, mask = elmo_jax.embed(params, ids)
    layers, mask = np.asarray(layers), np.asarray(mask)
    B, T = ids.shape[:2]
    L = config.n_layers + 1
    assert layers.shape == (B, L, T, 2 * config.projection_dim)
    np.testing.assert_array_equal(mask, np.arange(T)[None, :] < np.array(lengths)[:, None])

    clipped = {"cell": 0, "proj": 0}
    for b, n in enumerate(lengths):
        expected, n_clipped = np_bilm_sentence(weights, config, ids[b, :n])  # (L, n, 2P)
        np.testing.assert_allclose(layers[b, :, :n], expected, atol=ATOL, rtol=0, err_msg=f"sentence {b}")
        assert np.all(layers[b, :, n:] == 0.0), f"sentence {b}: padding must be exact zeros"
        clipped = {k: clipped[k] + n_clipped[k] for k in clipped}
    if config.cell_clip is not None:
        assert clipped["cell"] > 0 and clipped["proj"] > 0, f"test setup should hit both clips, {clipped}"


# ----------------------------------------------------------------------------- layer-normalised mix


def test_layer_norm_scalar_mix_matches_numpy():
    """One mean and one variance per layer over all unmasked (B, T, D) elements (not per token);
    padding values must not enter the statistics; the output is zero at padding."""
    rng = np.random.default_rng(7)
    B, L, T, D = 3, 3, 6, 5
    lengths = np.array([6, 2, 4])
    mask = np.arange(T)[None, :] < lengths[:, None]
    layers = rng.normal(0, 1, (B, L, T, D)) * np.array([1.0, 3.0, 0.5])[None, :, None, None] + 2.0
    layers[~np.broadcast_to(mask[:, None], (B, L, T))] = 100.0  # garbage at padding must be ignored
    s, gamma = np.array([0.3, -1.0, 0.8]), 1.7

    got = elmo_jax.scalar_mix(
        jnp.asarray(layers, jnp.float32),
        jnp.asarray(s, jnp.float32),
        jnp.asarray(gamma, jnp.float32),
        jnp.asarray(mask),
        layer_norm=True,
    )
    expected = np_scalar_mix_layer_norm(layers, s, gamma, mask)
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=0)
    assert np.all(np.asarray(got)[~mask] == 0.0)
