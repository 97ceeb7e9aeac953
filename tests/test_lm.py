"""The training-time LM forward (`lm.lm_outputs`) against a NumPy loop written from the ELMo equations.

Both directions run left to right over their own windows (the backward window already holds reversed
sentences), each row starting from the given state or from zeros where its window does not continue
the previous one (`lm.reset_state`); masked positions neither update the state nor produce output;
layers above the first add their input (residual). Dropout, when on, drops each LSTM layer's input and
the top output, scaling what it keeps by 1 / (1 - rate), and the residual adds the dropped-out input
(TF's DropoutWrapper around the ResidualWrapper in bilm-tf).

The reference is `np_lm_outputs` (tests/reference/elmo_equations.py), built on the same token-layer and
LSTM-step re-derivations as test_numpy_reference.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import elmo_jax
from elmo_jax.model.lstm import LSTMState
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.training import lm
from tests.reference.elmo_equations import BOS, BOW, EOW, PAD, np_lm_outputs
from tests.support.models import randomize, tiny_bilm_config, to_numpy
from tests.support.tolerance import assert_close_up_to_order

ATOL = 1e-5


# ----------------------------------------------------------------------------- inputs


def random_window(rng, D, B, T, C, max_bytes=5):
    """Raw char ids (D, B, T, C) of random tokens of 0..max_bytes bytes, with some `<S>` tokens."""
    ids = np.full((D, B, T, C), PAD, np.int32)
    for index in np.ndindex(D, B, T):
        n = int(rng.integers(0, max_bytes + 1))
        ids[index][0], ids[index][n + 1] = BOW, EOW
        ids[index][1 : n + 1] = rng.integers(0, 256, n)
    ids[:, :, 0, :3] = (BOW, BOS, EOW)
    return ids


# Forward rows: full, a tail past the end of the data, nothing at all, and a hole; backward rows:
# a short prefix and full rows. Row 0 forward and row 1, 2 backward continue their previous window.
MASK = np.array(
    [
        [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 0, 1, 1, 1]],
        [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]],
    ],
    bool,
)
CARRY = np.array([[True, False, True, False], [False, True, True, False]])


def _setup(config_overrides, seed):
    config = tiny_bilm_config(**config_overrides)
    params = randomize(elmo_jax.init_params(config, jax.random.key(seed)), seed=seed + 100)
    rng = np.random.default_rng(seed)
    D, (_, B, T) = 2, MASK.shape
    L, H, P = config.n_layers, config.lstm_dim, config.projection_dim
    char_ids = random_window(rng, D, B, T, config.max_characters_per_token)
    c0 = rng.normal(0.0, 1.5, (D, L, B, H)).clip(-3.0, 3.0)
    h0 = rng.normal(0.0, 0.5, (D, L, B, P)).clip(-1.0, 1.0)
    return config, params, char_ids, c0, h0


def _run(params, char_ids, c0, h0, **kwargs):
    state = lm.reset_state(
        LSTMState(c=jnp.asarray(c0, jnp.float32), h=jnp.asarray(h0, jnp.float32)), jnp.asarray(CARRY)
    )
    out, final = lm.lm_outputs(params, jnp.asarray(char_ids), jnp.asarray(MASK), state, **kwargs)
    return np.asarray(out), np.asarray(final.c), np.asarray(final.h)


# ----------------------------------------------------------------------------- tests


def test_reset_state_zeroes_only_rows_that_start_afresh():
    rng = np.random.default_rng(0)
    c, h = rng.normal(size=(2, 3, 4, 5)).astype(np.float32), rng.normal(size=(2, 3, 4, 2)).astype(np.float32)
    got = lm.reset_state(LSTMState(c=jnp.asarray(c), h=jnp.asarray(h)), jnp.asarray(CARRY))
    keep = CARRY[:, None, :, None]
    np.testing.assert_array_equal(np.asarray(got.c), np.where(keep, c, 0.0))
    np.testing.assert_array_equal(np.asarray(got.h), np.where(keep, h, 0.0))


@pytest.mark.parametrize(
    "overrides,content_positions",
    [
        (dict(), None),
        (dict(), 8),
        (dict(n_layers=3), None),
        (dict(use_skip_connections=False), None),
    ],
    ids=["two_layers", "two_layers_content_positions_8", "three_layers", "no_skip"],
)
def test_lm_outputs_match_numpy(overrides, content_positions):
    """Outputs and final state equal the loop reference: the carried state where `carry` is true and
    zeros where not, masked positions (a tail, a whole row, a hole) skipped, residual on layers > 0."""
    config, params, char_ids, c0, h0 = _setup(overrides, seed=1)
    out, c, h = _run(params, char_ids, c0, h0, compute=ComputeOptions(content_positions=content_positions))
    ref_out, ref_c, ref_h = np_lm_outputs(to_numpy(params.weights), config, char_ids, MASK, c0, h0, CARRY)

    assert out.shape == MASK.shape + (config.projection_dim,)
    np.testing.assert_allclose(out, ref_out, atol=ATOL, rtol=0)
    np.testing.assert_allclose(c, ref_c, atol=ATOL, rtol=0)
    np.testing.assert_allclose(h, ref_h, atol=ATOL, rtol=0)
    assert np.all(out[~MASK] == 0.0)
    # The fully masked row passes its (carried) state through untouched.
    np.testing.assert_array_equal(c[0, :, 2], np.asarray(c0[0, :, 2], np.float32))
    assert np.sum(np.abs(ref_c) == config.cell_clip) > 0, "test setup should hit the cell clip"


def test_dropout_keeps_rate_and_scale():
    """Zeroes a `rate` fraction and scales survivors by 1 / (1 - rate), so the mean is preserved.
    200,000 elements; 4.5 standard errors (fixed key)."""
    n, rate = 200_000, 0.3
    x = jnp.full((n,), 2.0, jnp.float32)
    y = np.asarray(lm.dropout(jax.random.key(0), rate, x))
    dropped = np.mean(y == 0.0)
    assert abs(dropped - rate) < 4.5 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_allclose(y[y != 0.0], 2.0 / (1.0 - rate), rtol=1e-6)
    assert abs(y.mean() - 2.0) < 4.5 * 2.0 / (1.0 - rate) * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_array_equal(np.asarray(lm.dropout(jax.random.key(0), 0.0, x)), np.asarray(x))


def test_lm_outputs_dropout_matches_numpy_with_its_masks(monkeypatch):
    """With dropout, the outputs equal the reference given the same keep masks (recorded from
    `lm.dropout`): each layer's input dropped and scaled, the residual adding the dropped input, and
    the top output dropped. Fixed key: the same outputs again; another key or rate 0: different ones."""
    config, params, char_ids, c0, h0 = _setup({}, seed=2)
    rate = 0.25
    keeps = []
    original = lm.dropout

    def recording(key, rate_, x):
        keeps.append(np.asarray(original(key, rate_, jnp.ones_like(x))) != 0.0)
        return original(key, rate_, x)

    monkeypatch.setattr(lm, "dropout", recording)
    out, c, h = _run(params, char_ids, c0, h0, key=jax.random.key(7), dropout_rate=rate)
    monkeypatch.setattr(lm, "dropout", original)

    assert len(keeps) == config.n_layers + 1
    dropped = 1.0 - np.mean([k.mean() for k in keeps])
    assert 0.15 < dropped < 0.35, f"test setup: masks drop {dropped:.2f}, expected about {rate}"
    ref_out, ref_c, ref_h = np_lm_outputs(
        to_numpy(params.weights), config, char_ids, MASK, c0, h0, CARRY, rate=rate, keep=keeps
    )
    np.testing.assert_allclose(out, ref_out, atol=ATOL, rtol=0)
    np.testing.assert_allclose(c, ref_c, atol=ATOL, rtol=0)
    np.testing.assert_allclose(h, ref_h, atol=ATOL, rtol=0)
    assert np.all(out[~MASK] == 0.0)

    again = _run(params, char_ids, c0, h0, key=jax.random.key(7), dropout_rate=rate)
    other_key = _run(params, char_ids, c0, h0, key=jax.random.key(8), dropout_rate=rate)
    no_dropout = _run(params, char_ids, c0, h0, key=jax.random.key(7), dropout_rate=0.0)
    for got, want in zip(again, (out, c, h)):
        np.testing.assert_array_equal(got, want)
    assert np.max(np.abs(other_key[0] - out)) > 0.1
    assert np.max(np.abs(no_dropout[0] - out)) > 0.1
    assert np.max(np.abs(no_dropout[1] - c)) > 0.1  # the dropped inputs changed the carried state too


def test_gather_rows_gradient_adds_both_index_arrays_rows_into_one_array():
    """`lm.gather_rows` gathers like indexing, and its one-array gradient is every use's row gradient summed
    per row (ids repeated within and across the two index arrays), against a float64 NumPy sum, within
    float32 rounding of the longest per-row sum."""
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(11, 3)), jnp.float32)
    first, second = rng.integers(0, 11, (2, 4, 5)), rng.integers(0, 11, (2, 7))
    d_first = rng.normal(size=(2, 4, 5, 3)).astype(np.float32)
    d_second = rng.normal(size=(2, 7, 3)).astype(np.float32)
    (rows_first, rows_second), pullback = jax.vjp(lm.gather_rows, table, jnp.asarray(first), jnp.asarray(second))
    np.testing.assert_array_equal(rows_first, np.asarray(table)[first])
    np.testing.assert_array_equal(rows_second, np.asarray(table)[second])
    expected = np.zeros((11, 3))
    np.add.at(expected, first.reshape(-1), d_first.reshape(-1, 3).astype(np.float64))
    np.add.at(expected, second.reshape(-1), d_second.reshape(-1, 3).astype(np.float64))
    uses = int(np.bincount(np.concatenate([first.reshape(-1), second.reshape(-1)])).max())
    assert uses > 2  # some row's gradient is a sum over both arrays' uses
    assert_close_up_to_order(pullback((d_first, d_second))[0], expected, terms=uses)
