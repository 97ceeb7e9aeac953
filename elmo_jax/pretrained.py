"""The published ELMo models by name, as AllenNLP's `ElmoEmbedder()` and flair's `ELMoEmbeddings("small")`
offer them:

    import elmo_jax
    params = elmo_jax.pretrained.load("small")        # downloads once, then reads the cache
    layers, mask = elmo_jax.embed(params, elmo_jax.batch_to_ids([["Hello", "world", "."]]))

Names: small, medium, original, original-5.5b, pubmed, and ELMoForManyLangs' 44 languages as efml:LANG
(efml:zh, efml:ja, efml:ar, ...; `MODELS`, docs/PRETRAINED.md). The commands take them too:
`python -m elmo_jax.embed_text --model=small "..."`, `--config.init_from=small` for training.
A model is downloaded once into `cache_dir()` ($ELMO_JAX_CACHE, default ~/.cache/elmo_jax), resuming a
broken download, checked (size and SHA-256; the whole pair against its options) and converted into a
model directory (`fetch` returns its path). $ELMO_JAX_MODELS_URL names a mirror of AllenNLP's published
files, $ELMO_JAX_NLPL_URL of the NLPL repository's.
"""

from elmo_jax.formats.download import DownloadError
from elmo_jax.formats.pretrained import PretrainedError, cache_dir, fetch, load, model_path
from elmo_jax.formats.published_models import MODELS, EfmlModel, PublishedFile, PublishedModel, find

__all__ = [
    "MODELS",
    "DownloadError",
    "EfmlModel",
    "PretrainedError",
    "PublishedFile",
    "PublishedModel",
    "cache_dir",
    "fetch",
    "find",
    "load",
    "model_path",
]
