"""`embed(params, chars)`: JIT-compiled ELMo feature extraction with inputs checked on the host.

Stateless by default: every call starts from a zero LSTM state, so the same sentence always gets the
same vectors. `initial_state` / `return_state` reproduce the stateful behaviour of bilm-tf and AllenNLP
(each row's final state carried into the next call) for users who want it.
"""

from __future__ import annotations

import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.features.token_cache import TokenCache, check_bytes_model, check_token_cache, lookup
from elmo_jax.model.bilm import bilm_layers, contextual_layers, remove_boundaries
from elmo_jax.model.char_cnn import content_bucket, token_embedding
from elmo_jax.model.chars import count_truncated, warn_truncated
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.lstm import LSTMState, zero_state
from elmo_jax.model.params import N_DIRECTIONS, BiLMParams, iter_flat
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.model.vocabulary import pad_id

# No unrolling by default: on the 2-core CPU, unrolling the LSTM scan 2, 4 or 20 times made the small
# model's train step slower (measured: bench/RESULTS.md, "The train step, issue #8"): XLA:CPU does not
# overlap the unrolled steps, it only makes the loop body larger. Accelerators may differ, hence the knob.
DEFAULT_UNROLL = 1


def embed(
    params: BiLMParams,
    chars,
    *,
    initial_state: LSTMState | None = None,
    return_state: bool = False,
    keep_boundaries: bool = False,
    compute_dtype="float32",
    unroll: int = DEFAULT_UNROLL,
):
    """Contextual ELMo layers for a batch of shifted character ids.

    Args:
      params: from `load_hdf5`, `init_params` or `load`.
      chars: int (B, T, C) from `batch_to_ids`: shifted ids in [0, 262), all-zero rows for padding tokens,
        which must come after a row's real tokens. Checked on the host before any compute (under an
        outer `jax.jit` only shape and dtype can be checked). A model with its own vocabulary
        (ELMoForManyLangs') takes (B, T, W) from `token_vocabulary(params).batch_ids(sentences)`:
        its character ids, then its word id (`model/vocabulary.py`).
      initial_state: `LSTMState` with c (2, L, B, H) and h (2, L, B, P) to start from; zeros if None.
      return_state: also return the final `LSTMState` (forward after `</S>`, backward after `<S>`).
      keep_boundaries: return the `<S>`/`</S>` positions too (T + 2 steps), as AllenNLP's scalar mix
        sees them; `remove_boundaries` drops them later.
      compute_dtype: "float32" (full precision on every backend) or "bfloat16" (faster matmuls,
        float32 state and accumulation).
      unroll: unroll factor of the LSTM time loop, a speed knob: results differ only by float32
        rounding (XLA fuses the unrolled steps differently), far inside the 1e-5 parity tolerance.

    Returns:
      (layers, mask) or (layers, mask, state): layers float32 (B, L+1, T, 2P) — layer 0 the token
      embedding repeated, then one per LSTM layer, [forward; backward] — with exact zeros at padding;
      mask bool (B, T).
    """
    check_params(params)
    config = params.config
    chars = check_char_ids(chars, config)
    if initial_state is None:
        initial_state = zero_state(config, chars.shape[0])
    else:
        _check_state(initial_state, params, chars.shape[0])
    compute = ComputeOptions(dtype=compute_dtype, unroll=unroll, content_positions=_content_bucket(chars, config))
    return _embed_jit(
        params,
        chars,
        initial_state,
        return_state=bool(return_state),
        keep_boundaries=bool(keep_boundaries),
        compute=compute,
    )


def _content_bucket(chars, config: BiLMConfig) -> int | None:
    """Characters per token the char CNN must look at; None (all) under an outer jit."""
    if isinstance(chars, jax.core.Tracer):
        return None
    return content_bucket(np.asarray(chars), config.max_characters_per_token, pad_id(config))


@functools.partial(jax.jit, static_argnames=("return_state", "keep_boundaries", "compute"))
def _embed_jit(params, chars, initial_state, *, return_state, keep_boundaries, compute):
    layers, mask, state = bilm_layers(params, chars, initial_state, compute=compute)
    if not keep_boundaries:
        layers, mask = remove_boundaries(layers, mask)
    return (layers, mask, state) if return_state else (layers, mask)


def embed_tokens(
    params: BiLMParams,
    cache: TokenCache,
    sentences,
    *,
    initial_state: LSTMState | None = None,
    return_state: bool = False,
    keep_boundaries: bool = False,
    compute_dtype="float32",
    unroll: int = DEFAULT_UNROLL,
):
    """`embed` for tokenized sentences, with the char CNN replaced by `cache` lookups for known words.

    Tokens missing from the cache (and `<S>`/`</S>` if it lacks them) go through the char CNN, so
    the result equals `embed(params, batch_to_ids(sentences))` whatever the vocabulary covers (up to
    float32 rounding of the char CNN in another batch shape). Only the char CNN is skipped: the LSTMs
    run exactly as in `embed`. Tokens over C-2 UTF-8 bytes are cut, and one warning says how many, as
    `batch_to_ids` does.

    Args:
      params: the biLM the cache was built from (`build_token_cache` / `load_token_cache(params=)`;
        only its width and C are checked here, the weights digest at load time).
      cache: a `TokenCache`.
      sentences: B lists of str tokens (as for `batch_to_ids`), at least one token in all.
      initial_state, return_state, keep_boundaries, unroll: as for `embed`.
      compute_dtype: as for `embed`; cached vectors are float32 whatever it is.

    Returns:
      as `embed`: layers float32 (B, L+1, T, 2P), mask bool (B, T)[, final state].
    """
    check_params(params)
    check_bytes_model(params.config, "embed_tokens")
    if not isinstance(cache, TokenCache):
        raise ValueError(
            f"cache must be a TokenCache (from build_token_cache or load_token_cache), found {type(cache).__name__}"
        )
    check_token_cache(cache, params, weights=False)  # the weights digest is checked at load time
    batch = lookup(cache, sentences)
    C = cache.max_characters_per_token
    warn_truncated(count_truncated(sentences, C), sum(map(len, sentences)), C)  # docs/ELMO.md, "Long tokens"
    B = batch.mask.shape[0]
    if initial_state is None:
        initial_state = zero_state(params.config, B)
    else:
        _check_state(initial_state, params, B)
    compute = ComputeOptions(dtype=compute_dtype, unroll=unroll, content_positions=batch.content_positions)
    return _embed_tokens_jit(
        params,
        batch.known,
        batch.oov_index,
        batch.oov_chars,
        batch.mask,
        initial_state,
        return_state=bool(return_state),
        keep_boundaries=bool(keep_boundaries),
        compute=compute,
    )


@functools.partial(jax.jit, static_argnames=("return_state", "keep_boundaries", "compute"))
def _embed_tokens_jit(
    params, known, oov_index, oov_chars, mask, initial_state, *, return_state, keep_boundaries, compute
):
    """known (B, T2, P), oov_index (B, T2), oov_chars (U, C), mask (B, T2): see `token_cache.CachedBatch`."""
    oov = token_embedding(params.weights, params.config, oov_chars, compute)  # (U, P)
    computed = jnp.take(oov, jnp.maximum(oov_index, 0), axis=0)  # (B, T2, P)
    tokens = jnp.where((oov_index >= 0)[..., None], computed, known)
    layers, mask, state = contextual_layers(params, tokens, mask, initial_state, compute=compute)
    if not keep_boundaries:
        layers, mask = remove_boundaries(layers, mask)
    return (layers, mask, state) if return_state else (layers, mask)


# Weight arrays already found finite, by id, each with a weak reference that drops its entry when the array
# is freed (a new array that reuses the id is then checked again).
_FINITE: dict[int, weakref.ref] = {}


def check_params(params) -> None:
    """Raises ValueError unless `params` is a `BiLMParams` whose weights hold no NaN or Inf.

    Each weight array is checked once, on its device; later calls with the same arrays cost nothing.
    Under an outer `jax.jit` the values are unknown and only the type is checked.
    """
    if not isinstance(params, BiLMParams):
        raise ValueError(
            f"params must be BiLMParams (from load_hdf5, init_params or load), found {type(params).__name__}"
        )
    for path, leaf in iter_flat(params.weights):
        if isinstance(leaf, jax.core.Tracer):
            continue
        known = _FINITE.get(id(leaf))
        if known is not None and known() is leaf:
            continue
        if not bool(jnp.all(jnp.isfinite(jnp.asarray(leaf)))):
            raise ValueError(
                f"params: non-finite weights: {path} holds NaN or Inf; refusing to embed with a diverged or "
                "damaged model"
            )
        try:
            _FINITE[id(leaf)] = weakref.ref(leaf, functools.partial(_forget_finite, id(leaf)))
        except TypeError:  # not weak-referenceable: checked on every call
            pass


def _forget_finite(key: int, _ref) -> None:
    _FINITE.pop(key, None)


def check_char_ids(chars, config: BiLMConfig):
    """Validates the ids of a model (`config`) on the host; returns them as int32 NumPy (a tracer stays a
    tracer).

    Raises ValueError naming the problem.
    """
    max_characters_per_token, width = config.max_characters_per_token, config.ids_per_token
    shape, dtype = np.shape(chars), getattr(chars, "dtype", None)
    if dtype is None:
        chars = np.asarray(chars)
        shape, dtype = chars.shape, chars.dtype
    if not (np.issubdtype(dtype, np.integer)):
        raise ValueError(f"chars: expected integer character ids (from batch_to_ids), found dtype {dtype}")
    if len(shape) != 3 or shape[2] != width:
        raise ValueError(f"chars: expected shape (batch, tokens, {width}), found {tuple(shape)}")
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"chars: empty batch of shape {tuple(shape)}; need at least one sentence and one time step")
    if isinstance(chars, jax.core.Tracer):
        return chars.astype(jnp.int32)  # values are unknown under an outer jit
    host = np.asarray(chars)
    what = "character ids" if config.has_words else "ids"
    _check_range(host[..., :max_characters_per_token], config.n_raw_characters + 1, what, 0)
    if config.has_words:
        _check_range(host[..., max_characters_per_token:], config.word_vocab_size + 1, "word ids", width - 1)
    present = np.any(host > 0, axis=-1)  # (B, T)
    gaps = present[:, 1:] & ~present[:, :-1]
    if gaps.any():
        row, t = np.argwhere(gaps)[0]
        raise ValueError(
            f"chars: row {row} has a token at position {t + 1} after a padding token; padding "
            "(all-zero) tokens must come after a sentence's tokens"
        )
    return host.astype(np.int32, copy=False)


def _check_range(ids: np.ndarray, end: int, what: str, first_slot: int) -> None:
    """Raises ValueError unless every id is in [0, end), naming the first one that is not."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= end):
        bad = np.argwhere((ids < 0) | (ids >= end))[0]
        index = (*(int(i) for i in bad[:-1]), int(bad[-1]) + first_slot)
        raise ValueError(
            f"chars: {what} must be in [0, {end}) (shifted ids from batch_to_ids or the model's "
            f"token_vocabulary); found {int(ids[tuple(bad)])} at index {index}"
        )


def _check_state(state, params: BiLMParams, batch_size: int) -> None:
    config = params.config
    expected = {
        "c": (N_DIRECTIONS, config.n_layers, batch_size, config.lstm_dim),
        "h": (N_DIRECTIONS, config.n_layers, batch_size, config.state_dim),
    }
    if not isinstance(state, LSTMState):
        raise ValueError(
            f"initial_state must be an LSTMState (c, h) as returned with return_state=True, "
            f"found {type(state).__name__}"
        )
    for name, shape in expected.items():
        found = getattr(state, name)
        if tuple(np.shape(found)) != shape or not jnp.issubdtype(found.dtype, jnp.floating):
            raise ValueError(
                f"initial_state.{name}: expected float {shape} (directions, layers, batch, width), "
                f"found {getattr(found, 'dtype', '?')} {tuple(np.shape(found))}"
            )
