"""The 1B Word Benchmark (TFDS's `lm1b`) as a local corpus: download, extract, prepare in bounded memory.

    corpus = prepare_lm1b("/data/lm1b")              # ~1.7 GB download, ~4.2 GB of text, then the shards
    train_glob, heldout_glob = text_globs("/data/lm1b")

The splits are TFDS's: "train" is the 99 files of `training-monolingual.tokenized.shuffled`, "test" the
50 of `heldout-monolingual.tokenized.shuffled` (bilm-tf evaluates on these too). The text is the
same; where TFDS stores each line `strip()`-ed in an order shuffled by key, here each line's tokens
are joined by single spaces (the 1B Word files are already single-spaced) in file order, which the
batch stream shuffles anyway.

Everything is written under `data_dir`:
    downloads/1-billion-word-language-modeling-benchmark-r13output.tar.gz   the archive (kept)
    lm1b/1-billion-word-language-modeling-benchmark-r13output/...            the extracted text files
    local_text_corpus/corpus_<fingerprint>/                                  the ArrayRecord shards
Each step is skipped when its result is already complete, and each appears under its name only once
complete (staged under a hidden name, then renamed). The archive is downloaded by `formats.download`:
resumed from its `.part` after a broken connection (in the same call, or the next run), retried by kind of
failure, and, under statmt.org's file name, checked against the size and SHA-256 TFDS publishes for it. A
training run finds the prepared shards when its `data.train_files`, `data.heldout_files` and
`data.cache_dir` are `text_globs(data_dir)` and `data_dir` and its reading options are the same
(`configs/bilm_large.py:DATA_DIR` sets them).

A `data_dir` in Cloud Storage (`gs://BUCKET/DIR`) gets the same layout but the archive: the work is done
on local disk, in this machine's workspace for the bucket directory (`storage.Workspace`, under $TMPDIR,
where its prepared corpora are kept too), and the text files and the prepared corpus are uploaded, the
corpus's manifest last (it is complete once that is there). The text files are not one object: until the
command has finished, the bucket may hold some of them, so start training only after it (re-running
completes an interrupted one).
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import urllib.parse

from absl import logging

from elmo_jax import storage
from elmo_jax.data import local_corpus
from elmo_jax.formats import download as transfer
from elmo_jax.storage import atomic

URL = "http://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz"
TOP_DIR = "1-billion-word-language-modeling-benchmark-r13output"
ARCHIVE = f"{TOP_DIR}.tar.gz"
# The archive's size and SHA-256 as TFDS records them for the URL above: a download of a file by this name
# (from statmt.org or a mirror) must have them.
ARCHIVE_BYTES, ARCHIVE_SHA256 = 1_792_209_805, "01ba60381110baf7f189dfd2b8374de371e8c9a340835793f190bdae9e90a34e"
ARCHIVE_SOURCE = (
    "TFDS's checksums, https://github.com/tensorflow/datasets/blob/master/"
    "tensorflow_datasets/datasets/lm1b/checksums.tsv"
)
TRAIN_DIR, HELDOUT_DIR = "training-monolingual.tokenized.shuffled", "heldout-monolingual.tokenized.shuffled"
TRAIN_FILES, HELDOUT_FILES = 99, 50  # news.en-00001..00099-of-00100, news.en.heldout-00000..00049-of-00050
# The archive members that make the splits; nothing else in it is extracted.
_MEMBER_RE = re.compile(
    rf"(?:\./)?{re.escape(TOP_DIR)}/(?:{TRAIN_DIR}/news\.en-\d{{5}}-of-00100|{HELDOUT_DIR}/news\.en\.heldout-\d{{5}}-of-00050)"
)
_CHUNK = 1 << 20


def text_globs(data_dir: str | os.PathLike) -> tuple[str, str]:
    """(train, heldout) globs of the extracted text files under `data_dir`."""
    top = storage.join(storage.absolute(data_dir), "lm1b", TOP_DIR)  # also gs://BUCKET/DIR (a copy)
    return storage.join(top, TRAIN_DIR, "news.en-*"), storage.join(top, HELDOUT_DIR, "news.en.heldout-*")


def prepare_lm1b(
    data_dir: str | os.PathLike,
    *,
    source: str = URL,
    max_line_chars: int | None = 100_000,
    invalid_utf8: str = "replace",
) -> local_corpus.PreparedCorpus:
    """Downloads (unless done), extracts (unless done) and prepares (unless done) the 1B Word Benchmark.

    Args:
      data_dir: where everything goes (created if missing).
      source: the archive: a URL (default: statmt.org's) or the path of a downloaded copy.
      max_line_chars, invalid_utf8: how lines are read; a training run reuses the prepared shards only
        with the same values as its `data.max_line_chars` and `data.invalid_utf8` (configs/default.py's
        are the defaults here).

    Returns:
      The prepared corpus ("train" and "test" splits).

    Raises:
      OSError: a download, extraction or write failed (nothing partial is left under a final name).
      ValueError: the archive lacks some of the expected text files.
    """
    data_dir = storage.absolute(data_dir)
    # A data_dir in a bucket: the work happens in this machine's workspace for it, and is uploaded.
    workspace = storage.Workspace(data_dir, "corpora")
    os.makedirs(workspace.local, exist_ok=True)
    train, heldout = text_globs(data_dir)
    top, relative_top = storage.dirname(storage.dirname(train)), f"lm1b/{TOP_DIR}"
    present = storage.listing(top)
    local_copies = None
    if not set(_text_file_names()) <= set(present):
        local_top = workspace.local_path("lm1b", TOP_DIR)
        if not os.path.isdir(local_top):
            downloads = workspace.local_path("downloads")
            archive = source if os.path.exists(source) else download(source, downloads)
            extract(archive, os.path.dirname(local_top))
        local_copies = {}
        for name in _text_file_names():
            local = os.path.join(local_top, *name.split("/"))
            if present.get(name, (None,))[0] != os.path.getsize(local):  # an object is complete or absent
                workspace.publish_file(f"{relative_top}/{name}")
            local_copies[storage.join(top, name)] = local
    return local_corpus.prepare_local_corpus(
        train, heldout, data_dir, local_copies=local_copies, max_line_chars=max_line_chars, invalid_utf8=invalid_utf8
    )


def _text_file_names() -> list[str]:
    """The split files' names relative to TOP_DIR, "<split directory>/<file>"."""
    train = [f"{TRAIN_DIR}/news.en-{i:05d}-of-00100" for i in range(1, TRAIN_FILES + 1)]
    return train + [f"{HELDOUT_DIR}/news.en.heldout-{i:05d}-of-00050" for i in range(HELDOUT_FILES)]


def download(url: str, directory: str) -> str:
    """The archive at `url` saved in `directory` (reused when already there); returns its path.

    Downloaded by `formats.download` (progress in the log every 30 s): through `NAME.part`, resumed after a
    broken connection, renamed when complete and checked (`ARCHIVE`: TFDS's size and SHA-256; another name:
    the server's size). Two processes downloading into `directory` take turns.

    Raises:
      formats.download's AddressError, DiskError, NetworkError, ServerError (all OSError): what failed,
        and where the part that the next run resumes from is kept.
    """
    os.makedirs(directory, exist_ok=True)
    name = os.path.basename(urllib.parse.urlsplit(url).path.rstrip("/")) or "download"
    path = os.path.join(directory, name)
    with transfer.locked(directory):
        if os.path.exists(path):  # downloaded before, or by the process this one waited for
            return path
        atomic.remove_stale_staging(path, log=logging.info)  # what an earlier version left while downloading
        published = {
            "expected_bytes": ARCHIVE_BYTES,
            "expected_sha256": ARCHIVE_SHA256,
            "checksum_source": ARCHIVE_SOURCE,
        }
        report = transfer.Report(name, log=True)
        transfer.download(url, path, progress=report, waiting=report.waiting, **(published if name == ARCHIVE else {}))
    return path


def extract(archive: str, directory: str) -> str:
    """Extracts the training and heldout text files of the archive into `directory/TOP_DIR`, reading the
    archive as a stream (bounded memory); returns that directory.

    Only members named like the benchmark's text files are written (never a path outside `directory`),
    with their modification times from the archive. The directory appears only once all are extracted.
    """
    os.makedirs(directory, exist_ok=True)
    counts = {TRAIN_DIR: 0, HELDOUT_DIR: 0}

    def fill(staging: str) -> None:
        with tarfile.open(archive, mode="r|*") as tar:
            for member in tar:
                if not (member.isfile() and _MEMBER_RE.fullmatch(member.name)):
                    continue
                part, name = member.name.split("/")[-2:]
                os.makedirs(os.path.join(staging, part), exist_ok=True)
                target = os.path.join(staging, part, name)
                with tar.extractfile(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)
                os.utime(target, (member.mtime, member.mtime))
                counts[part] += 1
                logging.info("extracted %s (%.0f MB)", member.name, member.size / 1e6)
        if counts[TRAIN_DIR] != TRAIN_FILES or counts[HELDOUT_DIR] != HELDOUT_FILES:
            raise ValueError(
                f"{archive}: found {counts[TRAIN_DIR]} training and {counts[HELDOUT_DIR]} heldout text files "
                f"under {TOP_DIR}/, expected {TRAIN_FILES} and {HELDOUT_FILES}; is it the 1B Word Benchmark archive?"
            )

    # Another process extracting the same archive at once: its complete copy is kept.
    return atomic.publish_directory(os.path.join(directory, TOP_DIR), fill, existing="keep")


def location(data_dir: str | os.PathLike, corpus: local_corpus.PreparedCorpus) -> str:
    """Where `prepare_lm1b(data_dir)` put `corpus`: its directory, and this machine's copy when that is
    elsewhere (a bucket directory's)."""
    place = storage.join(storage.absolute(data_dir), local_corpus.DIRECTORY, corpus.name)
    return place if place == corpus.directory else f"{place} (and its local copy {corpus.directory})"


def summary(corpus: local_corpus.PreparedCorpus) -> str:
    """One line per split: sentences, shards, and what reading skipped."""
    stats = local_corpus.read_stats(corpus)
    return "\n".join(
        f"{split}: {corpus.sentences(split):,} sentences in {len(corpus.splits[split])} shards; "
        f"{stats[split].summary()}"
        for split in corpus.splits
    )


def report(data_dir: str, corpus: local_corpus.PreparedCorpus) -> str:
    """What `python -m elmo_jax.prepare_lm1b` prints once `prepare_lm1b(data_dir)` returned `corpus`: the
    `summary`, where the corpus is (in a bucket: there, and its local copy) and the training flags that
    read it."""
    train, heldout = text_globs(data_dir)
    return (
        f"{summary(corpus)}\nprepared in {location(data_dir, corpus)}\n"
        f"train with: elmo-train --config=bilm_large:{data_dir} --workdir=WORKDIR (in a clone: python train.py "
        f"--config=configs/bilm_large.py:{data_dir})\n"
        f"or, with another config: --config.data.train_files='{train}' --config.data.heldout_files='{heldout}' "
        f"--config.data.cache_dir={data_dir}"
    )
