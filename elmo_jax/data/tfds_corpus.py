"""Sentence corpora as random-access sequences, by name: a stock TFDS dataset (e.g. `lm1b`), local text
files (prepared once as ArrayRecord shards by `local_corpus`), or a corpus prepared earlier.

    lm1b = open_sentences("test", tfds_name="lm1b", data_dir="/data/tfds")      # a stock TFDS dataset
    train = open_sentences("train", files={"train": "corpus/*.txt"}, data_dir="/data/prepared")
    len(train); train[i] -> "the cat sat ."

Stock datasets are returned as stored: `lm1b` keeps each line `strip()`-ed (not re-spaced), and TFDS
shuffled its examples by key when it prepared it, so its order is not file order. They must have been
prepared in the ArrayRecord format (`download_and_prepare(file_format="array_record")`), which random
access requires; nothing is downloaded here. Preparing lm1b with TFDS without TensorFlow needs more
memory than its 4 GB split (TFDS spills larger splits through TensorFlow): `python -m
elmo_jax.prepare_lm1b` prepares the same text as a local corpus in bounded memory instead.
A `data_dir` in Cloud Storage (`gs://...`) is read from a local copy of the dataset (`tfds_mirror`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from elmo_jax import storage
from elmo_jax.data import local_corpus, text_files, tfds_mirror
from elmo_jax.data.sentence_source import SentenceSource

SPLITS = local_corpus.SPLITS  # "train" and "test", the split names of the stock lm1b dataset
_PLAIN_SPLIT_RE = re.compile(r"\w+")

__all__ = ["SPLITS", "SentenceSource", "open_sentences"]


def open_sentences(
    split: str,
    *,
    tfds_name: str | None = None,
    data_dir: str | os.PathLike | None = None,
    files: Mapping[str, text_files.Files] | None = None,
    corpus: local_corpus.PreparedCorpus | None = None,
    text_key: str = "text",
) -> SentenceSource:
    """The sentences of one split, from exactly one of `tfds_name`, `files` or `corpus`.

    Args:
      split: "train" or "test" (any TFDS split spec works with `tfds_name`, e.g. "train[:1%]").
      tfds_name: a prepared TFDS dataset, e.g. "lm1b"; never downloaded here.
      data_dir: with `tfds_name`, the TFDS data directory (None for TFDS's default); with `files`, where
        they are prepared (required).
      files: {"train": glob(s), "test": glob(s)} of local text files; "test" is optional. Prepared with
        `local_corpus.prepare_local_corpus` into `data_dir` (or reused), then read.
      corpus: a corpus returned by `local_corpus.prepare_local_corpus`.
      text_key: the feature holding the sentence in a TFDS dataset's records.

    Returns:
      A `SentenceSource`.
    """
    given = [n for n, v in (("tfds_name", tfds_name), ("files", files), ("corpus", corpus)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"open_sentences: pass exactly one of tfds_name, files, corpus; got {given or 'none'}")
    if files is not None:
        unknown = sorted(set(files) - set(SPLITS))
        if unknown or "train" not in files:
            raise ValueError(f"files={dict(files)}: expected keys 'train' and optionally 'test', found {sorted(files)}")
        if split not in files:
            raise ValueError(f"split {split!r}: no files given for it; files has {sorted(files)}")
        if data_dir is None:
            raise ValueError("open_sentences: files need a data_dir to be prepared in")
        corpus = local_corpus.prepare_local_corpus(files["train"], files.get("test"), data_dir)
    if corpus is not None:
        return local_corpus.open_split(corpus, split)
    return _open_tfds(tfds_name, split, data_dir, text_key)


def prepared_splits(name: str, data_dir) -> list[str]:
    """The split names of the prepared TFDS dataset `name` in `data_dir` (None: TFDS's default).

    Raises:
      ValueError: TFDS does not know the dataset (or its config).
      FileNotFoundError: it is not prepared there (nothing is ever downloaded here).
    """
    return sorted(_prepared_builder(name, data_dir).info.splits.keys())


def is_plain_split(split: str) -> bool:
    """Whether `split` is a bare split name ("train"), not a slice or sum ("train[:1%]") left to TFDS."""
    return bool(_PLAIN_SPLIT_RE.fullmatch(split))


def _prepared_builder(name: str, data_dir):
    builder = _builder(name, data_dir)
    if not builder.is_prepared():
        raise FileNotFoundError(
            f"TFDS dataset {name!r} is not prepared in {builder.data_dir}; prepare it first with "
            "download_and_prepare(file_format='array_record') (it is never downloaded here)"
            + ("; for lm1b, `python -m elmo_jax.prepare_lm1b` prepares it without TFDS" if name == "lm1b" else "")
        )
    return builder


def _open_tfds(name: str, split: str, data_dir, text_key: str) -> SentenceSource:
    builder = _prepared_builder(name, data_dir)
    local = tfds_mirror.local_data_dir(builder)  # in a bucket: a local copy (one request per record otherwise)
    if not storage.absolute(builder.data_dir).startswith(local + "/"):
        builder = _builder(name, local)
    available = sorted(builder.info.splits.keys())
    if is_plain_split(split) and split not in available:  # "train[:1%]" etc. are left to TFDS
        raise ValueError(f"{name} has no split {split!r}; it has {available}")
    try:
        source = builder.as_data_source(split)
    except ValueError as e:  # e.g. prepared as TFRecord, which has no random access
        raise ValueError(f"cannot read {name} split {split!r} at random: {e}") from e
    full_name = f"{builder.name}/{builder.builder_config.name}" if builder.builder_config else builder.name
    return SentenceSource(source, name=f"{full_name}[{split}]", text_key=text_key)


def _builder(name: str, data_dir):
    import tensorflow_datasets as tfds  # only here: importing TFDS takes seconds

    try:
        return tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # TFDS raises assorted types; a person needs the name and the directory
        first_line = str(e).strip().split("\n", 1)[0]  # TFDS appends a list of every dataset it knows
        raise ValueError(f"cannot open TFDS dataset {name!r} in data_dir={data_dir}: {first_line}") from e
