"""elmo-jax: ELMo (Peters et al., 2018) in JAX, weight-compatible with bilm-tf and AllenNLP.

params = elmo_jax.load_hdf5("options.json", "weights.hdf5")   # or elmo_jax.pretrained.load("small")
layers, mask = elmo_jax.embed(params, elmo_jax.batch_to_ids([["Hello", "world", "."]]))
# layers: float32 (B, 3, T, 1024); mask: bool (B, T)
"""

# The public names are imported on first use (PEP 562's module `__getattr__`, as SciPy does for its
# submodules and JAX for its deprecated names): `import elmo_jax` alone imports neither JAX nor Flax, so
# a command's `--help` (`python -m elmo_jax.X` imports this package first) answers at once.
# `elmo_jax.embed`, `from elmo_jax import embed`, `__all__` and `dir(elmo_jax)` work as with eager imports.

import importlib

# Public name -> the module that defines it ("pretrained" is a public module of its own).
_LAZY = {
    "pretrained": "elmo_jax.pretrained",
    "embed": "elmo_jax.features.embed",
    "embed_tokens": "elmo_jax.features.embed",
    "ElmoRepresentations": "elmo_jax.features.mix",
    "ScalarMix": "elmo_jax.features.mix",
    "mix_l2_penalty": "elmo_jax.features.mix",
    "scalar_mix": "elmo_jax.features.mix",
    "Embedder": "elmo_jax.embedder",
    "SentenceEmbedder": "elmo_jax.features.sentences",
    "embed_sentences": "elmo_jax.features.sentences",
    "stream_sentences": "elmo_jax.features.sentences",
    "ElmoTaskLayers": "elmo_jax.features.task_layers",
    "elmo_penalty": "elmo_jax.features.task_layers",
    "TokenCache": "elmo_jax.features.token_cache",
    "build_token_cache": "elmo_jax.features.token_cache",
    "load_token_cache": "elmo_jax.features.token_cache",
    "save_token_cache": "elmo_jax.features.token_cache",
    "load": "elmo_jax.formats.model_dir",
    "load_hdf5": "elmo_jax.formats.weights_hdf5",
    "save_hdf5": "elmo_jax.formats.weights_hdf5",
    "add_boundaries": "elmo_jax.model.bilm",
    "remove_boundaries": "elmo_jax.model.bilm",
    "batch_to_ids": "elmo_jax.model.chars",
    "token_to_raw_ids": "elmo_jax.model.chars",
    "tokens_to_raw_ids": "elmo_jax.model.chars",
    "BiLMConfig": "elmo_jax.model.config",
    "read_options": "elmo_jax.model.config",
    "LSTMState": "elmo_jax.model.lstm",
    "zero_state": "elmo_jax.model.lstm",
    "BiLMParams": "elmo_jax.model.params",
    "TokenVocabulary": "elmo_jax.model.vocabulary",
    "token_vocabulary": "elmo_jax.model.vocabulary",
    "count_parameters": "elmo_jax.model.params",
    "init_params": "elmo_jax.model.params",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    """Imports a public name's module on first access and keeps the name here (later accesses are
    plain attribute reads)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elmo_jax' has no attribute {name!r}")
    imported = importlib.import_module(module)
    value = imported if module == f"elmo_jax.{name}" else getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
