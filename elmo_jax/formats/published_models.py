"""The published ELMo models: names, download addresses, and what each file is known to be.

AllenNLP published each English biLM as two files under one base address (`BASE_URL`): an options JSON
and an HDF5 weight file in bilm-tf's layout (docs/PRETRAINED.md lists the sources). `MODELS` maps a
short name (what `elmo_jax.pretrained.load(name)` and `--model=NAME` take) to a `PublishedModel`.

Only one file has a published checksum: the original model's weights, whose size and SHA-256 come from
the Git LFS pointer of the same file in the Hugging Face mirror `lysandre/elmo`. For every other file
the size and SHA-256 are recorded at its first download and every later download (or copy placed by
hand) must match that record (`formats.pretrained`); every download is also checked structurally
(`load_hdf5` reads each dataset against the options).

`ELMO_JAX_MODELS_URL` replaces `BASE_URL` (a mirror, a proxy, or a local test server): the files keep
their paths under it.
"""

from __future__ import annotations

import dataclasses
import os

from elmo_jax.formats.download import AddressError, check_address

BASE_URL = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
BASE_URL_VARIABLE = "ELMO_JAX_MODELS_URL"


def mirror_url() -> str:
    """The base address downloads use: $ELMO_JAX_MODELS_URL when set, else `BASE_URL`.

    Raises:
      ValueError: the variable is set but is not an http(s) address with a host (say `127.0.0.1:8000`,
        which lacks its scheme); the message names the variable, so it fails before any download.
    """
    base = os.environ.get(BASE_URL_VARIABLE)
    if not base:
        return BASE_URL
    try:
        check_address(base)
    except AddressError:
        example = base if "://" in base else "http://" + base.lstrip("/")
        raise ValueError(
            f"${BASE_URL_VARIABLE}={base!r} is not an http:// or https:// address with a host (e.g. {example!r}); "
            f"unset it to download from {BASE_URL}"
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
    """

    path: str
    bytes: int | None = None
    sha256: str | None = None
    checksum_source: str = ""

    @property
    def name(self) -> str:
        """The file's name (the last part of its path), as it is kept in the download cache."""
        return self.path.rsplit("/", 1)[-1]

    def url(self, base_url: str | None = None) -> str:
        """Its address under `base_url` (default: $ELMO_JAX_MODELS_URL, else `BASE_URL`)."""
        return (base_url or mirror_url()).rstrip("/") + "/" + self.path


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


def _pair(folder: str, stem: str, weights_suffix: str = "weights", **weights_facts) -> dict:
    return {
        "options": PublishedFile(f"{folder}/{stem}_options.json"),
        "weights": PublishedFile(f"{folder}/{stem}_{weights_suffix}.hdf5", **weights_facts),
    }


MODELS: dict[str, PublishedModel] = {
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


def find(name: str) -> PublishedModel:
    """The published model called `name` (case-insensitive; "original_5.5b" and "5.5b" also name
    "original-5.5b").

    Raises:
      ValueError: no such model; the message lists the names.
    """
    key = name.strip().lower().replace("_", "-")
    key = {"5.5b": "original-5.5b", "original-5b": "original-5.5b"}.get(key, key)
    if key not in MODELS:
        raise ValueError(f"no published ELMo model is called {name!r}; the names are {', '.join(MODELS)}")
    return MODELS[key]


def is_published_name(name: str) -> bool:
    """Whether `name` names a published model (see `find`)."""
    try:
        find(name)
    except ValueError:
        return False
    return True
