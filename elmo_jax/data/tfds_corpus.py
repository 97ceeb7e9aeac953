"""Sentence corpora as random-access sequences: local text files prepared once with TFDS, or TFDS datasets.

    builder = prepare_local_corpus("corpus/train-*", "corpus/heldout-*", data_dir="/data/tfds")
    train = open_sentences("train", builder=builder)          # len(train); train[i] -> "the cat sat ."
    lm1b = open_sentences("test", tfds_name="lm1b", data_dir="/data/tfds")   # a stock TFDS dataset

Local text files (one whitespace-tokenized sentence per line) are written once into a TFDS dataset
`local_text_corpus/<name>_<fingerprint>` in ArrayRecord files, with the stock `lm1b` features
(`{"text": tfds.features.Text()}`), one example per kept line, in file order. Reading needs neither
TensorFlow nor the original files, and gives random access (`grain.MapDataset.source(seq)` works on
the sequences returned here). The config name carries a fingerprint of the file list, sizes and
modification times plus the reading options, so re-running with the same files reuses the prepared
data and any change (a file added, edited or touched) prepares a new dataset next to the old one,
never a silently stale one. Old versions are left on disk for the user to delete.

Each example's text is the line's tokens joined by single spaces; blank, over-long and (optionally)
invalid-UTF-8 lines are skipped and counted by `text_files.iter_sentences`; those counts are logged
and stored with the dataset (`read_stats(builder)`).

Stock datasets are returned as stored: `lm1b` keeps each line `strip()`-ed (not re-spaced), and TFDS
shuffled its examples by key when it prepared it, so its order is not file order. They must have
been prepared in the ArrayRecord format (`download_and_prepare(file_format="array_record")`), which
random access requires.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import operator
import os
import re
from collections.abc import Mapping, Sequence

import tensorflow_datasets as tfds
from absl import logging

from elmo_jax.data import text_files

SPLITS = ("train", "test")  # the split names of the stock lm1b dataset
_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
_PLAIN_SPLIT_RE = re.compile(r"\w+")


@dataclasses.dataclass
class LocalTextCorpusConfig(tfds.core.BuilderConfig):
    """Which files make each split and how they are read (all part of the fingerprinted name)."""

    train_files: tuple[str, ...] = ()
    test_files: tuple[str, ...] = ()
    max_line_chars: int | None = text_files.DEFAULT_MAX_LINE_CHARS
    invalid_utf8: str = "replace"


class LocalTextCorpus(tfds.core.GeneratorBasedBuilder):
    """Local one-sentence-per-line text files as a TFDS dataset with the features of `lm1b`."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Sentences of local text files, whitespace-normalised, in file order."}
    # TFDS looks for a checksums file next to the builder's code, and for a builder inside a package
    # (like this one) that lookup imports `importlib_resources`, which TFDS 4.9.10 does not install
    # (tensorflow/datasets#11212). Nothing is downloaded here, so there is no code path to look at.
    code_path = None

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Local text files, one whitespace-tokenized sentence per line (1B Word Benchmark format).",
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            # Examples keep file order (with integer keys); without this TFDS shuffles them by key hash.
            disable_shuffling=True,
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        config = self.builder_config
        splits = {"train": config.train_files, "test": config.test_files}
        return {split: self._generate_examples(files=files, split=split) for split, files in splits.items() if files}

    def _generate_examples(self, files: Sequence[str], split: str):
        config = self.builder_config
        stats = text_files.ReadStats()
        sentences = text_files.iter_sentences(
            files, max_line_chars=config.max_line_chars, invalid_utf8=config.invalid_utf8, stats=stats
        )
        for index, tokens in enumerate(sentences):
            yield index, {"text": " ".join(tokens)}
        logging.info("local_text_corpus %s: %s", split, stats.summary())
        if stats.sentences == 0:
            raise ValueError(f"split {split!r} has no sentences: {stats.summary()}")
        # Written to metadata.json with the dataset, so a reused dataset still reports what was skipped.
        self.info.metadata[f"read_stats_{split}"] = stats.to_dict()


def fingerprint(
    train_files: Sequence[str], test_files: Sequence[str], max_line_chars: int | None, invalid_utf8: str
) -> str:
    """Hex digest of everything that decides a prepared dataset's content."""

    def describe(path: str) -> list:
        info = os.stat(path)
        return [os.path.abspath(path), info.st_size, info.st_mtime_ns]

    key = {
        "version": str(LocalTextCorpus.VERSION),
        "train": [describe(p) for p in train_files],
        "test": [describe(p) for p in test_files],
        "max_line_chars": max_line_chars,
        "invalid_utf8": invalid_utf8,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def prepare_local_corpus(
    train_files: text_files.Files,
    heldout_files: text_files.Files | None,
    data_dir: str | os.PathLike | None,
    *,
    name: str = "corpus",
    max_line_chars: int | None = text_files.DEFAULT_MAX_LINE_CHARS,
    invalid_utf8: str = "replace",
) -> LocalTextCorpus:
    """Writes (once) the TFDS dataset of local text files and returns its builder.

    Args:
      train_files: glob(s) or paths of the training text (split "train").
      heldout_files: glob(s) or paths of the heldout text (split "test", as in lm1b), or None.
      data_dir: the TFDS data directory; None for TFDS's default (~/tensorflow_datasets).
      name: readable prefix of the config name; letters, digits and "_".
      max_line_chars, invalid_utf8: how lines are read (see `text_files.iter_sentences`).

    Returns:
      The prepared builder; `tfds_name(builder)` is its name for `tfds.data_source`.

    Raises:
      FileNotFoundError, IsADirectoryError, ValueError: bad globs or options (see
        `text_files.expand_glob`), a bad `name`, a file in both splits, or a split without any sentence.

    With several hosts, prepare once (e.g. on host 0, then a barrier) before the others read: TFDS
    writes into a temporary directory and renames it, but two hosts preparing at once race.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"name={name!r}: expected letters, digits and '_' only")
    text_files.check_read_options(max_line_chars, invalid_utf8)
    train = tuple(os.path.abspath(p) for p in text_files.expand_glob(train_files))
    test = tuple(os.path.abspath(p) for p in text_files.expand_glob(heldout_files)) if heldout_files else ()
    both = sorted(set(map(os.path.realpath, train)) & set(map(os.path.realpath, test)))
    if both:  # heldout perplexity on training text would look far better than it is
        raise ValueError(f"{len(both)} file(s) are in both the train and the heldout files: {', '.join(both[:5])}")
    digest = fingerprint(train, test, max_line_chars, invalid_utf8)
    config = LocalTextCorpusConfig(
        name=f"{name}_{digest[:16]}",
        description=f"fingerprint {digest}",
        train_files=train,
        test_files=test,
        max_line_chars=max_line_chars,
        invalid_utf8=invalid_utf8,
    )
    builder = LocalTextCorpus(config=config, data_dir=data_dir, file_format="array_record")
    with _in_memory_shuffle_without_tensorflow():
        builder.download_and_prepare(
            # Statistics would need TensorFlow; the counts that matter are in read_stats(builder).
            download_config=tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP)
        )
    for split, stats in read_stats(builder).items():
        logging.info("%s %s: %s", tfds_name(builder), split, stats.summary())
    return builder


@contextlib.contextmanager
def _in_memory_shuffle_without_tensorflow():
    """Keeps every split in memory while TFDS writes it, when TensorFlow is not installed.

    TFDS (4.9) spills a split larger than `shuffle.MAX_MEM_BUFFER_SIZE` (1000 MiB) to temporary files
    through `tf.io.gfile`, which needs TensorFlow, so a 1B-Word-sized corpus could not be prepared
    without it. Raising the limit keeps the split in memory instead: preparation then needs about the
    split's size in RAM (the 1B Word Benchmark: ~5 GB), once.
    """
    if importlib.util.find_spec("tensorflow") is not None:
        yield
        return
    from tensorflow_datasets.core import shuffle

    limit = shuffle.MAX_MEM_BUFFER_SIZE
    shuffle.MAX_MEM_BUFFER_SIZE = 1 << 62
    try:
        yield
    finally:
        shuffle.MAX_MEM_BUFFER_SIZE = limit


def tfds_name(builder: tfds.core.DatasetBuilder) -> str:
    """ "dataset/config" (or "dataset"), the name `tfds.data_source(name, data_dir=...)` reads it by."""
    return f"{builder.name}/{builder.builder_config.name}" if builder.builder_config else builder.name


def read_stats(builder: tfds.core.DatasetBuilder) -> dict[str, text_files.ReadStats]:
    """Split -> what reading its text files found (empty for datasets not prepared by this module)."""
    found = {}
    for key, value in (builder.info.metadata or {}).items():
        if key.startswith("read_stats_"):
            found[key[len("read_stats_") :]] = text_files.ReadStats(**value)
    return found


class SentenceSource(Sequence):
    """Random access to the sentences of a TFDS data source: `len(src)`, `src[i] -> str`.

    Suits `grain.MapDataset.source(src)`. Indices follow Python: negative ones count from the end,
    anything outside [-len, len) raises IndexError, and a slice gives a list.
    """

    def __init__(self, source: Sequence, *, name: str, text_key: str = "text"):
        self._source, self._text_key, self.name = source, text_key, name
        self._length = len(source)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return self.__getitems__(range(*index.indices(self._length)))
        return self._text(self._source[self._check(index)])

    def __getitems__(self, indices: Sequence[int]) -> list[str]:
        """Several sentences in one read (ArrayRecord batches the lookups)."""
        keys = [self._check(i) for i in indices]
        getitems = getattr(self._source, "__getitems__", None)
        records = getitems(keys) if getitems else [self._source[k] for k in keys]
        return [self._text(record) for record in records]

    def __repr__(self) -> str:
        return f"SentenceSource({self.name}, {self._length} sentences)"

    def _check(self, index: int) -> int:
        index = operator.index(index)
        if not -self._length <= index < self._length:
            raise IndexError(f"sentence {index} is out of range for {self.name} ({self._length} sentences)")
        return index + self._length if index < 0 else index

    def _text(self, record) -> str:
        try:
            text = record[self._text_key]
        except (KeyError, TypeError):
            found = sorted(record) if isinstance(record, Mapping) else type(record).__name__
            raise KeyError(f"{self.name}: records have no {self._text_key!r} feature; found {found}") from None
        return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def open_sentences(
    split: str,
    *,
    tfds_name: str | None = None,
    data_dir: str | os.PathLike | None = None,
    files: Mapping[str, text_files.Files] | None = None,
    builder: tfds.core.DatasetBuilder | None = None,
    text_key: str = "text",
) -> SentenceSource:
    """The sentences of one split, from exactly one of `tfds_name`, `files` or `builder`.

    Args:
      split: "train" or "test" (any TFDS split spec works with `tfds_name`, e.g. "train[:1%]").
      tfds_name: a prepared TFDS dataset, e.g. "lm1b" or "local_text_corpus/corpus_0123abcd...";
        never downloaded here.
      data_dir: the TFDS data directory (None for TFDS's default).
      files: {"train": glob(s), "test": glob(s)} of local text files; "test" is optional. Prepared
        with `prepare_local_corpus` into `data_dir` (or reused), then read.
      builder: a builder returned by `prepare_local_corpus`.
      text_key: the feature holding the sentence.

    Returns:
      A `SentenceSource`.
    """
    given = [n for n, v in (("tfds_name", tfds_name), ("files", files), ("builder", builder)) if v is not None]
    if len(given) != 1:
        raise ValueError(f"open_sentences: pass exactly one of tfds_name, files, builder; got {given or 'none'}")
    if files is not None:
        unknown = sorted(set(files) - set(SPLITS))
        if unknown or "train" not in files:
            raise ValueError(f"files={dict(files)}: expected keys 'train' and optionally 'test', found {sorted(files)}")
        if split not in files:
            raise ValueError(f"split {split!r}: no files given for it; files has {sorted(files)}")
        builder = prepare_local_corpus(files["train"], files.get("test"), data_dir)
    if builder is None:
        try:
            builder = tfds.builder(tfds_name, data_dir=data_dir)
        except Exception as e:  # TFDS raises assorted types; a person needs the name and the directory
            first_line = str(e).strip().split("\n", 1)[0]  # TFDS appends a list of every dataset it knows
            raise ValueError(f"cannot open TFDS dataset {tfds_name!r} in data_dir={data_dir}: {first_line}") from e
        if not builder.is_prepared():
            raise FileNotFoundError(
                f"TFDS dataset {tfds_name!r} is not prepared in {builder.data_dir}; prepare it "
                "first with download_and_prepare(file_format='array_record') (it is never "
                "downloaded here)"
            )
    return _from_builder(builder, split, text_key)


def _from_builder(builder: tfds.core.DatasetBuilder, split: str, text_key: str) -> SentenceSource:
    available = sorted(builder.info.splits.keys())
    if _PLAIN_SPLIT_RE.fullmatch(split) and split not in available:  # "train[:1%]" etc. are left to TFDS
        raise ValueError(f"{tfds_name(builder)} has no split {split!r}; it has {available}")
    try:
        source = builder.as_data_source(split)
    except ValueError as e:  # e.g. prepared as TFRecord, which has no random access
        raise ValueError(f"cannot read {tfds_name(builder)} split {split!r} at random: {e}") from e
    return SentenceSource(source, name=f"{tfds_name(builder)}[{split}]", text_key=text_key)
