"""From the `data` section of a training config to a vocabulary and sentence sources.

Three corpora, in this order of precedence:
  1. `data.tfds_name`: a prepared TFDS dataset with a "text" feature (e.g. `lm1b`), read by name;
  2. `data.train_files` (+ `data.heldout_files`): local text files, prepared once as ArrayRecord
     shards under `data.cache_dir` (default `WORKDIR/data`; `local_corpus`), in bounded memory;
  3. neither: the embedded default corpus (Python standard library docstrings), built on first use.
The vocabulary is `data.vocab_file` if given, else `WORKDIR/vocab.txt` from an earlier run of the same
workdir, else counted from the training text and written to `WORKDIR/vocab.txt` (so a resumed or
exported run keeps exactly the ids it trained with). With `data.characters = "corpus"` the model's
character vocabulary is resolved the same way: `WORKDIR/characters.json` from an earlier run, else the
characters of the training text's words (`char_vocabulary`), written there.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Iterator

from absl import logging

from elmo_jax import storage
from elmo_jax.data import char_vocabulary, default_corpus, local_corpus, text_files, tfds_corpus, vocab_builder
from elmo_jax.data.sentence_source import SentenceSource
from elmo_jax.formats.vocab_file import Vocab


@dataclasses.dataclass
class TrainingData:
    vocab: Vocab
    train: SentenceSource
    heldout: SentenceSource | None
    description: str
    characters: list[str] | None = None  # the model's own characters (data.characters "corpus"), else None


def check_data(data) -> None:
    """The cheap checks of a `data` section (`data_problems`), for before anything is written.

    Raises:
      ValueError: the first problem, one line naming its `--config.data.KEY`.
    """
    problem = next(data_problems(data), None)
    if problem is not None:
        raise ValueError(problem)


# The TFDS keys and their defaults: another value means nothing without data.tfds_name.
_TFDS_KEYS = {"tfds_data_dir": "", "tfds_train_split": "train", "tfds_heldout_split": "test"}
_STRING_KEYS = ("train_files", "heldout_files", "vocab_file", "tfds_name", *_TFDS_KEYS, "cache_dir")


def data_problems(data) -> Iterator[str]:
    """One line per problem of a config's `data` section that is cheap to see before anything is
    written, each naming its `--config.data.KEY`: keys that contradict each other or are set where
    nothing reads them; globs that match nothing (or only empty files); heldout files that are training
    files too; a vocabulary file that is not one; a TFDS dataset that is not prepared or lacks the
    training split; a cache_dir that is a file or cannot be created. Lazy and in that order, so that a
    later check may assume the earlier keys are well typed."""
    for key in _STRING_KEYS:
        if not isinstance(data[key], str):
            yield f"--config.data.{key}={data[key]!r}: expected a string"
            return
    if data.tfds_name and data.train_files:
        yield "--config.data.tfds_name and --config.data.train_files: set one of them, not both"
    if data.heldout_files and not data.train_files:
        yield (
            f"--config.data.heldout_files={data.heldout_files!r}: read only with --config.data.train_files "
            "(the built-in corpus and a TFDS dataset bring their own heldout set); set both, or neither"
        )
    for key, default in _TFDS_KEYS.items() if not data.tfds_name else ():
        if data[key] != default:
            yield f"--config.data.{key}={data[key]!r}: read only with --config.data.tfds_name; leave it {default!r}"
    globs_match = True
    for key in ("train_files", "heldout_files"):
        if data[key]:
            try:
                text_files.expand_glob(data[key])
            except (ValueError, OSError) as e:
                globs_match = False
                yield f"--config.data.{key}={data[key]!r}: {e}"
    if globs_match and data.train_files and data.heldout_files:
        try:
            local_corpus.split_files(data.train_files, data.heldout_files)
        except ValueError as e:
            yield f"--config.data.heldout_files={data.heldout_files!r}: {e}"
    characters = data.get("characters", "bytes")  # configs saved before the key existed read bytes
    if characters not in char_vocabulary.CHARACTERS:
        yield f"--config.data.characters={characters!r}: expected one of {', '.join(char_vocabulary.CHARACTERS)}"
    if data.vocab_file:
        try:
            Vocab.load(data.vocab_file)
        except (ValueError, OSError) as e:
            yield f"--config.data.vocab_file={data.vocab_file!r}: {e}"
    if data.tfds_name:
        yield from _tfds_problems(data)
    if data.cache_dir:
        yield from _cache_dir_problems(data.cache_dir)


def _cache_dir_problems(cache_dir: str) -> Iterator[str]:
    """The cache_dir is a file, or is not there and cannot be created (its nearest existing ancestor is
    not a writable directory; a bucket that does not exist)."""
    if storage.isfile(cache_dir):
        yield f"--config.data.cache_dir={cache_dir!r}: is a file, expected a directory (created if absent)"
    elif not storage.isdir(cache_dir) and (problem := storage.creation_problem(cache_dir, parents=True)):
        yield f"--config.data.cache_dir={cache_dir!r}: cannot be created ({problem})"


def _tfds_problems(data) -> Iterator[str]:
    """The TFDS dataset is not there, not prepared, or has no such training split."""
    try:
        splits = tfds_corpus.prepared_splits(data.tfds_name, data.tfds_data_dir or None)
    except (ValueError, OSError) as e:
        yield f"--config.data.tfds_name={data.tfds_name!r}: {e}"
        return
    split = data.tfds_train_split
    if tfds_corpus.is_plain_split(split) and split not in splits:
        yield f"--config.data.tfds_train_split={split!r}: {data.tfds_name} has no such split; it has {splits}"


def open_training_data(data, workdir: str, *, write_files: bool = True) -> TrainingData:
    """Resolves the corpus and vocabulary of a config's `data` section.

    Args:
      data: the config's `data` ConfigDict.
      workdir: where the built vocabulary (and, by default, the prepared corpus) go.
      write_files: false on every process but the first (they read what process 0 writes).
    """
    check_data(data)
    cache_dir = data.cache_dir or storage.join(workdir, "data")
    read_options = dict(max_line_chars=data.max_line_chars or None, invalid_utf8=data.invalid_utf8)
    if data.tfds_name:
        data_dir = data.tfds_data_dir or None
        train = tfds_corpus.open_sentences(data.tfds_train_split, tfds_name=data.tfds_name, data_dir=data_dir)
        heldout = _optional_split(data.tfds_heldout_split, tfds_name=data.tfds_name, data_dir=data_dir)
        description = f"TFDS {data.tfds_name}"
        train_files = None
    else:
        if data.train_files:
            train_files, heldout_files = data.train_files, data.heldout_files or None
            description = f"files {train_files}"
        else:
            # Text files the corpus preparation reads: kept on this machine when cache_dir is a bucket.
            local_cache = local_corpus.local_mirror(cache_dir)
            train_files, heldout_files = default_corpus.build_default_corpus(
                os.path.join(local_cache, "default_corpus")
            )
            description = "the embedded default corpus (Python standard library docstrings)"
        corpus = local_corpus.prepare_local_corpus(train_files, heldout_files, cache_dir, **read_options)
        train = local_corpus.open_split(corpus, "train")
        heldout = local_corpus.open_split(corpus, "test") if heldout_files else None
    counted = _Counts(train_files, train, read_options)
    vocab = _resolve_vocab(data, workdir, counted, write_files)
    characters = _resolve_characters(data, workdir, counted, write_files)
    logging.info(
        "corpus: %s; %d training sentences, %s heldout; vocabulary of %d",
        description,
        len(train),
        len(heldout) if heldout is not None else "no",
        len(vocab),
    )
    if characters is not None:
        logging.info("the model's own characters: %d, counted from the training text", len(characters))
    return TrainingData(vocab=vocab, train=train, heldout=heldout, description=description, characters=characters)


def heldout_sentences(
    data,
    workdir: str,
    *,
    files: text_files.Files | None = None,
    tfds_name: str | None = None,
    split: str = "test",
    tfds_data_dir: str | None = None,
):
    """The sentences to evaluate a trained run on (`python -m elmo_jax.evaluate`): the text `files`, the
    `split` of the TFDS dataset `tfds_name`, or else the run's own heldout set (its config's `data`
    section in `workdir`, as `open_training_data` reads it, writing nothing).

    Raises:
      ValueError: both `files` and `tfds_name`, or neither and the run has no heldout set.
    """
    if files and tfds_name:
        raise ValueError("pass --files or --tfds_name, not both")
    if files:
        return [" ".join(tokens) for tokens in text_files.iter_sentences(files)]
    if tfds_name:
        return tfds_corpus.open_sentences(split, tfds_name=tfds_name, data_dir=tfds_data_dir)
    heldout = open_training_data(data, workdir, write_files=False).heldout
    if heldout is None:
        raise ValueError(f"the run in {workdir} has no heldout data; pass --files or --tfds_name")
    return heldout


def _optional_split(split: str, **kwargs) -> SentenceSource | None:
    if not split:
        return None
    try:
        return tfds_corpus.open_sentences(split, **kwargs)
    except (ValueError, KeyError) as e:
        logging.warning("no heldout split %r (%s); evaluating nothing", split, e)
        return None


class _Counts:
    """The training text's word counts, counted once when first asked for (a file corpus in one streaming
    pass, a TFDS dataset sentence by sentence)."""

    def __init__(self, train_files, train: SentenceSource, read_options: dict):
        self.train_files, self.train, self.read_options = train_files, train, read_options
        self._counts = None

    def get(self) -> collections.Counter:
        if self._counts is None:
            if self.train_files is not None:
                self._counts, stats = vocab_builder.count_tokens(self.train_files, **self.read_options)
                logging.info("vocabulary counts: %s", stats.summary())
            else:  # a TFDS dataset without a vocab file: count its sentences
                self._counts = collections.Counter()
                for i in range(len(self.train)):
                    self._counts.update(self.train[i].split())
        return self._counts


def _resolve_vocab(data, workdir: str, counted: _Counts, write_files: bool) -> Vocab:
    if data.vocab_file:
        return Vocab.load(data.vocab_file)
    path = storage.join(workdir, "vocab.txt")
    if storage.exists(path):
        return Vocab.load(path)
    vocab = vocab_builder.build_vocab(counted.get(), min_count=data.min_count, max_size=data.max_vocab_size or None)
    if write_files:
        vocab.save(path)
    return vocab


def _resolve_characters(data, workdir: str, counted: _Counts, write_files: bool) -> list[str] | None:
    """The model's own characters (`data.characters` "corpus"): the workdir's, else counted and written."""
    if data.get("characters", "bytes") != "corpus":
        return None
    path = storage.join(workdir, char_vocabulary.FILE)
    if storage.exists(path):
        return char_vocabulary.read_characters(path)
    characters = char_vocabulary.build_characters(counted.get())
    if write_files:
        char_vocabulary.write_characters(path, characters)
    return characters
