"""The biLM as two language models, for training and evaluation on `data.batch_stream.BiLMBatchStream` windows.

Unlike `embed`, nothing is reversed or padded here: the backward stream already holds reversed
sentences, so both directions run left to right over their own windows (bilm-tf's `static_rnn` over
`tokens_characters` and `tokens_characters_reverse`), each row's LSTM state carried in from its
previous window (truncated BPTT) and reset where the stream says a row starts afresh.

Shapes: D = 2 directions, B rows, T = unroll_steps, C chars per token, P projection, L layers,
V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from elmo_jax.model.char_cnn import token_embedding
from elmo_jax.model.distinct_tokens import distinct_token_embedding
from elmo_jax.model.lstm import LSTMState, lstm_stack
from elmo_jax.model.params import BiLMParams
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.training.softmax import full_softmax_loss, group_candidates, sampled_softmax_loss_rows


def dropout(key: jax.Array, rate: float, x: jax.Array) -> jax.Array:
    """Inverted dropout: zero each element with probability `rate`, scale the rest by 1 / (1 - rate)."""
    if rate <= 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def reset_state(state: LSTMState, carry: jax.Array) -> LSTMState:
    """Zeroes the state of rows whose window does not continue the previous one. carry: bool (D, B)."""
    keep = carry[:, None, :, None]  # (D, 1, B, 1)
    return LSTMState(c=jnp.where(keep, state.c, 0.0), h=jnp.where(keep, state.h, 0.0))


def lm_outputs(
    params: BiLMParams,
    char_ids: jax.Array,
    mask: jax.Array,
    state: LSTMState,
    *,
    key: jax.Array | None = None,
    dropout_rate: float = 0.0,
    compute: ComputeOptions = ComputeOptions(),
    resets: jax.Array | None = None,
) -> tuple[jax.Array, LSTMState]:
    """Top-layer LSTM outputs of both directions.

    Args:
      params: the biLM.
      char_ids: int (D, B, T, C) raw character ids (0..260), each direction in its reading order.
      mask: bool (D, B, T); false positions neither update the state nor matter to the loss.
      state: `LSTMState` (D, L, B, ·) to start from (already reset where rows start afresh).
      key: dropout randomness; required when dropout_rate > 0.
      dropout_rate: bilm-tf's `dropout`, on each LSTM layer's input and on the top output.
      compute: matmul dtype, LSTM scan unroll, the char CNN's position bound and distinct-token slots
        (`ComputeOptions`).
      resets: None or bool (D, B, T): zero the state before these positions (see `lstm.lstm_layer`).

    Returns:
      outputs float32 (D, B, T, P) and the final `LSTMState`.
    """
    config, weights = params.config, params.weights
    D, B, T, C = char_ids.shape
    # Tokens flattened batch-major (B, D, T): with B sharded over the mesh's batch axis, each device's
    # tokens stay a contiguous block, so no device needs another's. Shifted ids (raw + 1): the char
    # CNN's table has the padding row 0 first. No token loop: it would run over the sharded axis, and
    # under autodiff it would not bound memory anyway (a loop keeps every block's residuals).
    flat = jnp.transpose(char_ids, (1, 0, 2, 3)).reshape(B * D * T, C) + 1
    if compute.distinct_tokens is None:
        tokens = token_embedding(weights, config, flat, compute, token_block=None)
    else:  # each device's distinct tokens once (the same blocks: one per device of the batch axis)
        tokens = distinct_token_embedding(weights, config, flat, compute)
    inputs = jnp.transpose(tokens.reshape(B, D, T, -1), (2, 1, 0, 3))  # (T, D, B, P)
    mask_tm = jnp.transpose(mask, (2, 0, 1))  # (T, D, B)
    keys = (None,) * (config.n_layers + 1) if key is None else jax.random.split(key, config.n_layers + 1)
    layer_dropout = None if dropout_rate <= 0.0 else (lambda x, layer: dropout(keys[layer], dropout_rate, x))
    resets_tm = None if resets is None else jnp.transpose(resets, (2, 0, 1))  # (T, D, B)
    outputs, final = lstm_stack(
        weights, config, inputs, mask_tm, state, compute=compute, dropout=layer_dropout, resets=resets_tm
    )
    top = outputs[-1] if dropout_rate <= 0.0 else dropout(keys[-1], dropout_rate, outputs[-1])
    return jnp.transpose(top, (1, 2, 0, 3)), final


def lm_losses(
    softmax: dict[str, jax.Array],
    outputs: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    *,
    vocab_size: int,
    num_sampled: int | None = None,
    key: jax.Array | None = None,
    chunk: int | None = None,
    group_rows: int = 0,
    compute_dtype="float32",
) -> tuple[jax.Array, jax.Array]:
    """Summed cross-entropy of each direction over its unmasked tokens, and the token counts.

    Args:
      softmax: {"W": (V', P), "b": (V',)}, shared by both directions.
      outputs: (D, B, T, P) from `lm_outputs`; targets int (D, B, T); mask bool (D, B, T).
      vocab_size: V (rows past it are padding).
      num_sampled: candidates per direction and group of rows for the sampled softmax; None = full softmax.
      key: candidate sampling randomness (sampled softmax only).
      chunk: vocabulary chunk of the full softmax.
      group_rows: sampled softmax only: rows 0..g-1, g..2g-1, ... of the batch each get their own
        candidate draw per direction (bilm-tf: one draw per GPU batch of 128 rows); 0 = one draw for
        all B rows. Must divide B. Direction d's group k draws with `fold_in(split(key, D)[d], k)`
        (`softmax.group_candidates`), so the draws do not depend on how the rows are sharded.
      compute_dtype: the sampled softmax's logits matmul dtype (float32 or bfloat16, accumulated in
        float32); the full softmax (evaluation) is always float32.

    Returns:
      float32 (D,) summed losses and float32 (D,) token counts; the mean loss of direction d is
      sums[d] / counts[d], and bilm-tf's training loss is the mean of the two directions' means.
    """
    if num_sampled is not None:
        D, B = outputs.shape[:2]
        candidates = draw_candidates(key, D, candidate_groups(B, group_rows), vocab_size, num_sampled)
        rows = softmax_rows(softmax, candidates, targets)
        return sampled_lm_losses(
            rows,
            candidates,
            outputs,
            targets,
            mask,
            vocab_size=vocab_size,
            num_sampled=num_sampled,
            compute_dtype=compute_dtype,
        )
    return full_lm_losses(softmax, outputs, targets, mask, vocab_size=vocab_size, chunk=chunk)


def full_lm_losses(
    softmax: dict[str, jax.Array],
    outputs: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    *,
    vocab_size: int,
    chunk: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """`lm_losses` of the full softmax (every word's logit; the arguments as there).

    Returns:
      float32 (D,) summed losses and float32 (D,) token counts, as `lm_losses`.
    """
    P = outputs.shape[-1]
    sums, counts = [], []
    for d in range(outputs.shape[0]):
        h, y, m = outputs[d].reshape(-1, P), targets[d].reshape(-1), mask[d].reshape(-1)
        kwargs = {} if chunk is None else {"chunk": chunk}
        token_losses = full_softmax_loss(softmax["W"], softmax["b"], h, y, vocab_size, **kwargs)
        sums.append(jnp.sum(jnp.where(m, token_losses, 0.0)))
        counts.append(jnp.sum(m).astype(jnp.float32))
    return jnp.stack(sums), jnp.stack(counts)


def draw_candidates(key: jax.Array, n_directions: int, groups: int, vocab_size: int, num_sampled: int) -> jax.Array:
    """int32 (D, G, S): direction d's draws are `group_candidates(split(key, D)[d], G, ...)`."""
    keys = jax.random.split(key, n_directions)
    return jnp.stack([group_candidates(keys[d], groups, vocab_size, num_sampled) for d in range(n_directions)])


def softmax_rows(softmax: dict[str, jax.Array], candidates: jax.Array, targets: jax.Array) -> dict[str, jax.Array]:
    """The softmax rows a sampled-softmax step reads, gathered at candidates int (D, G, S) and targets int
    (D, B, T): {"candidate_W": (D, G, S, P), "candidate_b": (D, G, S), "true_W": (D, B, T, P), "true_b": (D, B, T)}.

    Differentiating the loss with respect to these rows instead of W and b gives one gradient row per
    use, which `training.row_update` sums per word to update only the rows the step read.
    """
    (candidate_W, true_W), (candidate_b, true_b) = (gather_rows(softmax[k], candidates, targets) for k in ("W", "b"))
    return {"candidate_W": candidate_W, "candidate_b": candidate_b, "true_W": true_W, "true_b": true_b}


@jax.custom_vjp
def gather_rows(table: jax.Array, first: jax.Array, second: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(table[first], table[second]) for int index arrays of any shape; table (V', ...).

    Its gradient is one (V', ...) array that both index arrays' row gradients are added into, one after
    the other: autodiff of the two gathers builds a zero-filled gradient for each and adds them, which
    for the softmax writes, re-reads and adds a second (V', P) array at every step (on a TPU, measured:
    bench/RESULTS_tpu_compile.md, "The softmax gradient in one array").
    """
    return table[first], table[second]


def _gather_rows_fwd(table, first, second):
    return gather_rows(table, first, second), (table, first, second)  # the table only for its shape


def _gather_rows_bwd(residuals, cotangents):
    table, first, second = residuals
    d_first, d_second = cotangents
    return jnp.zeros_like(table).at[first].add(d_first).at[second].add(d_second), None, None


gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


def sampled_lm_losses(
    rows: dict[str, jax.Array],
    candidates: jax.Array,
    outputs: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    *,
    vocab_size: int,
    num_sampled: int,
    compute_dtype="float32",
) -> tuple[jax.Array, jax.Array]:
    """`lm_losses` of the sampled softmax from `softmax_rows(softmax, candidates, targets)`.

    Args:
      rows: `softmax_rows`'s gathered rows; candidates int (D, G, S) (`draw_candidates`).
      outputs, targets, mask, vocab_size, num_sampled, compute_dtype: as for `lm_losses`.

    Returns:
      float32 (D,) summed losses and float32 (D,) token counts, as `lm_losses`.
    """
    D, B, T, P = outputs.shape
    G = candidates.shape[1]
    sums, counts = [], []
    for d in range(D):
        h, y, m = outputs[d].reshape(-1, P), targets[d].reshape(-1), mask[d].reshape(-1)
        true = {"true_W": rows["true_W"][d].reshape(-1, P), "true_b": rows["true_b"][d].reshape(-1)}
        cand = {"candidate_W": rows["candidate_W"][d], "candidate_b": rows["candidate_b"][d]}  # (G, S, P), (G, S)

        def loss(true, cand, h, y, c):
            return sampled_softmax_loss_rows({**true, **cand}, h, y, c, vocab_size, num_sampled, compute_dtype)

        if G == 1:
            token_losses = loss(true, jax.tree.map(lambda x: x[0], cand), h, y, candidates[d, 0])
        else:  # rows are batch-major in h, so group k's tokens are one contiguous block
            grouped = lambda x: x.reshape(G, -1, *x.shape[1:])  # noqa: E731
            token_losses = jax.vmap(loss)(
                jax.tree.map(grouped, true), cand, grouped(h), grouped(y), candidates[d]
            ).reshape(-1)
        sums.append(jnp.sum(jnp.where(m, token_losses, 0.0)))
        counts.append(jnp.sum(m).astype(jnp.float32))
    return jnp.stack(sums), jnp.stack(counts)


def candidate_groups(batch_rows: int, group_rows: int) -> int:
    """G: how many candidate draws a direction of B rows gets with groups of `group_rows` rows (0: one)."""
    if group_rows == 0 or group_rows == batch_rows:
        return 1
    if group_rows < 0 or batch_rows % group_rows:
        raise ValueError(
            f"negative_sample_group_rows={group_rows} must be 0 (one draw for the batch) or divide the batch's "
            f"{batch_rows} rows"
        )
    return batch_rows // group_rows
