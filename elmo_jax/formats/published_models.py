"""The published ELMo models: names, download addresses, and what each file is known to be.

AllenNLP published each English biLM as two files under one base address (`BASE_URL`): an options JSON
and an HDF5 weight file in bilm-tf's layout (docs/PRETRAINED.md lists the sources). `MODELS` maps a
short name (what `elmo_jax.pretrained.load(name)` and `--model=NAME` take) to a `PublishedModel`.

HIT-SCIR's ELMoForManyLangs (EFML: the CoNLL 2018 shared task's biLMs, 44 languages) published each
model as one zip archive of an EFML model directory in the NLPL word embeddings repository (`NLPL`);
`efml:LANG` names them (`EfmlModel`, `EFML_LANGUAGES`: ISO 639-1 codes, ISO 639-3 where a language has
none), converted once like the others (`formats.pretrained`).

Only one file has a published checksum: the original model's weights, whose size and SHA-256 come from
the Git LFS pointer of the same file in the Hugging Face mirror `lysandre/elmo`. For every other file
the size and SHA-256 are recorded at its first download and every later download (or copy placed by
hand) must match that record (`formats.pretrained`); every download is also checked structurally
(`load_hdf5` reads each dataset against the options; an EFML archive is read by its converter).

`ELMO_JAX_MODELS_URL` replaces `BASE_URL` (a mirror, a proxy, or a local test server), and
`ELMO_JAX_NLPL_URL` the NLPL address: the files keep their paths under it.
"""

from __future__ import annotations

import dataclasses
import os

from elmo_jax.formats.download import AddressError, check_address

BASE_URL = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
BASE_URL_VARIABLE = "ELMO_JAX_MODELS_URL"


@dataclasses.dataclass(frozen=True)
class Host:
    """Where a family of published files lives, and the variable that names a mirror of it.

    Attributes:
      url: the published base address (ends in "/").
      variable: the environment variable that replaces it (a mirror keeping the same paths).
    """

    url: str
    variable: str


ALLENNLP = Host(BASE_URL, BASE_URL_VARIABLE)  # AllenNLP's S3 bucket: the bilm-tf/AllenNLP models
NLPL = Host("http://vectors.nlpl.eu/repository/", "ELMO_JAX_NLPL_URL")  # the NLPL repository: EFML's models


def mirror_url(host: Host = ALLENNLP) -> str:
    """The base address downloads from `host` use: its variable's value when set, else its address.

    Raises:
      ValueError: the variable is set but is not an http(s) address with a host (say `127.0.0.1:8000`,
        which lacks its scheme); the message names the variable, so it fails before any download.
    """
    base = os.environ.get(host.variable)
    if not base:
        return host.url
    try:
        check_address(base)
    except AddressError:
        example = base if "://" in base else "http://" + base.lstrip("/")
        raise ValueError(
            f"${host.variable}={base!r} is not an http:// or https:// address with a host (e.g. {example!r}); "
            f"unset it to download from {host.url}"
        ) from None
    return base


@dataclasses.dataclass(frozen=True)
class PublishedFile:
    """One published file.

    Attributes:
      path: its path under the base address, e.g. "2x1024_128_2048cnn_1xhighway/elmo_..._options.json".
      bytes: its exact size, where a source states it; None otherwise (recorded at the first download).
      sha256: its SHA-256 (hex), where a source states it; None otherwise (recorded at the first download).
      checksum_source: where `bytes` and `sha256` come from (shown when a download does not match).
      host: where it lives (`ALLENNLP`, `NLPL`).
    """

    path: str
    bytes: int | None = None
    sha256: str | None = None
    checksum_source: str = ""
    host: Host = ALLENNLP

    @property
    def name(self) -> str:
        """The file's name (the last part of its path), as it is kept in the download cache."""
        return self.path.rsplit("/", 1)[-1]

    def url(self, base_url: str | None = None) -> str:
        """Its address under `base_url` (default: its host's mirror variable, else the host's address)."""
        return (base_url or mirror_url(self.host)).rstrip("/") + "/" + self.path

    @property
    def published_url(self) -> str:
        """Its published address, whatever mirror is set."""
        return self.url(self.host.url)


@dataclasses.dataclass(frozen=True)
class PublishedModel:
    """A published biLM: its options and weights files and what is known about it.

    Attributes:
      name: the short name (`elmo_jax.pretrained.load(name)`, `--model=name`).
      options: the options JSON.
      weights: the HDF5 weight file.
      preset: the `BiLMConfig.preset` size its options must describe ("small", "medium", "original"), or
        None to accept any shape the options give.
      description: one line for people: shape, parameters and training corpus.
    """

    name: str
    options: PublishedFile
    weights: PublishedFile
    preset: str | None = None
    description: str = ""

    @property
    def files(self) -> tuple[PublishedFile, PublishedFile]:
        return (self.options, self.weights)

    @property
    def cache_name(self) -> str:
        """Its folder's name in the cache (`formats.pretrained`)."""
        return self.name


@dataclasses.dataclass(frozen=True)
class EfmlModel:
    """An ELMoForManyLangs model: one zip archive of an EFML model directory (config.json, char.dic,
    word.dic, token_embedder.pkl, encoder.pkl) in the NLPL repository.

    Attributes:
      name: "efml:" and the language's code (`elmo_jax.pretrained.load(name)`, `--model=name`).
      archive: the zip archive.
      language: the language, as EFML's README names it.
      description: one line for people.
    """

    name: str
    archive: PublishedFile
    language: str
    description: str = ""

    @property
    def files(self) -> tuple[PublishedFile]:
        return (self.archive,)

    @property
    def cache_name(self) -> str:
        """Its folder's name in the cache: "efml-LANG" (a colon is no file name on Windows)."""
        return self.name.replace(":", "-")


EFML_PREFIX = "efml:"
# ELMoForManyLangs' 44 models (https://github.com/HIT-SCIR/ELMoForManyLangs, "Downloads"): code -> (the
# language as its README names it, the model's id in version 1.1 of the NLPL repository, whose address is
# NLPL/11/ID.zip). ISO 639-1 codes; grc (ISO 639-3) for Ancient Greek, which has none. Chinese (zh) is the
# model trained on Traditional Chinese Wikipedia (the CoNLL 2018 Chinese treebank's script); EFML's
# Simplified Chinese model (Xinhua news) was published elsewhere, outside NLPL, and is not in this table.
EFML_LANGUAGES: dict[str, tuple[str, int]] = {
    "ar": ("Arabic", 136),
    "bg": ("Bulgarian", 137),
    "ca": ("Catalan", 138),
    "cs": ("Czech", 139),
    "cu": ("Old Church Slavonic", 140),
    "da": ("Danish", 141),
    "de": ("German", 142),
    "el": ("Greek", 143),
    "en": ("English", 144),
    "es": ("Spanish", 145),
    "et": ("Estonian", 146),
    "eu": ("Basque", 147),
    "fa": ("Persian", 148),
    "fi": ("Finnish", 149),
    "fr": ("French", 150),
    "ga": ("Irish", 151),
    "gl": ("Galician", 152),
    "grc": ("Ancient Greek", 153),
    "he": ("Hebrew", 154),
    "hi": ("Hindi", 155),
    "hr": ("Croatian", 156),
    "hu": ("Hungarian", 157),
    "id": ("Indonesian", 158),
    "it": ("Italian", 159),
    "ja": ("Japanese", 160),
    "ko": ("Korean", 161),
    "la": ("Latin", 162),
    "lv": ("Latvian", 163),
    "nl": ("Dutch", 164),
    "nb": ("Norwegian Bokmål", 165),
    "nn": ("Norwegian Nynorsk", 166),
    "pl": ("Polish", 167),
    "pt": ("Portuguese", 168),
    "ro": ("Romanian", 169),
    "ru": ("Russian", 170),
    "sk": ("Slovak", 171),
    "sl": ("Slovene", 172),
    "sv": ("Swedish", 173),
    "tr": ("Turkish", 174),
    "ug": ("Uyghur", 175),
    "uk": ("Ukrainian", 176),
    "ur": ("Urdu", 177),
    "vi": ("Vietnamese", 178),
    "zh": ("Chinese (Traditional)", 179),
}
EFML_ALIASES = {"zh-hant": "zh", "zh-tw": "zh", "no": "nb"}  # other names people use for the same models


def _efml(code: str) -> EfmlModel:
    language, nlpl_id = EFML_LANGUAGES[code]
    return EfmlModel(
        EFML_PREFIX + code,
        archive=PublishedFile(f"11/{nlpl_id}.zip", host=NLPL),
        language=language,
        description=(
            f"ELMoForManyLangs {language}: LSTM 4096, projection 512, 2 highway, word embedding 100 + char CNN "
            "over its own characters; 20M words of CoNLL 2018 raw text (Wikipedia, Common Crawl)"
        ),
    )


def _pair(folder: str, stem: str, weights_suffix: str = "weights", **weights_facts) -> dict:
    return {
        "options": PublishedFile(f"{folder}/{stem}_options.json"),
        "weights": PublishedFile(f"{folder}/{stem}_{weights_suffix}.hdf5", **weights_facts),
    }


MODELS: dict[str, PublishedModel | EfmlModel] = {
    "small": PublishedModel(
        "small",
        **_pair("2x1024_128_2048cnn_1xhighway", "elmo_2x1024_128_2048cnn_1xhighway"),
        preset="small",
        description="LSTM 1024, projection 128, 1 highway; 13.6M parameters (~54 MB); 1B Word Benchmark",
    ),
    "medium": PublishedModel(
        "medium",
        **_pair("2x2048_256_2048cnn_1xhighway", "elmo_2x2048_256_2048cnn_1xhighway"),
        preset="medium",
        description="LSTM 2048, projection 256, 1 highway; 28.0M parameters (~112 MB); 1B Word Benchmark",
    ),
    "original": PublishedModel(
        "original",
        **_pair(
            "2x4096_512_2048cnn_2xhighway",
            "elmo_2x4096_512_2048cnn_2xhighway",
            bytes=374_434_792,
            sha256="a6b92b9ccbb13fe489faacd2221c795d4bebe84b75f8aded9d85ea464fa5c994",
            checksum_source="the Git LFS pointer of this file in the Hugging Face mirror lysandre/elmo",
        ),
        preset="original",
        description="LSTM 4096, projection 512, 2 highway; 93.6M parameters (374 MB); 1B Word Benchmark",
    ),
    "original-5.5b": PublishedModel(
        "original-5.5b",
        **_pair("2x4096_512_2048cnn_2xhighway_5.5B", "elmo_2x4096_512_2048cnn_2xhighway_5.5B"),
        preset="original",
        description="the original shape trained on 5.5B tokens (Wikipedia and WMT 2008-2012 news); ~374 MB",
    ),
    "pubmed": PublishedModel(
        "pubmed",
        **_pair(
            "contributed/pubmed",
            "elmo_2x4096_512_2048cnn_2xhighway",
            weights_suffix="weights_PubMed_only",
        ),
        preset="original",
        description="the original shape trained on PubMed abstracts (contributed); ~374 MB",
    ),
}
MODELS.update({EFML_PREFIX + code: _efml(code) for code in EFML_LANGUAGES})


def find(name: str) -> PublishedModel | EfmlModel:
    """The published model called `name` (case-insensitive; "original_5.5b" and "5.5b" also name
    "original-5.5b"; "efml:zh-hant" and "efml:zh-tw" name "efml:zh", "efml:no" names "efml:nb").

    Raises:
      ValueError: no such model; the message lists the names.
    """
    key = name.strip().lower().replace("_", "-")
    key = {"5.5b": "original-5.5b", "original-5b": "original-5.5b"}.get(key, key)
    if key.startswith(EFML_PREFIX):
        code = key[len(EFML_PREFIX) :]
        key = EFML_PREFIX + EFML_ALIASES.get(code, code)
    if key not in MODELS:
        raise ValueError(f"no published ELMo model is called {name!r}; the names are {names_text()}")
    return MODELS[key]


def names_text() -> str:
    """The published names for messages: AllenNLP's in full, EFML's as one pattern with its codes."""
    others = [n for n in MODELS if not n.startswith(EFML_PREFIX)]
    codes = [n[len(EFML_PREFIX) :] for n in MODELS if n.startswith(EFML_PREFIX)]
    return ", ".join(others) + (f", and {EFML_PREFIX}LANG for LANG in {' '.join(codes)}" if codes else "")


def is_published_name(name: str) -> bool:
    """Whether `name` names a published model (see `find`)."""
    try:
        find(name)
    except ValueError:
        return False
    return True
