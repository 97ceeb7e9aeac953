"""The feature extractor as a serialized `jax.export` program (StableHLO) that runs with jax alone.

The exported function is

    extract(weights, chars) -> (layers, mask)
      weights  dict of float32 arrays keyed by weight-file path ("CNN/W_cnn_0", ...): exactly the arrays
               of a model directory's params.npz, so `dict(np.load("params.npz"))` is the argument;
      chars    int32 (batch, time, C), shifted character ids as `batch_to_ids` makes them;
      layers   float32 (batch, L+1, time, 2P), exact zeros at padding; mask bool (batch, time),

the same computation as `embed(params, chars)` (stateless, no boundary tokens). `batch` and `time`
are symbolic: one artifact serves every shape, and each new shape compiles once in the loading
process. It is lowered for CPU, CUDA and TPU so the same file runs on any of them.

`embed` picks how many character positions the char CNN looks at on the host (`content_bucket`);
here the ids are not known when the program is built, so the program computes the bucket from the
ids and `lax.switch`es to the char CNN compiled for it: the same arithmetic as `embed`, for every
bucket, in one program. The LSTM half is shared by all branches.
"""

from __future__ import annotations

import jax
import jax.export  # jax < 0.8 does not import jax.export with jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.model.bilm import add_boundaries, contextual_layers, remove_boundaries, token_mask
from elmo_jax.model.char_cnn import content_bucket, token_embedding
from elmo_jax.model.chars import PAD_CHAR
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.lstm import zero_state
from elmo_jax.model.params import BiLMParams, from_flat, iter_flat
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.model.vocabulary import pad_id

PLATFORMS = ("cpu", "cuda", "tpu")


def content_buckets(max_characters_per_token: int) -> list[int]:
    """Every value `char_cnn.content_bucket` can take for tokens of C characters, ascending."""
    C = max_characters_per_token
    return sorted({content_bucket(_widest(w, C), C) for w in range(1, C + 1)})


def _widest(width: int, C: int) -> np.ndarray:
    """Shifted ids of one token whose last non-PAD character is at position width - 1."""
    ids = np.full((1, 1, C), PAD_CHAR + 1, np.int32)
    ids[0, 0, :width] = 1
    return ids


def _bucket_index(chars: jax.Array, buckets: list[int], pad: int = PAD_CHAR + 1) -> jax.Array:
    """On device: the index in `buckets` of `content_bucket(chars)` (same rule, traced). chars (B, T, C):
    the character ids only."""
    C = chars.shape[-1]
    real = jnp.any(chars > 0, axis=-1, keepdims=True)  # (B, T, 1)
    content = (chars != pad) & real
    width = jnp.max(jnp.where(content, jnp.arange(1, C + 1, dtype=jnp.int32), 0))
    width = jnp.maximum(width, 3)
    bucket = jnp.minimum((width + 7) // 8 * 8, C)
    return jnp.sum(jnp.asarray(buckets, jnp.int32) < bucket)


def extract_fn(config: BiLMConfig, compute_dtype="float32"):
    """The pure function that is exported: (flat weights, chars) -> (layers, mask)."""
    compute = ComputeOptions(dtype=compute_dtype)
    buckets = content_buckets(config.max_characters_per_token)

    def extract(weights: dict[str, jax.Array], chars: jax.Array):
        nested = from_flat(weights)
        params = BiLMParams(weights=nested, config=config)
        B, T, W = chars.shape
        ids, mask = add_boundaries(chars, token_mask(chars), config)
        flat_ids = ids.reshape(B * (T + 2), W)
        branches = [lambda x, s=s: token_embedding(nested, config, x, compute.with_positions(s)) for s in buckets]
        characters = chars[..., : config.max_characters_per_token] if config.has_words else chars
        bucket = _bucket_index(characters, buckets, pad_id(config))
        tokens = jax.lax.switch(bucket, branches, flat_ids).reshape(B, T + 2, -1)
        layers, mask, _ = contextual_layers(params, tokens, mask, zero_state(config, B), compute=compute)
        return remove_boundaries(layers, mask)

    return extract


def export_extractor(params: BiLMParams, compute_dtype="float32", platforms=PLATFORMS) -> bytes:
    """Serialized StableHLO of `extract_fn` with symbolic (batch, time), for `jax.export.deserialize`."""
    config = params.config
    weights = {path: jax.ShapeDtypeStruct(np.shape(a), jnp.float32) for path, a in iter_flat(params.weights)}
    batch, time = jax.export.symbolic_shape("batch, time")
    chars = jax.ShapeDtypeStruct((batch, time, config.ids_per_token), jnp.int32)
    exported = jax.export.export(jax.jit(extract_fn(config, compute_dtype)), platforms=tuple(platforms))(weights, chars)
    return bytes(exported.serialize())
