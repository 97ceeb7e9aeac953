"""The training softmax against hand computation and NumPy re-derivations of TF's sampled softmax.

References: the log-uniform sampler P(k) = log((k + 2) / (k + 1)) / log(V + 1) over frequency ranks,
TF's `sampled_softmax_loss` (true logit and candidate logits each minus the log of its expected count,
accidental hits removed, softmax cross-entropy with the true class first), and the plain log-softmax.
Everything here is written from those definitions in float64 NumPy; nothing is taken from elmo_jax.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.model.precision import summed
from elmo_jax.training.softmax import (
    expected_draws,
    full_softmax_loss,
    log_expected_count,
    sample_candidates,
    sampled_softmax_loss,
)
from tests.reference.sampled_softmax import np_draws, np_log_q, np_log_uniform, np_logsumexp, np_tf_sampled_softmax
from tests.support.platforms import force_tpu_form
from tests.support.tolerance import order_tolerance

ATOL = 1e-5


def f32(x):
    return jnp.asarray(x, jnp.float32)


# ----------------------------------------------------------------------------- hand-computed example


def test_two_token_cross_entropy_by_hand():
    """V = 3, P = 2. Token 0: h = (1, 2), target 2; token 1: h = (0.5, -1), target 0.
    W rows (1, 0), (0, 1), (1, 1); b = (0.1, -0.2, 0).
    Logits: token 0: (1.1, 1.8, 3.0); token 1: (0.6, -1.2, -0.5)."""
    W = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    b = [0.1, -0.2, 0.0]
    h = [[1.0, 2.0], [0.5, -1.0]]
    targets = [2, 0]
    expected = [
        math.log(math.exp(1.1) + math.exp(1.8) + math.exp(3.0)) - 3.0,
        math.log(math.exp(0.6) + math.exp(-1.2) + math.exp(-0.5)) - 0.6,
    ]

    full = full_softmax_loss(f32(W), f32(b), f32(h), jnp.asarray(targets), vocab_size=3)
    np.testing.assert_allclose(np.asarray(full), expected, atol=ATOL, rtol=0)
    # Every class a candidate: no log-Q correction and the target's own candidate removed.
    sampled = sampled_softmax_loss(
        f32(W), f32(b), f32(h), jnp.asarray(targets), jnp.arange(3), vocab_size=3, num_sampled=3
    )
    np.testing.assert_allclose(np.asarray(sampled), expected, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- full softmax


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 11, 16], ids=lambda c: f"chunk{c}")
def test_chunked_full_softmax_matches_numpy_log_softmax(chunk):
    """V = 11 classes in chunks that do and do not divide V; W and b carry 3 padding rows past V with
    huge logits, which would dominate every token's normaliser if they were not excluded."""
    rng = np.random.default_rng(0)
    V, pad, P, N = 11, 3, 5, 7
    W = rng.normal(0, 1, (V + pad, P))
    b = rng.normal(0, 1, (V + pad,))
    W[V:], b[V:] = 3.0, 50.0
    h = rng.normal(0, 1, (N, P))
    targets = np.array([0, 10, 3, 3, 7, 1, 9])
    logits = h @ W[:V].T + b[:V]
    log_softmax = logits - np.array([np_logsumexp(row) for row in logits])[:, None]
    expected = -log_softmax[np.arange(N), targets]

    got = full_softmax_loss(f32(W), f32(b), f32(h), jnp.asarray(targets), vocab_size=V, chunk=chunk)
    assert got.shape == (N,)
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=0)


def test_full_softmax_is_stable_for_logits_past_float32_exp_range():
    """Logits near 100 (exp overflows float32 past ~88.7): the chunked running max must keep the sum
    finite and exact. A bias shift leaves the softmax unchanged, so the reference is the unshifted one."""
    rng = np.random.default_rng(1)
    V, P, N = 9, 4, 5
    W, h = rng.normal(0, 1, (V, P)), rng.normal(0, 1, (N, P))
    b = rng.normal(0, 1, (V,))
    targets = np.array([0, 8, 4, 4, 2])
    logits = h @ W.T + b
    expected = np.array([np_logsumexp(row) for row in logits]) - logits[np.arange(N), targets]

    got = full_softmax_loss(f32(W), f32(b + 100.0), f32(h), jnp.asarray(targets), vocab_size=V, chunk=4)
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- sampled softmax


@pytest.mark.parametrize("order", ["arange", "permuted"])
def test_sampled_softmax_with_every_class_a_candidate_equals_full_softmax(order):
    """candidates = all V ids and num_sampled = V: every expected count is 1 (log-Q correction 0) and the
    target's own candidate is an accidental hit, so what remains is exactly the full softmax."""
    rng = np.random.default_rng(2)
    V, P, N = 13, 6, 10
    W, b, h = f32(rng.normal(0, 1, (V, P))), f32(rng.normal(0, 1, (V,))), f32(rng.normal(0, 1, (N, P)))
    targets = jnp.asarray(rng.integers(0, V, N))
    candidates = np.arange(V) if order == "arange" else rng.permutation(V)

    sampled = sampled_softmax_loss(W, b, h, targets, jnp.asarray(candidates, jnp.int32), V, num_sampled=V)
    full = full_softmax_loss(W, b, h, targets, V)
    np.testing.assert_allclose(np.asarray(sampled), np.asarray(full), atol=ATOL, rtol=0)


def test_sampled_softmax_matches_tf_rederivation_with_accidental_hits():
    """V = 8, 4 candidates {0, 3, 5, 6}; tokens 0, 2 and 3 have targets among them (accidental hits).
    The log-Q correction is live (num_sampled < V). A hit candidate must contribute nothing: the loss
    equals the loss with that candidate left out of the candidate list."""
    rng = np.random.default_rng(3)
    V, S, P = 8, 4, 5
    W, b = rng.normal(0, 1, (V, P)), rng.normal(0, 1, (V,))
    h = rng.normal(0, 1, (5, P))
    targets = np.array([3, 1, 6, 0, 7])
    candidates = np.array([0, 3, 5, 6])

    expected = np_tf_sampled_softmax(W, b, h, targets, candidates, V, S)
    kept_hits = np_tf_sampled_softmax(W, b, h, targets, candidates, V, S, remove_accidental_hits=False)
    hit = np.isin(targets, candidates)
    assert np.all(np.abs(kept_hits - expected)[hit] > 1e-3), "test setup: the hits must matter"

    got = np.asarray(
        sampled_softmax_loss(
            f32(W), f32(b), f32(h), jnp.asarray(targets), jnp.asarray(candidates, jnp.int32), V, num_sampled=S
        )
    )
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)
    for i in np.nonzero(hit)[0]:
        others = jnp.asarray(candidates[candidates != targets[i]], jnp.int32)
        without = sampled_softmax_loss(
            f32(W), f32(b), f32(h[i : i + 1]), jnp.asarray(targets[i : i + 1]), others, V, num_sampled=S
        )
        np.testing.assert_allclose(np.asarray(without), got[i : i + 1], atol=ATOL, rtol=0, err_msg=f"token {i}")


@pytest.fixture
def taken(monkeypatch, request):
    """The form of `lax.platform_dependent` to take ("default", or "tpu" forced on this CPU), and the list of
    branches taken, to show that the forced form ran."""
    return request.param, force_tpu_form(monkeypatch) if request.param == "tpu" else []


@pytest.mark.parametrize("taken", ["default", "tpu"], indirect=True)
def test_sampled_softmax_gradient_matches_numpy_past_float32_exp_range(taken):
    """Logits near 100 (exp overflows float32 past ~88.7) and a token whose only candidate is its target
    (every sampled logit removed): the loss and its gradients with respect to h and b equal the float64
    re-derivation, d loss / d h = sum_k (p_k - [k = true]) W_k and d loss / d b_k = p_k - [k = true] over
    the true row and the kept candidates, p the softmax of TF's logits. A bias shift of every row leaves
    them unchanged. In both forms: on a TPU the sums over the candidates and over the tokens (b's
    gradient) are products (`precision.summed`).

    Bound: float32 rounding at the logits' magnitude M (~103) along the chain of the P products, the
    bias, the log-Q correction and the logsumexp's shift, sum and difference (`order_tolerance`, whose
    bound for two evaluations covers one against the exact value); a logit's error e moves each p_k
    by at most p_k e, so h's gradient's error is at most e max |W|, and b's, summed over the 4 tokens,
    at most 4 e."""
    form, branches = taken
    rng = np.random.default_rng(4)
    V, S, P = 8, 3, 5
    W, b, h = rng.normal(0, 1, (V, P)), rng.normal(0, 1, (V,)), rng.normal(0, 1, (4, P))
    targets = np.array([2, 4, 7, 4])

    def numpy_loss_and_grads(candidates):
        losses, grads, grad_b = [], [], np.zeros(V)
        for x, y in zip(h, targets):
            kept = candidates[candidates != y]
            rows = np.concatenate([[y], kept])
            logits = W[rows] @ x + b[rows] - np_log_q(rows, V, S)
            p = np.exp(logits - np_logsumexp(logits))
            losses.append(np_logsumexp(logits) - logits[0])
            grads.append((p - np.eye(len(rows))[0]) @ W[rows])
            grad_b[rows] += p - np.eye(len(rows))[0]
        return np.array(losses), np.array(grads), grad_b

    logit_error = order_tolerance([np.max(np.abs(h @ W.T + b + 100.0))], P + 6)
    assert 1e-5 < logit_error < 1e-3  # ~2.4e-4: tight against a loss of order 1 and a gradient of order 0.1
    for candidates in (np.array([1, 4, 6]), np.array([4])):
        want_loss, want_grad, want_grad_b = numpy_loss_and_grads(candidates)

        def loss(x, bias, candidates=candidates):
            ids = jnp.asarray(candidates, jnp.int32)
            per_token = sampled_softmax_loss(f32(W), bias, x, jnp.asarray(targets), ids, V, num_sampled=S)
            return jnp.sum(per_token), per_token

        (grad, grad_b), got = jax.grad(loss, argnums=(0, 1), has_aux=True)(f32(h), f32(b + 100.0))
        assert np.all(np.isfinite(np.asarray(got))) and np.all(np.isfinite(np.asarray(grad)))
        np.testing.assert_allclose(np.asarray(got), want_loss, atol=logit_error, rtol=0)
        np.testing.assert_allclose(np.asarray(grad), want_grad, atol=logit_error * np.max(np.abs(W)), rtol=0)
        np.testing.assert_allclose(np.asarray(grad_b), want_grad_b, atol=logit_error * len(h), rtol=0)
    assert want_loss[1] == 0.0 and np.all(want_grad[1] == 0.0)  # token 1: its only candidate is its target
    assert ("tpu" in branches) == (form == "tpu")


@pytest.mark.parametrize("taken", ["default", "tpu"], indirect=True)
@pytest.mark.parametrize("axis", [0, 1])
def test_summed_equals_numpy_and_its_gradient_is_a_broadcast(taken, axis):
    """`precision.summed` of a (300, 37) matrix along either axis against a float64 NumPy sum, within float32
    rounding of that many terms at the scale of their absolute values (`order_tolerance`), in both forms (a
    TPU's: a product with a column of ones); its gradient is the cotangent broadcast along the summed axis,
    exactly."""
    form, branches = taken
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 37)) * np.exp(rng.normal(size=(300, 37)))
    got = summed(f32(x), axis)  # not jitted: a cached trace of the other form would be reused
    atol = order_tolerance(np.sum(np.abs(x), axis=axis), x.shape[axis])
    np.testing.assert_allclose(np.asarray(got), np.sum(x, axis=axis), atol=atol, rtol=0)
    weights = rng.normal(size=x.shape[1 - axis])
    grad = jax.grad(lambda x: jnp.sum(summed(x, axis) * f32(weights)))(f32(x))
    np.testing.assert_array_equal(np.asarray(grad), np.broadcast_to(np.expand_dims(f32(weights), axis), x.shape))
    assert ("tpu" in branches) == (form == "tpu")


# ----------------------------------------------------------------------------- expected counts


@pytest.mark.parametrize("V,S", [(8, 4), (100, 20), (1000, 50), (793_471, 8192)])
def test_log_expected_count_matches_numpy(V, S):
    """log Q(k) = log(1 - (1 - P(k))^n), with n the draws at which the expected number of distinct ids is S."""
    n = np_draws(V, S)
    assert expected_draws(V, S) == pytest.approx(n, rel=1e-9)
    ids = np.unique(np.concatenate([np.arange(min(V, 64)), np.linspace(0, V - 1, 50).astype(int)]))
    got = log_expected_count(jnp.asarray(ids, jnp.int32), V, S)
    np.testing.assert_allclose(np.asarray(got), np_log_q(ids, V, S), atol=ATOL, rtol=0)


@pytest.mark.parametrize("S", [7, 10], ids=["S_equals_V", "S_above_V"])
def test_log_expected_count_is_zero_when_every_class_is_a_candidate(S):
    assert expected_draws(7, S) == float("inf")
    np.testing.assert_array_equal(np.asarray(log_expected_count(jnp.arange(7), 7, S)), np.zeros(7))


# ----------------------------------------------------------------------------- candidate sampler


def test_sample_candidates_are_distinct_ids_in_range():
    for V, S, seed in [(10, 3, 0), (100, 20, 1), (100, 99, 2), (50, 50, 3), (20, 64, 4)]:
        ids = np.asarray(sample_candidates(jax.random.key(seed), V, S))
        assert ids.dtype == np.int32 and ids.shape == (min(S, V),)
        assert len(set(ids.tolist())) == len(ids), f"V={V} S={S}: repeated ids {ids}"
        assert ids.min() >= 0 and ids.max() < V


def _inclusion_frequencies(V, S, n_draws, seed):
    keys = jax.random.split(jax.random.key(seed), n_draws)
    ids = np.asarray(jax.vmap(lambda k: sample_candidates(k, V, S))(keys))  # (R, S)
    return np.bincount(ids.ravel(), minlength=V) / n_draws


def test_single_candidate_follows_the_log_uniform_law():
    """With one candidate, its distribution is P itself (and n = 1, so Q = P exactly): 20,000 draws,
    checked at 4.5 standard errors (fixed seed; a false alarm over these ids is ~1e-5 likely)."""
    V, R = 100, 20_000
    freq = _inclusion_frequencies(V, 1, R, seed=10)
    p = np_log_uniform(V)
    ids = np.array([0, 1, 2, 5, 20, 99])
    se = np.sqrt(p[ids] * (1 - p[ids]) / R)
    np.testing.assert_array_less(np.abs(freq[ids] - p[ids]), 4.5 * se)
    assert np.isclose(expected_draws(V, 1), 1.0)
    np.testing.assert_allclose(np.exp(np.asarray(log_expected_count(jnp.asarray(ids), V, 1))), p[ids], rtol=1e-5)


def _tf_style_inclusion(V, S, n_draws, seed):
    """TF's log-uniform candidate sampler with unique=True: draw with replacement from P until S
    distinct ids are in hand. Returns the inclusion frequency of every id over n_draws repetitions."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np_log_uniform(V))
    counts = np.zeros(V)
    for _ in range(n_draws):
        seen = set()
        while len(seen) < S:
            draws = np.minimum(np.searchsorted(cdf, rng.random(4 * S)), V - 1)
            for k in draws:
                seen.add(int(k))
                if len(seen) == S:
                    break
        counts[list(seen)] += 1
    return counts / n_draws


def test_sampled_candidates_follow_tf_inclusion_probabilities():
    """V = 100, S = 20. The Gumbel-top-k sets must be distributed like TF's draw-until-S-distinct sets:
    the inclusion frequencies of a few ids from frequent to rare agree between 20,000 library draws and
    10,000 draws of a NumPy simulation of TF's sampler, at 4.5 standard errors of the difference.
    They must also agree with the log-Q model 1 - (1 - P)^n, n = expected_draws(V, S), within
    4.5 standard errors plus 0.03: a fixed n stands in for TF's random number of draws, which is off
    by up to ~0.02 for the most frequent ids at these sizes (measured with 200,000 simulated draws),
    while a sampler that ignored P (uniform: S/V = 0.2 each) or sharpened it (P^2) misses by > 0.2 at
    some of these ids."""
    V, S, R, R_tf = 100, 20, 20_000, 10_000
    freq = _inclusion_frequencies(V, S, R, seed=11)
    tf_freq = _tf_style_inclusion(V, S, R_tf, seed=12)
    ids = np.array([0, 1, 3, 10, 40, 99])
    pooled = (freq[ids] * R + tf_freq[ids] * R_tf) / (R + R_tf)
    se_diff = np.sqrt(pooled * (1 - pooled) * (1 / R + 1 / R_tf))
    np.testing.assert_array_less(np.abs(freq[ids] - tf_freq[ids]), 4.5 * se_diff)

    q = 1.0 - (1.0 - np_log_uniform(V)) ** np_draws(V, S)
    se = np.sqrt(q[ids] * (1 - q[ids]) / R)
    np.testing.assert_array_less(np.abs(freq[ids] - q[ids]), 4.5 * se + 0.03)
    assert freq[0] > freq[10] > freq[99], "frequent ids must be sampled more"
    assert abs(freq.sum() - S) < 1e-9  # exactly S distinct ids per draw
