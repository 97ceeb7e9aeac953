"""NumPy re-derivations of TF's sampled softmax as bilm-tf calls it (`tf.nn.sampled_softmax_loss` with the
log-uniform candidate sampler), in float64, written from the definitions: P(k) = log((k + 2) / (k + 1)) /
log(V + 1) over frequency ranks; each logit minus the log of its class's expected count among the
candidates; accidental hits removed; softmax cross-entropy with the true class first. They share no code
with elmo_jax.
"""

from __future__ import annotations

import functools

import numpy as np


def np_log_uniform(V):
    """P(k) of TF's log-uniform sampler, float64 (V,)."""
    k = np.arange(V, dtype=np.float64)
    return np.log((k + 2.0) / (k + 1.0)) / np.log(V + 1.0)


@functools.cache  # a pure function of two ints; each call is ~60 sums over V
def np_draws(V, S):
    """The n with sum_k 1 - (1 - P(k))^n = S (expected distinct ids after n draws), by bisection down to
    adjacent float64 values."""
    p = np_log_uniform(V)
    distinct = lambda n: np.sum(1.0 - (1.0 - p) ** n)
    low, high = 0.0, 1.0
    while distinct(high) < S:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):  # no float64 between them: converged
            break
        low, high = (mid, high) if distinct(mid) < S else (low, mid)
    return 0.5 * (low + high)


def np_log_q(ids, V, S):
    """log expected count of each id: 0 when every class is a candidate, else log(1 - (1 - P)^n)."""
    if S >= V:
        return np.zeros(len(ids))
    return np.log(1.0 - (1.0 - np_log_uniform(V)[ids]) ** np_draws(V, S))


def np_logsumexp(x):
    m = np.max(x)
    return m + np.log(np.sum(np.exp(x - m)))


def np_tf_sampled_softmax(W, b, h, targets, candidates, V, S, remove_accidental_hits=True):
    """TF's sampled_softmax_loss, token by token: logits [true - logQ(true), cand - logQ(cand)], the
    candidates equal to the target masked out (TF adds -FLT_MAX), labels [1, 0, ..., 0]."""
    losses = []
    for x, y in zip(h, targets):
        true = x @ W[y] + b[y] - np_log_q([y], V, S)[0]
        sampled = W[candidates] @ x + b[candidates] - np_log_q(candidates, V, S)
        if remove_accidental_hits:
            sampled = sampled[candidates != y]
        losses.append(np_logsumexp(np.concatenate([[true], sampled])) - true)
    return np.array(losses)
