"""elmo-jax: ELMo (Peters et al., 2018) in JAX, weight-compatible with bilm-tf and AllenNLP.

params = elmo_jax.load_hdf5("options.json", "weights.hdf5")   # or elmo_jax.pretrained.load("small")
layers, mask = elmo_jax.embed(params, elmo_jax.batch_to_ids([["Hello", "world", "."]]))
# layers: float32 (B, 3, T, 1024); mask: bool (B, T)
"""

from elmo_jax import pretrained
from elmo_jax.features.embed import embed, embed_tokens
from elmo_jax.features.mix import ElmoRepresentations, ScalarMix, mix_l2_penalty, scalar_mix
from elmo_jax.features.sentences import SentenceEmbedder, embed_sentences, stream_sentences
from elmo_jax.features.task_layers import ElmoTaskLayers, elmo_penalty
from elmo_jax.features.token_cache import TokenCache, build_token_cache, load_token_cache, save_token_cache
from elmo_jax.formats.model_dir import load
from elmo_jax.formats.weights_hdf5 import load_hdf5, save_hdf5
from elmo_jax.model.bilm import add_boundaries, remove_boundaries
from elmo_jax.model.chars import batch_to_ids, token_to_raw_ids, tokens_to_raw_ids
from elmo_jax.model.config import BiLMConfig, read_options
from elmo_jax.model.lstm import LSTMState, zero_state
from elmo_jax.model.params import BiLMParams, count_parameters, init_params

__all__ = [
    "BiLMConfig",
    "BiLMParams",
    "ElmoRepresentations",
    "ElmoTaskLayers",
    "LSTMState",
    "ScalarMix",
    "SentenceEmbedder",
    "TokenCache",
    "add_boundaries",
    "batch_to_ids",
    "build_token_cache",
    "count_parameters",
    "elmo_penalty",
    "embed",
    "embed_sentences",
    "embed_tokens",
    "init_params",
    "load",
    "load_hdf5",
    "load_token_cache",
    "mix_l2_penalty",
    "pretrained",
    "read_options",
    "remove_boundaries",
    "save_hdf5",
    "save_token_cache",
    "scalar_mix",
    "stream_sentences",
    "token_to_raw_ids",
    "tokens_to_raw_ids",
    "zero_state",
]
