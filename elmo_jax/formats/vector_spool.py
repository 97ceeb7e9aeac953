"""The vectors `embed_file` has computed so far, kept so that an interrupted run continues where it stopped.

A run works in the staging directory of its output (`atomic.temporary_directory`:
`.NAME.HOST.PID.RANDOM.tmp/` next to the output), which holds

    run.json        what the run is: the input (size, SHA-256), the options that decide the vectors, the
                    model's digest and this process's share of the lines (`identity`)
    vectors.bin     every finished piece's vectors as raw float bytes, appended a batch at a time
    journal.jsonl   one line per appended batch: its pieces [line, offset, tokens], its byte range in
                    vectors.bin and the CRC-32 of those bytes
    output.hdf5     the final file, built from the above at the end, then renamed onto the output

Vectors are written before their journal line, and both are handed to the OS after every batch (so a
killed process loses nothing written) and flushed to the disk every `SYNC_SECONDS` and at the end (so a
power cut loses at most that much). A journal line counts only if it is complete and the bytes it names
are in vectors.bin with the same CRC: anything after the first line that does not is cut off when the
spool is opened again, so a kill at any instant leaves a usable spool. The HDF5 file is never trusted
after a kill (HDF5 is not crash-safe): it is rebuilt from the spool.

`adopt` implements the stale-staging rule for resumable outputs: a staging directory whose writer no
longer runs on this host (`atomic.stale_staging`) is taken over, by renaming it to a staging name
of this process, when its run.json equals this run's identity; otherwise the reason is logged and the
directory is left for `atomic.remove_stale_staging`, which removes it as for any other output.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import zlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from elmo_jax.storage import atomic

FORMAT = "elmo-jax embed_file spool/1"
RUN, VECTORS, JOURNAL, OUTPUT = "run.json", "vectors.bin", "journal.jsonl", "output.hdf5"
SYNC_SECONDS = 10.0


class Spool:
    """An open spool in a staging directory (`create` or `open`); `append` adds a batch of pieces.

    `shown` names the output in errors (--output=...): a failed write (a full disk) raises OSError naming
    it and the spool.
    """

    def __init__(self, directory: str, identity: dict, shown: str = "the output"):
        self.directory, self.identity, self.shown = directory, identity, shown
        self.pieces = _PieceIndex()  # every piece in the spool, recovered ones included
        self._data = self._journal = None
        self._size = 0
        self._synced = time.monotonic()

    @classmethod
    def create(cls, directory: str, identity: dict, shown: str = "the output") -> Spool:
        """A new, empty spool in `directory` (an empty staging directory)."""
        spool = cls(directory, identity, shown)
        with spool._writing():
            _write_json(os.path.join(directory, RUN), {"format": FORMAT, **identity})
            spool._data = open(os.path.join(directory, VECTORS), "wb")
            spool._journal = open(os.path.join(directory, JOURNAL), "wb")
        return spool

    @classmethod
    def open(cls, directory: str, identity: dict, shown: str = "the output") -> Spool:
        """The spool of an earlier run with this identity, its trustworthy part kept, open for appending."""
        spool = cls(directory, identity, shown)
        data_path, journal_path = os.path.join(directory, VECTORS), os.path.join(directory, JOURNAL)
        good_bytes, good_data = 0, 0
        with open(journal_path, "rb") as journal, open(data_path, "rb") as data:
            for raw in journal:
                record = _parse(raw)
                if record is None or record["at"] != good_data:
                    break
                data.seek(record["at"])
                block = data.read(record["bytes"])
                if len(block) != record["bytes"] or zlib.crc32(block) != record["crc"]:
                    break
                spool.pieces.add(record["pieces"], record["at"], record["sizes"])
                good_bytes += len(raw)
                good_data += record["bytes"]
        for path, size in ((journal_path, good_bytes), (data_path, good_data)):
            with open(path, "r+b") as f:
                f.truncate(size)
        _remove(os.path.join(directory, OUTPUT))  # a half-built final file from a kill during the merge
        spool._data, spool._journal = open(data_path, "ab"), open(journal_path, "ab")
        spool._size = good_data
        return spool

    def append(self, pieces: Sequence[tuple[int, int, int]], arrays: Sequence[np.ndarray]) -> None:
        """Adds one batch: `pieces[i]` = (line, offset, tokens) whose vectors are `arrays[i]`."""
        crc, sizes = 0, []
        with self._writing():
            for array in arrays:  # one copy at most (a strided slice of a batch), then straight to the file
                block = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
                crc = zlib.crc32(block, crc)
                self._data.write(block)
                sizes.append(block.nbytes)
            self._data.flush()
            total = sum(sizes)
            record = {"at": self._size, "bytes": total, "crc": crc, "pieces": pieces, "sizes": sizes}
            self._journal.write((json.dumps(record, separators=(",", ":")) + "\n").encode())
            self._journal.flush()
        self.pieces.add(pieces, self._size, sizes)
        self._size += total
        if time.monotonic() - self._synced > SYNC_SECONDS:
            self.sync()

    def sync(self) -> None:
        """Flushes what was appended to the disk (vectors first)."""
        with self._writing():
            for f in (self._data, self._journal):
                if f is not None and not f.closed:
                    f.flush()
                    os.fsync(f.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        """Closes the files (after `sync` to keep what they hold; a failing flush does not stop the close)."""
        for f in (self._data, self._journal):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:  # a full disk: the buffered tail is lost, the journal's CRCs tell
                    pass

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """An OSError of the spool's files (a full disk) names the output and the spool."""
        try:
            yield
        except OSError as e:
            error = OSError(f"{self.shown}: writing the spool of finished vectors in {self.directory} failed ({e})")
            error.errno = e.errno
            raise error from None

    def reader(self) -> SpoolReader:
        """The spool's pieces for reading back (after `sync`)."""
        return SpoolReader(os.path.join(self.directory, VECTORS), self.pieces.sorted())


class _PieceIndex:
    """(line, offset, tokens, byte position, byte size) of every piece, in NumPy arrays (28 bytes each)."""

    def __init__(self):
        self._chunks: list[np.ndarray] = []

    def add(self, pieces, at: int, sizes) -> None:
        if not pieces:
            return
        table = np.zeros((len(pieces), 5), np.int64)
        table[:, :3] = np.asarray(pieces, np.int64).reshape(-1, 3)
        table[:, 4] = sizes
        table[:, 3] = at + np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self._chunks.append(table)

    def __len__(self) -> int:
        return sum(len(c) for c in self._chunks)

    def lines(self) -> np.ndarray:
        """The distinct lines with at least one piece."""
        return np.unique(np.concatenate([c[:, 0] for c in self._chunks])) if self._chunks else np.zeros(0, np.int64)

    def sorted(self) -> np.ndarray:
        table = np.concatenate(self._chunks) if self._chunks else np.zeros((0, 5), np.int64)
        return table[np.lexsort((table[:, 1], table[:, 0]))]


class SpoolReader:
    """Reads the pieces of a spool back line by line, in increasing line order."""

    def __init__(self, path: str, table: np.ndarray):
        self.table = table  # sorted by (line, offset)
        self._data = np.memmap(path, np.uint8, mode="r") if os.path.getsize(path) else np.zeros(0, np.uint8)
        self._cursor = 0

    def pieces(self, line: int) -> list[tuple[int, int, np.ndarray]]:
        """(offset, tokens, raw bytes as uint8) of each piece of `line`; lines must be asked in order."""
        table, found = self.table, []
        while self._cursor < len(table) and table[self._cursor, 0] < line:
            self._cursor += 1
        while self._cursor < len(table) and table[self._cursor, 0] == line:
            _, offset, n, at, size = (int(v) for v in table[self._cursor])
            found.append((offset, n, self._data[at : at + size]))
            self._cursor += 1
        return found


def identity_mismatch(found: dict, expected: dict) -> str | None:
    """Why a spool's run.json does not belong to this run, in words; None when it does."""
    if found.get("format") != FORMAT:
        return f"it was written by another version ({found.get('format')!r})"
    for key, value in expected.items():
        if found.get(key) != value:
            return _difference(key, found.get(key), value)
    return None


def _difference(key: str, was, now) -> str:
    if key == "input":
        return "the input file changed since (its size or SHA-256 differs)"
    if key == "model":
        return "the model differs (its weights' digest)"
    if key == "options" and isinstance(was, dict) and isinstance(now, dict):
        changed = [f"--{k} was {was.get(k)!r}, now {now.get(k)!r}" for k in sorted(now) if was.get(k) != now.get(k)]
        return "the arguments changed: " + "; ".join(changed)
    return f"its {key} was {was!r}, this run's is {now!r}"


def adopt(target: str, identity: dict, log: Callable[[str], object]) -> tuple[str, int] | None:
    """Takes over a killed run's staging directory of `target` whose run.json matches `identity`.

    Returns:
      (the directory, now under a staging name of this process; the dead writer's pid), or None.
      Mismatching ones are logged with the reason and left to `atomic.remove_stale_staging`.
    """
    for staging, pid in atomic.stale_staging(target):
        if not os.path.isdir(staging) or os.path.islink(staging):
            continue
        try:
            with open(os.path.join(staging, RUN), encoding="utf-8") as f:
                found = json.load(f)
            reason = identity_mismatch(found, identity) if isinstance(found, dict) else "its run.json is not an object"
        except (OSError, ValueError) as e:
            reason = f"its progress record is unreadable ({e})"
        if reason is not None:
            log(f"not resuming from {staging} (left by pid {pid}): {reason}; starting over")
            continue
        mine = atomic.temporary_directory(target)
        try:
            os.rename(staging, mine)  # onto the new, empty directory: atomic, and only one process wins
        except OSError:
            os.rmdir(mine)
            continue
        return mine, pid
    return None


def remove(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def _parse(raw: bytes) -> dict | None:
    if not raw.endswith(b"\n"):
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    keys = {"at", "bytes", "crc", "pieces", "sizes"}
    if not isinstance(record, dict) or set(record) != keys or len(record["pieces"]) != len(record["sizes"]):
        return None
    return record


def _write_json(path: str, value: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
