"""A split's records cut into ArrayRecord shards as they are read, for `local_corpus`.

    entries = write_shards(blocks, staging, "train", shard_bytes=64 << 20, log_every_bytes=1 << 30,
                           writer_processes=4)   # [{"file": "train-00000.array_record", "records", "bytes"}]

A shard ends after the record that brings its text to `shard_bytes` or more, so the shards depend on the
text and `shard_bytes` only. Full shards go to `writer_processes` helper processes (`shard_writer`,
started once a first shard is full, so a small split never starts one) while the text is read on; the
last shard, or every shard with `writer_processes=0`, is written in this process. One shard's text is
held at a time here (and up to two in each helper).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable

from elmo_jax.data import shard_writer
from elmo_jax.runtime.progress import Progress


def write_shards(
    blocks: Iterable[bytes],
    staging: str,
    split: str,
    *,
    shard_bytes: int,
    log_every_bytes: int,
    writer_processes: int,
) -> list[dict]:
    """Writes the records of `blocks` to shards `<split>-NNNNN.array_record` in `staging`.

    Args:
      blocks: blocks of records, each record followed by b"\\n" (`text_files.iter_record_blocks`).
      staging: the directory the shards are written to.
      split: the split's name, the shard files' prefix.
      shard_bytes: start a new shard after this much text.
      log_every_bytes: log progress (MB written, MB/s) every this many bytes of text.
      writer_processes: helper processes writing full shards; 0 writes every shard in this process.

    Returns:
      The shards' manifest entries, in record order: {"file", "records", "bytes" (of text, without the
      b"\\n"s)}.
    """
    shards: list[dict] = []
    shard = _Shard()
    progress = Progress({"bytes": None}, every=log_every_bytes, log=True)
    with shard_writer.ShardProcesses(writer_processes) as helpers:
        for block in blocks:
            # Most blocks fit in the current shard whole; a block where the shard fills is cut at the record.
            while block:
                block = shard.add(block, shard_bytes)
                if shard.written < shard_bytes:
                    continue
                shards.append(_write_full_shard(staging, split, len(shards), shard, helpers, writer_processes))
                shard = _Shard()
                _counted(progress, split, shards)
        if shard.records:
            entry = _shard_entry(split, len(shards), shard)
            shard_writer.write_shard(os.path.join(staging, entry["file"]), b"".join(shard.blocks))
            shards.append(entry)
    return shards


class _Shard:
    """The text of the shard being filled: blocks of records (`text_files.iter_record_blocks`)."""

    def __init__(self):
        self.blocks: list[bytes] = []
        self.records = self.written = 0  # records, and their bytes without the b"\n"s

    def add(self, block: bytes, shard_bytes: int) -> bytes:
        """Takes the records of `block` until the shard holds `shard_bytes` of text; returns the rest."""
        records = block.count(b"\n")
        size = len(block) - records
        if self.written + size >= shard_bytes:  # the shard fills within this block: find the record
            lines = block.split(b"\n")
            lengths = itertools.accumulate(map(len, lines), initial=self.written)
            records = next(i for i, written in enumerate(lengths) if written >= shard_bytes)
            cut = sum(map(len, lines[:records])) + records  # the bytes of those records and their b"\n"s
            block, rest = block[:cut], block[cut:]
            size = cut - records
        else:
            rest = b""
        self.blocks.append(block)
        self.records += records
        self.written += size
        return rest

    def take_text(self) -> bytes:
        """The shard's text (its blocks joined), its blocks released."""
        text = b"".join(self.blocks)
        self.blocks = []
        return text


def _write_full_shard(
    staging: str, split: str, index: int, shard: _Shard, helpers: shard_writer.ShardProcesses, writer_processes: int
) -> dict:
    """Writes `shard` (by a helper process when `writer_processes > 0`); returns its manifest entry."""
    entry = _shard_entry(split, index, shard)
    # Its blocks are released once joined, so that only one copy of the shard's text is held while a
    # helper is awaited.
    text = shard.take_text()
    path = os.path.join(staging, entry["file"])
    if writer_processes > 0:
        helpers.submit(path, text, entry["records"])
    else:
        shard_writer.write_shard(path, text)
    return entry


def _shard_entry(split: str, index: int, shard: _Shard) -> dict:
    return {"file": f"{split}-{index:05d}.array_record", "records": shard.records, "bytes": shard.written}


def _counted(progress: Progress, split: str, shards: list[dict]) -> None:
    """Counts the last shard's text; logs the split's so far (MB, shards, MB/s) at each `log_every_bytes`."""
    progress.add(bytes=shards[-1]["bytes"])
    if progress.due():
        megabytes, rate = progress.done["bytes"] / 1e6, progress.rate() / 1e6
        progress.write(f"{split}: {megabytes:.0f} MB of text in {len(shards)} shards ({rate:.1f} MB/s)")
