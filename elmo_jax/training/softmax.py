"""The LM output layer: bilm-tf's sampled softmax for training, and a memory-bounded full softmax.

Both directions share one softmax matrix W (V, P) and bias b (V,). Vocabulary ids are frequency ranks
(`<S>`, `</S>`, `<UNK>`, then the most frequent word), which is what the log-uniform (Zipfian)
candidate sampler assumes: P(k) = log((k + 2) / (k + 1)) / log(V + 1).

Sampled softmax follows TF's `sampled_softmax_loss` as bilm-tf calls it: `num_sampled` distinct
candidates per call shared by all its tokens (bilm-tf calls it once per direction on each GPU's batch
of 128 rows, so each GPU draws its own set; `group_candidates` draws one set per group of rows),
accidental hits (a candidate equal to a token's target) removed from that token's logits, and log-Q
correction by each class's expected count. TF draws with replacement until it has `num_sampled`
distinct ids and counts the draws n; the expected count of a class is then 1 - (1 - p)^n. Drawing
distinct ids that way is sampling without replacement in proportion to p, which Gumbel-top-k does in
one static-shaped step; n is replaced by its typical value, the n at which the expected number of
distinct ids equals `num_sampled` (solved once on the host).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.model.precision import matmul, summed

# Vocabulary rows per step of the full softmax: bounds the (N, chunk) logits block.
FULL_SOFTMAX_CHUNK = 8192
# The softmax matrix has its rows padded to a multiple of this, so that it shards evenly over any
# vocabulary axis size dividing it, and a checkpoint written on one mesh restores on another.
VOCAB_PAD_MULTIPLE = 256


def padded_vocab_size(vocab_size: int) -> int:
    """V': rows of the softmax matrix, `vocab_size` rounded up to a multiple of VOCAB_PAD_MULTIPLE.

    Rows past vocab_size are padding: never sampled, never a target, excluded from the full softmax.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, found {vocab_size}")
    return -(-vocab_size // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE


def log_uniform_probs(vocab_size: int) -> np.ndarray:
    """float64 (V,) Zipfian probabilities of ids 0..V-1 (TF's log-uniform sampler)."""
    k = np.arange(vocab_size, dtype=np.float64)
    return np.log1p(1.0 / (k + 1.0)) / np.log(vocab_size + 1.0)


@functools.lru_cache(maxsize=16)
@functools.lru_cache(maxsize=64)  # traced into every train and eval step: 1.3 s of CPU for bilm_large's V
def expected_draws(vocab_size: int, num_sampled: int) -> float:
    """With-replacement draws n at which the expected number of distinct ids is `num_sampled`.

    Returns inf when num_sampled >= vocab_size (every class is a candidate with certainty).
    """
    if num_sampled >= vocab_size:
        return float("inf")
    p = log_uniform_probs(vocab_size)
    distinct = lambda n: float(np.sum(-np.expm1(n * np.log1p(-p))))
    low, high = float(num_sampled), float(num_sampled)
    while distinct(high) < num_sampled:
        high *= 2.0
    for _ in range(100):  # bisection to float64 resolution
        mid = 0.5 * (low + high)
        if mid in (low, high):  # no float64 between them: converged
            break
        low, high = (mid, high) if distinct(mid) < num_sampled else (low, mid)
    return high


def log_expected_count(ids: jax.Array, vocab_size: int, num_sampled: int) -> jax.Array:
    """log of the expected count of each id among the candidates: log(1 - (1 - p)^n)."""
    n = expected_draws(vocab_size, num_sampled)
    if np.isinf(n):
        return jnp.zeros(ids.shape, jnp.float32)
    k = ids.astype(jnp.float32)
    p = jnp.log1p(1.0 / (k + 1.0)) / np.log(vocab_size + 1.0)
    return jnp.log(-jnp.expm1(n * jnp.log1p(-p)))


def sample_candidates(key: jax.Array, vocab_size: int, num_sampled: int) -> jax.Array:
    """int32 (S,) distinct ids drawn without replacement in proportion to the log-uniform P."""
    num_sampled = min(num_sampled, vocab_size)
    log_p = jnp.asarray(np.log(log_uniform_probs(vocab_size)), jnp.float32)
    scores = log_p + jax.random.gumbel(key, (vocab_size,), jnp.float32)
    return jax.lax.top_k(scores, num_sampled)[1].astype(jnp.int32)


def group_candidates(key: jax.Array, groups: int, vocab_size: int, num_sampled: int) -> jax.Array:
    """int32 (G, S): one independent candidate draw per group of rows (`sample_candidates` each).

    With one group the draw is `sample_candidates(key)`; with several, group g draws with
    `fold_in(key, g)`. A group's candidates depend only on the key and the group's index, never on the
    devices or processes that hold its rows.
    """
    if groups == 1:
        return sample_candidates(key, vocab_size, num_sampled)[None]
    # A loop, not a vmap: under a mesh, a vmapped draw is computed sharded like the rows of its groups
    # and then gathered whole for top_k; looped, every device computes the (small) draws itself.
    draw = lambda g: sample_candidates(jax.random.fold_in(key, g), vocab_size, num_sampled)
    return jax.lax.map(draw, jnp.arange(groups, dtype=jnp.uint32))


def sampled_softmax_loss(
    W: jax.Array,
    b: jax.Array,
    h: jax.Array,
    targets: jax.Array,
    candidates: jax.Array,
    vocab_size: int,
    num_sampled: int,
    compute_dtype="float32",
) -> jax.Array:
    """Per-token sampled softmax cross-entropy.

    Args:
      W: (V', P) softmax matrix, V' >= vocab_size (rows past vocab_size are padding, never sampled).
      b: (V',) bias.
      h: (N, P) LSTM outputs.
      targets: int (N,) target ids < vocab_size.
      candidates: int (S,) distinct sampled ids (`sample_candidates`).
      vocab_size, num_sampled: the sampler's settings, for the log-Q correction.
      compute_dtype: the (N, S) logits' matmul dtype (float32 or bfloat16; accumulated in float32).

    Returns:
      float32 (N,) losses.
    """
    rows = {"true_W": W[targets], "true_b": b[targets], "candidate_W": W[candidates], "candidate_b": b[candidates]}
    return sampled_softmax_loss_rows(rows, h, targets, candidates, vocab_size, num_sampled, compute_dtype)


def sampled_softmax_loss_rows(
    rows: dict[str, jax.Array],
    h: jax.Array,
    targets: jax.Array,
    candidates: jax.Array,
    vocab_size: int,
    num_sampled: int,
    compute_dtype="float32",
) -> jax.Array:
    """`sampled_softmax_loss` from the softmax rows it reads, gathered beforehand.

    Differentiated with respect to `rows`, its gradient is one row per use, (N, P) and (S, P), instead of
    a (V', P) matrix that is zero almost everywhere: what a sparse update of the softmax needs
    (`training.row_update`).

    Args:
      rows: {"true_W": (N, P) W[targets], "true_b": (N,) b[targets], "candidate_W": (S, P) W[candidates],
        "candidate_b": (S,) b[candidates]}.
      h, targets, candidates, vocab_size, num_sampled, compute_dtype: as for `sampled_softmax_loss`.

    Returns:
      float32 (N,) losses.
    """
    true_logits = jnp.sum(h * rows["true_W"], axis=-1) + rows["true_b"]  # (N,)
    true_logits = true_logits - log_expected_count(targets, vocab_size, num_sampled)
    sampled_logits = _plus_row(matmul(h, rows["candidate_W"].T, compute_dtype), rows["candidate_b"])  # (N, S)
    sampled_logits = sampled_logits - log_expected_count(candidates, vocab_size, num_sampled)[None, :]
    hits = candidates[None, :] == targets[:, None]
    sampled_logits = jnp.where(hits, -jnp.inf, sampled_logits)
    # logsumexp over [true, sampled] without joining them into one (N, 1 + S) array: a TPU writes a
    # join as a pass per piece over the whole width. The true logit is finite, so the shift is too.
    shift = jax.lax.stop_gradient(jnp.maximum(true_logits, jnp.max(sampled_logits, axis=1)))  # (N,)
    # The sums over the S candidates here and over the N tokens in the bias's gradient (`_plus_row`) are
    # products on a TPU (`precision.summed`).
    total = jnp.exp(true_logits - shift) + summed(jnp.exp(sampled_logits - shift[:, None]), axis=1)
    return shift + jnp.log(total) - true_logits


@jax.custom_vjp
def _plus_row(x: jax.Array, b: jax.Array) -> jax.Array:
    """x (N, S) + b (S,) on every row; b's gradient is the column sums of x's (`precision.summed`)."""
    return x + b[None, :]


def _plus_row_fwd(x, b):
    return _plus_row(x, b), None


def _plus_row_bwd(_, g):
    return g, summed(g, axis=0)


_plus_row.defvjp(_plus_row_fwd, _plus_row_bwd)


def full_softmax_loss(
    W: jax.Array, b: jax.Array, h: jax.Array, targets: jax.Array, vocab_size: int, chunk: int = FULL_SOFTMAX_CHUNK
) -> jax.Array:
    """Per-token cross-entropy over the whole vocabulary, in vocabulary chunks (memory N x chunk).

    Args:
      W, b: softmax (V', P), (V',); rows past vocab_size are padding and excluded.
      h: (N, P); targets: int (N,).

    Returns:
      float32 (N,) losses.
    """
    chunk = min(chunk, W.shape[0])  # one chunk of all rows (padding masked) keeps a sharded W whole
    n_chunks = -(-vocab_size // chunk)
    pad = n_chunks * chunk - W.shape[0]
    # Strided chunks: chunk i holds rows i, i + n_chunks, i + 2 n_chunks, ... A vocabulary-sharded W
    # then keeps its shards inside every chunk (each device scores its own rows, and the running sums
    # need one small all-reduce per chunk), where contiguous chunks would be spread over the devices
    # and the loop would gather the whole of W onto each of them.
    strided = lambda x: jnp.swapaxes(x[: n_chunks * chunk].reshape(chunk, n_chunks, *x.shape[1:]), 0, 1)
    W_chunks = strided(jnp.pad(W, ((0, max(pad, 0)), (0, 0))))  # (n_chunks, chunk, P)
    b_chunks = strided(jnp.pad(b, (0, max(pad, 0))))  # (n_chunks, chunk)
    ids = strided(jnp.arange(n_chunks * chunk))

    def step(carry, xs):  # online logsumexp over chunks
        running_max, running_sum = carry
        w, bias, chunk_ids = xs
        logits = matmul(h, w.T) + bias[None, :]
        logits = jnp.where(chunk_ids[None, :] < vocab_size, logits, -jnp.inf)
        new_max = jnp.maximum(running_max, jnp.max(logits, axis=1))
        running_sum = running_sum * jnp.exp(running_max - new_max) + jnp.sum(jnp.exp(logits - new_max[:, None]), axis=1)
        return (new_max, running_sum), None

    N = h.shape[0]
    init = (jnp.full((N,), -jnp.inf, jnp.float32), jnp.zeros((N,), jnp.float32))
    (running_max, running_sum), _ = jax.lax.scan(step, init, (W_chunks, b_chunks, ids))
    true_logits = jnp.sum(h * W[targets], axis=-1) + b[targets]
    return running_max + jnp.log(running_sum) - true_logits
