"""The LSTM time loop's written-out backward pass (`model.recurrence`) against autodiff of the same loop.

`recurrence.recurrence.fun` is the undecorated function, so `jax.grad` of it is plain autodiff; the
custom gradient must agree in every argument (inputs, kernel, bias, projection, initial state) with
projections and clips that bite, masked positions (holes and tails) and resets, within float32
rounding (it sums over steps in another order), and the values must be identical. In bfloat16 it is
at least as close to the float32 gradient as autodiff's is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.model import recurrence
from tests.support.platforms import force_tpu_form

T, D, B, H, P_IN = 6, 2, 3, 8, 5
NAMES = ("inputs", "W_0", "bias", "W_P", "c0", "h0")


def problem(seed: int, projection: int | None):
    """Arguments of `recurrence` with large pre-activations (the clips bite), masks and resets."""
    rng = np.random.default_rng(seed)
    P = projection or H
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    args = {
        "inputs": f32(rng.normal(0, 1, (T, D, B, P_IN))),
        "W_0": f32(rng.normal(0, 0.8, (D, P_IN + P, 4 * H))),
        "bias": f32(rng.normal(0, 1, (D, 4 * H))),
        "W_P": f32(rng.normal(0, 1.0, (D, H, P))) if projection else None,
        "c0": f32(rng.normal(0, 1, (D, B, H))),
        "h0": f32(rng.normal(0, 1, (D, B, P))),
    }
    mask = rng.random((T, D, B)) < 0.8
    mask[3:, 0, 1] = False  # a row that ends early
    fixed = {"mask": jnp.asarray(mask), "resets": jnp.asarray(rng.random((T, D, B)) < 0.2)}
    return args, fixed, f32(rng.normal(size=(T, D, B, P)))


def call(function, settings, args, fixed):
    a = args
    return function(
        settings, a["inputs"], a["W_0"], a["bias"], a["W_P"], fixed["mask"], fixed["resets"], a["c0"], a["h0"]
    )


def gradients(function, settings, args, fixed, weights):
    names = [k for k in NAMES if args[k] is not None]

    def loss(*values):
        outputs, c, h = call(function, settings, {**args, **dict(zip(names, values))}, fixed)
        return jnp.sum(outputs * weights) + 0.3 * jnp.sum(c) + 0.7 * jnp.sum(h)

    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(names)))))(*[args[k] for k in names])
    return dict(zip(names, grads))


@pytest.mark.parametrize(
    "projection, cell_clip, proj_clip",
    [(4, 0.5, 0.3), (None, 3.0, None)],
    ids=["projection-clips-bite", "no-projection"],
)
def test_gradient_equals_autodiff(projection, cell_clip, proj_clip):
    args, fixed, weights = problem(0, projection)
    settings = recurrence.Settings(cell_clip, proj_clip)
    custom = gradients(recurrence.recurrence, settings, args, fixed, weights)
    autodiff = gradients(recurrence.recurrence.fun, settings, args, fixed, weights)
    for name in autodiff:
        scale = float(jnp.max(jnp.abs(autodiff[name])))
        np.testing.assert_allclose(custom[name], autodiff[name], rtol=0, atol=1e-6 * scale, err_msg=name)
    for a, b in zip(
        call(recurrence.recurrence, settings, args, fixed), call(recurrence.recurrence.fun, settings, args, fixed)
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("form", ["default", "tpu"])
def test_bfloat16_gradient_is_as_close_to_float32_as_autodiff(form, monkeypatch):
    """In bfloat16, in either form of the loops (the TPU's stores dz gate by gate, rounded once)."""
    args, fixed, weights = problem(1, 4)
    truth = gradients(recurrence.recurrence.fun, recurrence.Settings(3.0, 3.0), args, fixed, weights)
    bf16 = recurrence.Settings(3.0, 3.0, "bfloat16")
    error = lambda g: max(float(jnp.linalg.norm(g[k] - truth[k]) / jnp.linalg.norm(truth[k])) for k in truth)
    autodiff = error(gradients(recurrence.recurrence.fun, bf16, args, fixed, weights))
    if form == "tpu":
        force_tpu_form(monkeypatch)
    custom = error(gradients(recurrence.recurrence, bf16, args, fixed, weights))
    assert custom < 0.05 and custom <= 1.1 * autodiff, (custom, autodiff)


def test_side_by_side_pieces_are_stacked_joined():
    """`stacked_scan` stores a `SideBySide` output's pieces into their columns of one stack, forward and
    in reverse, beside a plain output."""
    pieces = lambda t: recurrence.SideBySide((jnp.full((2, 3), t), jnp.full((2, 1), 10 * t), jnp.full((2, 2), -t)))
    step = lambda carry, t: (carry + 1, (pieces(t.astype(jnp.float32)), t))
    for reverse in (False, True):
        carry, (joined, ts) = recurrence.stacked_scan(step, jnp.int32(0), 4, reverse=reverse)
        expected = np.concatenate([np.asarray(p) for p in jax.vmap(pieces)(jnp.arange(4.0))], axis=-1)
        np.testing.assert_array_equal(joined, expected)
        np.testing.assert_array_equal(ts, np.arange(4))
        assert int(carry) == 4


def test_the_tpu_loop_equals_the_default_one(monkeypatch):
    """On a TPU each step computes its own input product and the backward loop computes and stores dz
    gate by gate (`lax.platform_dependent`'s tpu branches); forced here on the CPU, its values and custom
    gradients equal the default form's (the hoisted product) within float32 rounding."""
    args, fixed, weights = problem(2, 4)
    settings = recurrence.Settings(0.5, 0.3)
    hoisted_values = call(recurrence.recurrence, settings, args, fixed)
    hoisted = gradients(recurrence.recurrence, settings, args, fixed, weights)
    force_tpu_form(monkeypatch)
    for a, b in zip(call(recurrence.recurrence, settings, args, fixed), hoisted_values):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * float(jnp.max(jnp.abs(b))))
    per_step = gradients(recurrence.recurrence, settings, args, fixed, weights)
    for name in hoisted:
        scale = float(jnp.max(jnp.abs(hoisted[name])))
        np.testing.assert_allclose(per_step[name], hoisted[name], rtol=0, atol=1e-6 * scale, err_msg=name)


def test_the_input_product_is_per_step_only_up_to_the_row_bound(monkeypatch):
    """Above `IN_LOOP_MAX_ROWS` rows per device the hoisted product is used on every platform (on a v5e
    it moves less there); rows are counted per device (`token_shards`)."""
    taken = force_tpu_form(monkeypatch)
    monkeypatch.setattr(recurrence, "IN_LOOP_MAX_ROWS", 2)
    args, fixed, _ = problem(2, 4)  # B = 3 rows
    call(recurrence.recurrence, recurrence.Settings(0.5, 0.3), args, fixed)
    assert taken == []
    call(recurrence.recurrence, recurrence.Settings(0.5, 0.3, token_shards=2), args, fixed)
    assert taken == ["tpu"]
