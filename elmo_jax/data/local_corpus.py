"""Local text corpora prepared once as sharded ArrayRecord files: streamed, so memory stays bounded
whatever the corpus size, and read back at random.

    corpus = prepare_local_corpus("corpus/train-*", "corpus/heldout-*", "/data/prepared")
    train = open_split(corpus, "train")          # len(train); train[i] -> "the cat sat ."
    read_stats(corpus)["train"].summary()        # what reading the text files skipped and why

Each kept line of the text files (one whitespace-tokenized sentence per line, read by
`text_files.iter_sentences`) becomes one record: its tokens joined by single spaces, UTF-8, in file
order. Blank, over-long and (optionally) invalid-UTF-8 lines are skipped and counted; the counts are
stored with the corpus. Records go to shard files of about `shard_bytes` each as the lines are read,
so preparation holds one line and one shard's writer at a time, never a split; the batch stream
shuffles, so the writer need not.

On disk, under `data_dir/local_text_corpus/<name>_<fingerprint[:16]>/`:
    manifest.json            format, fingerprint, input files, reading options, and per split its
                             shards (file name, records, bytes of text), sentences and read counts
    train-00000.array_record ...   the "train" split's shards (ArrayRecord, group size 1: one record
    test-00000.array_record  ...   per chunk, which random access needs; uncompressed)
The fingerprint covers the file list, each file's size and modification time, and the reading
options, so re-running with the same files reuses the prepared corpus and any change (a file added,
edited or touched) prepares a new one beside the old one, never a silently stale one; old ones are
left for the user to delete. A corpus is staged in a hidden directory and renamed into place only when
complete (its manifest written last), so a killed preparation leaves nothing that looks prepared; the
next one removes what it left.

A `data_dir` in Cloud Storage (`gs://...`, e.g. a workdir there) holds the same layout, uploaded manifest
last, so a prepared corpus there is complete once its manifest is. ArrayRecord reads one record per
request, which over the network would cost a round trip per sentence, so every process reads a local
copy: the corpus is prepared (by the first process) in this machine's workspace for the bucket
directory (`storage.Workspace`) and uploaded, and a process that finds it in the bucket downloads it into
its own workspace once (`local_mirror`).

Reading needs only the `array_record` package: `ArrayRecordDataSource(paths)` of the shard files in
the manifest's order gives the same records; grain's `MapDataset.source` works on `open_split`'s result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence

from absl import logging
from array_record.python import array_record_data_source

from elmo_jax import storage
from elmo_jax.data import shard_writer, split_shards, text_files
from elmo_jax.data.sentence_source import SentenceSource
from elmo_jax.storage import atomic

FORMAT = "elmo_jax local text corpus, ArrayRecord, version 1"
DIRECTORY = "local_text_corpus"
MANIFEST = "manifest.json"
SPLITS = ("train", "test")  # the split names of the stock lm1b dataset: training and heldout text
SHARD_BYTES = 64 << 20  # text per shard (the 1B Word Benchmark's 4 GB then make ~64 shards, as TFDS writes)
WRITER_OPTIONS = shard_writer.WRITER_OPTIONS
# Helper processes writing shards while the text is read (shard_writer): each holds up to two shards'
# text (~150 MB at SHARD_BYTES), and past 4 the reading, not the writing, is the limit (measured:
# bench/RESULTS.md, "Corpus preparation").
DEFAULT_WRITER_PROCESSES = min(4, os.cpu_count() or 1)
_NAME_RE = re.compile(r"[A-Za-z0-9_]+")


@dataclasses.dataclass(frozen=True)
class Shard:
    """One ArrayRecord file of a split: its name (relative to the corpus directory), records, text bytes."""

    file: str
    records: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class PreparedCorpus:
    """A prepared corpus on disk (what `prepare_local_corpus` returns and `open_split` reads).

    Attributes:
      directory: the corpus directory (`data_dir/local_text_corpus/<name>`).
      name: `<name>_<fingerprint[:16]>`.
      fingerprint: hex digest of the input files and reading options.
      splits: split -> its shards, in record order.
      stats: split -> what reading its text files found.
    """

    directory: str
    name: str
    fingerprint: str
    splits: dict[str, tuple[Shard, ...]]
    stats: dict[str, text_files.ReadStats]

    def sentences(self, split: str) -> int:
        return sum(shard.records for shard in self.splits[split])


def fingerprint(
    train_files: Sequence[str], test_files: Sequence[str], max_line_chars: int | None, invalid_utf8: str
) -> str:
    """Hex digest of everything that decides a prepared corpus's content."""

    # A file's version (modification time, an object's generation) changes whenever it is rewritten;
    # objects in a bucket are read with one listing per directory.
    stats = storage.stat_many([*train_files, *test_files])

    def describe(path: str) -> list:
        return [storage.absolute(path), *stats[path][:2]]

    key = {
        "format": FORMAT,
        "train": [describe(p) for p in train_files],
        "test": [describe(p) for p in test_files],
        "max_line_chars": max_line_chars,
        "invalid_utf8": invalid_utf8,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def prepare_local_corpus(
    train_files: text_files.Files,
    heldout_files: text_files.Files | None,
    data_dir: str | os.PathLike,
    *,
    name: str = "corpus",
    max_line_chars: int | None = text_files.DEFAULT_MAX_LINE_CHARS,
    invalid_utf8: str = "replace",
    shard_bytes: int = SHARD_BYTES,
    log_every_bytes: int = 1 << 30,
    writer_processes: int = DEFAULT_WRITER_PROCESSES,
    local_copies: Mapping[str, str] | None = None,
) -> PreparedCorpus:
    """Writes (once) the ArrayRecord shards of local text files and returns the prepared corpus.

    Args:
      train_files: glob(s) or paths of the training text (split "train").
      heldout_files: glob(s) or paths of the heldout text (split "test", as in lm1b), or None.
      data_dir: where prepared corpora live (created if missing).
      name: readable prefix of the corpus name; letters, digits and "_".
      max_line_chars, invalid_utf8: how lines are read (see `text_files.iter_sentences`).
      shard_bytes: start a new shard after this much text.
      log_every_bytes: log progress (MB read, MB/s) every this many bytes of text written.
      writer_processes: helper processes writing full shards while the text is read (`shard_writer`);
        0 writes every shard in this process. The shards are the same either way.
      local_copies: {input URL: a local file with the same bytes}, read instead of the URL (a caller that
        has just uploaded the text, `lm1b.prepare_lm1b`); the corpus is still that of the URLs (its
        fingerprint and manifest name them).

    Returns:
      The `PreparedCorpus`; an earlier preparation of the same files and options is reused.

    Raises:
      FileNotFoundError, IsADirectoryError, ValueError: bad globs or options (see
        `text_files.expand_glob`), a bad `name`, a file in both splits, or a split without any sentence.
      OSError: the corpus could not be written (nothing partial is left under its name).

    With several hosts, prepare on one (e.g. process 0, then a barrier) before the others read; two
    preparing at once each write their own staging directory and the second rename gives way to the first.
    """
    _check_options(name, max_line_chars, invalid_utf8, shard_bytes, writer_processes)
    train, test = split_files(train_files, heldout_files)
    digest = fingerprint(train, test, max_line_chars, invalid_utf8)
    # A data_dir in a bucket: prepared (or downloaded) on this machine, in its workspace, and uploaded.
    workspace = storage.Workspace(os.fspath(data_dir), "corpora")
    relative = f"{DIRECTORY}/{name}_{digest[:16]}"
    options = _SplitOptions(max_line_chars, invalid_utf8, shard_bytes, log_every_bytes, writer_processes)
    return _reuse_or_prepare(workspace, relative, digest, {"train": train, "test": test}, options, local_copies)


@dataclasses.dataclass(frozen=True)
class _SplitOptions:
    """How a split's text files are read and its shards written (`prepare_local_corpus`'s arguments)."""

    max_line_chars: int | None
    invalid_utf8: str
    shard_bytes: int
    log_every_bytes: int
    writer_processes: int


def _check_options(
    name: object, max_line_chars: object, invalid_utf8: object, shard_bytes: object, writer_processes: object
) -> None:
    """Raises ValueError naming the first of `prepare_local_corpus`'s options that is not valid."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"name={name!r}: expected letters, digits and '_' only")
    text_files.check_read_options(max_line_chars, invalid_utf8)
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise ValueError(f"shard_bytes={shard_bytes!r}: expected a positive int")
    if isinstance(writer_processes, bool) or not isinstance(writer_processes, int) or writer_processes < 0:
        raise ValueError(f"writer_processes={writer_processes!r}: expected an int >= 0")


def split_files(
    train_files: text_files.Files, heldout_files: text_files.Files | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The absolute paths of the train and the heldout ("test") files; ValueError if a file is in both."""
    train = tuple(map(storage.absolute, text_files.expand_glob(train_files)))
    test = tuple(map(storage.absolute, text_files.expand_glob(heldout_files))) if heldout_files else ()
    both = sorted(set(map(storage.real, train)) & set(map(storage.real, test)))
    if both:  # heldout perplexity on training text would look far better than it is
        raise ValueError(f"{len(both)} file(s) are in both the train and the heldout files: {', '.join(both[:5])}")
    return train, test


def _reuse_or_prepare(
    workspace: storage.Workspace,
    relative: str,
    digest: str,
    files: dict[str, tuple[str, ...]],
    options: _SplitOptions,
    local_copies: Mapping[str, str] | None,
) -> PreparedCorpus:
    """The corpus at `relative` in `workspace`: reused when it is complete on this machine, downloaded
    when another machine published it, else prepared here (`_prepare`); then published if it was not."""
    directory = workspace.local_path(*relative.split("/"))
    corpus = _reusable(directory, digest)
    published = workspace.published(relative, MANIFEST)
    if corpus is None and published:  # prepared by another machine: downloaded (nothing to do locally)
        workspace.fetch(relative)
        corpus = _reusable(directory, digest)
        logging.info("downloaded the prepared corpus %s to %s", workspace.place_path(relative), directory)
    if corpus is not None:
        _log_stats(corpus, "reusing")
    else:
        corpus = _prepare(directory, digest, files, options, local_copies)
        _log_stats(corpus, "prepared")
    if not published:
        workspace.publish(relative, last=MANIFEST)
    return corpus


def _prepare(
    directory: str,
    digest: str,
    files: dict[str, tuple[str, ...]],
    options: _SplitOptions,
    local_copies: Mapping[str, str] | None,
) -> PreparedCorpus:
    """Writes the corpus of `files` ({split: paths}, a split without files left out) into `directory`.

    The shards and the manifest (last) go to a staging directory renamed into place when complete.
    """
    manifest = {
        "format": FORMAT,
        "fingerprint": digest,
        "options": {
            "max_line_chars": options.max_line_chars,
            "invalid_utf8": options.invalid_utf8,
            "writer": WRITER_OPTIONS,
        },
        "files": {split: list(paths) for split, paths in files.items()},
        "splits": {},
    }

    def fill(staging: str) -> None:
        for split, paths in files.items():
            if paths:
                readable = [(local_copies or {}).get(path, path) for path in paths]
                manifest["splits"][split] = _write_split(staging, split, readable, options)
        atomic.write_text(os.path.join(staging, MANIFEST), json.dumps(manifest, indent=1) + "\n")

    os.makedirs(os.path.dirname(directory), exist_ok=True)
    # Two processes preparing at once: the second gives way to the first's complete copy.
    atomic.publish_directory(directory, fill, existing="keep", accept=lambda d: _reusable(d, digest) is not None)
    return load_prepared(directory)


def local_mirror(data_dir: str) -> str:
    """The local directory where this machine keeps the corpora it prepares for `data_dir` (and reads):
    `data_dir` itself when local; for a bucket directory this machine's workspace for it."""
    return storage.Workspace(data_dir, "corpora").local


def _reusable(directory: str, digest: str) -> PreparedCorpus | None:
    """The complete corpus in `directory`, or None. A damaged one (a shard or the manifest missing or
    unreadable, e.g. deleted by hand) is reported and removed, so that it is prepared again."""
    if not os.path.exists(directory):
        return None
    try:
        corpus = load_prepared(directory)
        if corpus.fingerprint != digest:
            raise ValueError(f"its fingerprint is {corpus.fingerprint}, expected {digest}")
        return corpus
    except (OSError, ValueError, KeyError, TypeError) as e:
        logging.warning("%s is not a complete prepared corpus (%s); preparing it again", directory, e)
        shutil.rmtree(directory)
        return None


def _write_split(staging: str, split: str, files: Sequence[str], options: _SplitOptions) -> dict:
    """Streams the sentences of `files` into shards `<split>-NNNNN.array_record`; returns the manifest entry.

    The shards are cut and written by `split_shards.write_shards` (see there: they depend on the text and
    `shard_bytes` only).
    """
    stats = text_files.ReadStats()
    blocks = text_files.iter_record_blocks(
        files, max_line_chars=options.max_line_chars, invalid_utf8=options.invalid_utf8, stats=stats
    )
    shards = split_shards.write_shards(
        blocks,
        staging,
        split,
        shard_bytes=options.shard_bytes,
        log_every_bytes=options.log_every_bytes,
        writer_processes=options.writer_processes,
    )
    if stats.sentences == 0:
        raise ValueError(f"split {split!r} has no sentences: {stats.summary()}")
    return {"shards": shards, "sentences": stats.sentences, "read_stats": stats.to_dict()}


def load_prepared(directory: str | os.PathLike) -> PreparedCorpus:
    """The prepared corpus in `directory` (its manifest), checking that every shard is there.

    Raises FileNotFoundError or ValueError naming the directory when it holds no complete corpus.
    """
    directory = os.fspath(directory)
    path = os.path.join(directory, "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{directory}: no prepared corpus (no manifest.json)") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a prepared corpus manifest ({e})") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    splits, stats = {}, {}
    for split, entry in manifest["splits"].items():
        splits[split] = tuple(Shard(**shard) for shard in entry["shards"])
        stats[split] = text_files.ReadStats(**entry["read_stats"])
        for shard in splits[split]:
            if not os.path.isfile(os.path.join(directory, shard.file)):
                raise FileNotFoundError(f"{directory}: shard {shard.file} of split {split!r} is missing")
    return PreparedCorpus(
        directory=directory,
        name=os.path.basename(directory),
        fingerprint=manifest["fingerprint"],
        splits=splits,
        stats=stats,
    )


def read_stats(corpus: PreparedCorpus) -> dict[str, text_files.ReadStats]:
    """Split -> what reading its text files found (blank, over-long, invalid-UTF-8 lines, ...)."""
    return dict(corpus.stats)


@dataclasses.dataclass(frozen=True)
class _FileInstruction:
    """A whole shard for `ArrayRecordDataSource`, with its record count from the manifest (no file is
    opened to count it)."""

    filename: str
    skip: int
    take: int
    examples_in_shard: int


def open_split(corpus: PreparedCorpus, split: str) -> SentenceSource:
    """Random access to one split's sentences: `len(src)`, `src[i] -> str`, `src.__getitems__(ids)`.

    Raises ValueError naming the splits there are when `split` is not one of them.
    """
    if split not in corpus.splits:
        raise ValueError(f"{corpus.name} has no split {split!r}; it has {sorted(corpus.splits)}")
    shards = [
        _FileInstruction(os.path.join(corpus.directory, s.file), 0, s.records, s.records) for s in corpus.splits[split]
    ]
    source = array_record_data_source.ArrayRecordDataSource(shards)
    return SentenceSource(source, name=f"{corpus.name}[{split}]", text_key=None)


def _log_stats(corpus: PreparedCorpus, what: str) -> None:
    for split, stats in corpus.stats.items():
        logging.info("%s %s %s (%d shards): %s", what, corpus.name, split, len(corpus.splits[split]), stats.summary())
