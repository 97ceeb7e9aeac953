"""The biLM forward pass: character ids -> boundary tokens -> char CNN -> forward/backward LSTM stacks.

Everything here is a pure function of `BiLMParams` and int32 shifted character ids; `embed.py` adds
input checking and jit. Shapes: B batch, T tokens, T2 = T + 2 with `<S>`/`</S>`, C chars per token,
P projection, D = 2 directions, L LSTM layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from elmo_jax.model.char_cnn import token_embedding
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.lstm import LSTMState, lstm_stack, zero_state
from elmo_jax.model.params import N_DIRECTIONS, BiLMParams
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.model.vocabulary import boundary_ids, byte_boundary_ids


def token_mask(char_ids: jax.Array) -> jax.Array:
    """bool (B, T): a token is present where any of its character ids is non-zero."""
    return jnp.any(char_ids > 0, axis=-1)


def add_boundaries(
    char_ids: jax.Array, mask: jax.Array, config: BiLMConfig | None = None
) -> tuple[jax.Array, jax.Array]:
    """Puts `<S>` before and `</S>` right after each row's tokens.

    Args:
      char_ids: int (B, T, W) shifted ids (W = `config.ids_per_token`), padding tokens after the real ones.
      mask: bool (B, T).
      config: the model, whose boundary tokens these are (`vocabulary.boundary_ids`); None: a bytes
        model with C = W.

    Returns:
      (B, T2, W) ids and bool (B, T2) mask; a row of n tokens has n + 2 true entries.
    """
    B, T, C = char_ids.shape
    lengths = jnp.sum(mask, axis=1)  # (B,)
    ids = (lambda w: boundary_ids(config, w)) if config is not None else (lambda w: byte_boundary_ids(w, C))
    bos, eos = (jnp.asarray(ids(w), char_ids.dtype) for w in ("bos", "eos"))
    body = jnp.concatenate([jnp.broadcast_to(bos, (B, 1, C)), char_ids, jnp.zeros((B, 1, C), char_ids.dtype)], 1)
    positions = jnp.arange(T + 2)[None, :]  # (1, T2)
    is_eos = positions == (lengths + 1)[:, None]
    return jnp.where(is_eos[..., None], eos, body), positions < (lengths + 2)[:, None]


def remove_boundaries(x: jax.Array, mask_with_boundaries: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Inverse of `add_boundaries` for any per-token tensor.

    Args:
      x: (B, ..., T2, X) with time on axis -2.
      mask_with_boundaries: bool (B, T2).

    Returns:
      (B, ..., T, X) with exact zeros at padding, and the bool (B, T) token mask.
    """
    lengths = jnp.sum(mask_with_boundaries, axis=1) - 2  # (B,)
    T = mask_with_boundaries.shape[1] - 2
    mask = jnp.arange(T)[None, :] < lengths[:, None]  # (B, T)
    expand = mask.reshape(mask.shape[:1] + (1,) * (x.ndim - 3) + mask.shape[1:] + (1,))
    return jnp.where(expand, x[..., 1 : T + 1, :], 0.0), mask


def reverse_within_length(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """Reverses each row's first `lengths[b]` steps, leaving padding in place. x (T, B, ...) time-major.

    The map is its own inverse, so the same call un-reverses the backward stack's outputs.
    """
    T = x.shape[0]
    t = jnp.arange(T)[:, None]  # (T, 1)
    source = jnp.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)  # (T, B)
    source = source.reshape(source.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, source, axis=0)


def bilm_layers(
    params: BiLMParams, char_ids: jax.Array, initial_state: LSTMState, *, compute: ComputeOptions = ComputeOptions()
) -> tuple[jax.Array, jax.Array, LSTMState]:
    """All biLM layers, boundary tokens included, from character ids.

    Args:
      params: the biLM.
      char_ids: int (B, T, W) shifted ids (`vocabulary.TokenVocabulary`; checked by the caller).
      initial_state: (D, L, B, ·) state each row starts from.
      compute: matmul dtype, LSTM scan unroll and the char CNN's position bound (`ComputeOptions`).

    Returns:
      layers float32 (B, L+1, T2, 2P) with exact zeros at padding; mask bool (B, T2); the final state
      (the forward state after `</S>`, the backward state after `<S>`).
    """
    config, weights = params.config, params.weights
    B, T, C = char_ids.shape
    ids, mask = add_boundaries(char_ids, token_mask(char_ids), config)
    tokens = token_embedding(weights, config, ids.reshape(B * (T + 2), C), compute).reshape(B, T + 2, -1)
    return contextual_layers(params, tokens, mask, initial_state, compute=compute)


def contextual_layers(
    params: BiLMParams,
    tokens: jax.Array,
    mask: jax.Array,
    initial_state: LSTMState,
    *,
    compute: ComputeOptions = ComputeOptions(),
    starts: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, LSTMState]:
    """All biLM layers from token vectors that already hold `<S>`/`</S>`: the LSTM half of `bilm_layers`.

    The one code path for the LSTM stacks, whether the token vectors come from the char CNN
    (`bilm_layers`) or from a precomputed vocabulary (`token_cache`).

    Args:
      params: the biLM.
      tokens: float32 (B, T2, P) char-CNN outputs, `<S>` first and `</S>` right after each row's tokens;
        values at padding positions are ignored.
      mask: bool (B, T2), a prefix of each row (its tokens and both boundaries).
      initial_state, compute: as for `bilm_layers` (its char-CNN bound is not used here).
      starts: None, or bool (B, T2) for rows that hold several sentences one after another, each with
        its own `<S>` and `</S>` (`packed_layers`): true at each sentence's `<S>`. Both directions then
        read every sentence from a zero state (the forward one from its `<S>`, the backward one from its
        `</S>`), so its vectors are those it gets alone in a row, and the final state means nothing.

    Returns:
      as `bilm_layers`.
    """
    config, weights = params.config, params.weights
    B, T2, _ = tokens.shape
    tokens = tokens * mask[..., None]  # AllenNLP's layer 0 is exactly zero at padding
    lengths = jnp.sum(mask, axis=1)

    tokens_tm = jnp.swapaxes(tokens, 0, 1)  # (T2, B, P)
    inputs = jnp.stack([tokens_tm, reverse_within_length(tokens_tm, lengths)], axis=1)  # (T2, D, B, P)
    mask_tm = jnp.broadcast_to(mask.T[:, None, :], (T2, N_DIRECTIONS, B))
    resets = None if starts is None else _sentence_resets(starts, lengths)
    outputs, final = lstm_stack(weights, config, inputs, mask_tm, initial_state, compute=compute, resets=resets)

    layers = [jnp.concatenate([tokens, tokens], axis=-1)]
    for out in outputs:  # (T2, D, B, P)
        forward = jnp.swapaxes(out[:, 0], 0, 1)
        backward = jnp.swapaxes(reverse_within_length(out[:, 1], lengths), 0, 1)
        layers.append(jnp.concatenate([forward, backward], axis=-1))
    return jnp.stack(layers, axis=1), mask, final


def _sentence_resets(starts: jax.Array, lengths: jax.Array) -> jax.Array:
    """bool (T2, D, B) resets of rows of several sentences: the forward direction at each `<S>` (`starts`,
    (B, T2)); the backward one, which reads each row reversed within its length, at each `</S>` (the
    step before the next `<S>`, or the row's last)."""
    T2 = starts.shape[1]
    positions = jnp.arange(T2)[None, :]
    following = jnp.concatenate([starts[:, 1:], jnp.ones_like(starts[:, :1])], axis=1)  # (B, T2)
    ends = (following | (positions == lengths[:, None] - 1)) & (positions < lengths[:, None])
    return jnp.stack([starts.T, reverse_within_length(ends.T, lengths)], axis=1)


def packed_layers(
    params: BiLMParams, char_ids: jax.Array, starts: jax.Array, *, compute: ComputeOptions = ComputeOptions()
) -> tuple[jax.Array, jax.Array]:
    """All biLM layers of rows that hold several sentences one after another, each read from a zero state.

    A row is `<S> a_1 .. a_n </S> <S> b_1 .. b_m </S> ...` followed by padding: the boundaries are in
    `char_ids` already (`add_boundaries` is not applied), and `starts` marks each sentence's `<S>`. A
    sentence's vectors are those `bilm_layers` gives it alone in a row (up to the order of float32 sums),
    while the time steps of the padding a batch of one sentence per row needs are spent on other
    sentences (`features.packing`).

    Args:
      params: the biLM.
      char_ids: int (B, T2, C) shifted ids, the boundaries included; all-zero rows after a row's last
        `</S>` only.
      starts: bool (B, T2), true at each sentence's `<S>`.
      compute: as for `bilm_layers`.

    Returns:
      layers float32 (B, L+1, T2, 2P) with exact zeros at padding, the boundaries' positions included;
      mask bool (B, T2).
    """
    config = params.config
    B, T2, C = char_ids.shape
    tokens = token_embedding(params.weights, config, char_ids.reshape(B * T2, C), compute).reshape(B, T2, -1)
    state = zero_state(config, B)
    layers, mask, _ = contextual_layers(params, tokens, token_mask(char_ids), state, compute=compute, starts=starts)
    return layers, mask
