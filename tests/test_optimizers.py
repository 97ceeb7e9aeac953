"""The default optimiser (`optimizers.Optimizer`: clip to a global norm, then TensorFlow's Adagrad) against
a float64 NumPy re-derivation over several steps, with the clip active and inactive, and the state's
structure that checkpoints hold."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from elmo_jax.training import optimizers
from elmo_jax.training.optimizers import Optimizer
from tests.support.platforms import force_tpu_form
from tests.support.tolerance import assert_close_up_to_order, order_tolerance

LR, CLIP, INITIAL = 0.2, 1.0, 1.0
STEPS = 5
SHAPES = {"W": (4, 6), "b": (6,), "cell": {"W_0": (3, 5)}}
N = sum(int(np.prod(s)) for s in jax.tree.leaves(SHAPES, is_leaf=lambda x: isinstance(x, tuple)))  # 45

# float32 rounding, relative to each value's magnitude (eps = 2^-24 per rounding): the norm's sum of N
# squares <= N eps (sequential worst case), its sqrt half that + 1; the clip's division and multiply 2
# more: the clipped g within (N/2 + 4) eps. acc after k steps sums positive terms (each (N + 9) eps)
# with k roundings: (N + 9 + k) eps. The update: rsqrt (half acc's + 2), times the clipped g, times
# -lr (1 + 1): (N/2 + 4) + (N + 9 + k)/2 + 4 < (N + 13 + k) eps. Bounded by (N + 16 + STEPS) eps.
RTOL = (N + 16 + STEPS) * 2.0**-24


def np_clip_adagrad(grads, accumulators):
    """One step of tf.clip_by_global_norm then TF Adagrad (no epsilon), in float64.

    Returns (updates, new accumulators) as trees of float64 arrays like `grads`."""
    grads = jax.tree.map(lambda g: np.asarray(g, np.float64), grads)
    norm = np.sqrt(sum(np.sum(g * g) for g in jax.tree.leaves(grads)))
    scale = CLIP / max(norm, CLIP)
    clipped = jax.tree.map(lambda g: g * scale, grads)
    accumulators = jax.tree.map(lambda a, g: a + g * g, accumulators, clipped)
    updates = jax.tree.map(lambda g, a: -LR * g / np.sqrt(a), clipped, accumulators)
    return updates, accumulators


def random_grads(rng, norm: float):
    """A gradient tree of SHAPES, float32, of global norm `norm`."""
    grads = jax.tree.map(lambda s: rng.normal(size=s), SHAPES, is_leaf=lambda x: isinstance(x, tuple))
    total = np.sqrt(sum(np.sum(g * g) for g in jax.tree.leaves(grads)))
    return jax.tree.map(lambda g: jnp.asarray(g * norm / total, jnp.float32), grads)


@pytest.mark.parametrize("norm", [0.5 * CLIP, 7.0 * CLIP], ids=["clip_inactive", "clip_active"])
def test_clip_adagrad_equals_numpy_over_steps(norm):
    """Every step's updates and accumulators within float32 rounding (RTOL) of the float64 re-derivation,
    each side carrying its own accumulators from `INITIAL`."""
    rng = np.random.default_rng(0)
    optimizer = Optimizer(learning_rate=LR, clip_norm=CLIP, initial_accumulator=INITIAL)
    params = jax.tree.map(lambda s: jnp.zeros(s, jnp.float32), SHAPES, is_leaf=lambda x: isinstance(x, tuple))
    state = optimizer.init(params)
    want_acc = jax.tree.map(lambda p: np.full(p.shape, INITIAL), params)
    update = jax.jit(optimizer.update)
    for step in range(STEPS):
        grads = random_grads(rng, norm * (1.0 + 0.1 * step))
        updates, state = update(grads, state, params)
        want_updates, want_acc = np_clip_adagrad(grads, want_acc)
        got_acc = state[1][0].sum_of_squares
        for got, want in zip(jax.tree.leaves((updates, got_acc)), jax.tree.leaves((want_updates, want_acc))):
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=RTOL, atol=0, err_msg=f"step {step}")


def test_adagrad_state_is_the_checkpointed_structure():
    """`(clip's EmptyState, (ScaleByRssState, EmptyState))` with accumulators of `INITIAL`: what every
    checkpoint holds and what row_update and the train-step tests read (`opt_state[1][0]`)."""
    params = {"W": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
    state = Optimizer(initial_accumulator=INITIAL).init(params)
    assert jax.tree.structure(state) == jax.tree.structure(
        (optax.EmptyState(), (optax.ScaleByRssState(sum_of_squares=params), optax.EmptyState()))
    )
    assert all(float(a.min()) == float(a.max()) == INITIAL for a in jax.tree.leaves(state[1][0].sum_of_squares))


def test_tpu_norm_takes_a_large_matrix_s_squares_as_a_product(monkeypatch):
    """The TPU form of `global_norm` (forced on this CPU): a (5000, 3) leaf's sum of squares by the product
    with a column of ones, the small leaves summed, against a float64 NumPy norm within float32 rounding of
    the sum of 15,045 squares; the clip built on it scales every leaf by clip_norm / norm, as optax's."""
    force_tpu_form(monkeypatch)
    rng = np.random.default_rng(1)
    tree = {"softmax": jnp.asarray(rng.normal(size=(5000, 3)), jnp.float32), **random_grads(rng, 3.0)}
    want = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(tree)))
    terms = 5000 * 3 + N
    assert_close_up_to_order(jax.jit(optimizers.global_norm)(tree), want, terms=terms)
    clipped, _ = jax.jit(optimizers._clip_by_global_norm(CLIP).update)(tree, optax.EmptyState())
    # The norm's relative rounding, then a division and a multiply.
    rtol = order_tolerance(want, terms) / want + 3 * 2.0**-24
    for g, c in zip(jax.tree.leaves(tree), jax.tree.leaves(clipped)):
        np.testing.assert_allclose(np.asarray(c), np.asarray(g, np.float64) * CLIP / want, rtol=rtol)
