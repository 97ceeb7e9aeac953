"""A log file that only grows (one line per record), local or in a bucket, and a directory of files kept
in step with a place: what a training run's metrics need.

A local log is appended to and flushed per line, so a killed writer keeps every line it wrote; if the
file is deleted or replaced while it is written, the log says so and re-creates it; if it cannot be
written (a full disk, permissions), the log says so once, goes on, retries with every line and counts
what was lost. A bucket cannot be appended to: there the lines are kept in memory and the object is
uploaded whole (so it always holds complete lines), at most every `UPLOAD_EVERY_S` seconds, when a line
asks for it, on `flush` and at the end; a failed upload is retried with the next one, and nothing is
lost unless the process dies first.

`SyncedDirectory`: files another library writes into a directory (TensorBoard's event files): the
place itself when local; for a URL a local temporary directory whose files are uploaded on `sync`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from absl import logging

from elmo_jax.storage import places, publish

UPLOAD_EVERY_S = 10.0


class SyncedDirectory:
    """A local directory standing for `place` (see the module docstring); `sync` uploads its files."""

    def __init__(self, place: str):
        self.place = place
        self.local = place if not places.is_remote(place) else tempfile.mkdtemp(prefix="elmo_jax_sync_")

    def sync(self) -> None:
        """Uploads every file (a URL's local directory); raises what the upload raises."""
        if self.local != self.place:
            for name in sorted(os.listdir(self.local)):
                publish.upload_file(os.path.join(self.local, name), places.join(self.place, name))

    def close(self) -> None:
        if self.local != self.place:
            shutil.rmtree(self.local, ignore_errors=True)


class AppendLog:
    """Lines appended to `path` (see the module docstring); `synced`: a directory uploaded with them.

    Attributes:
      lost: lines that could not be written (counted at `close` in a bucket).
    """

    def __init__(self, path: str, synced: SyncedDirectory | None = None):
        self.path, self.lost = path, 0
        self._synced = synced
        self._failing = False
        self._file = None
        if places.is_remote(path):
            self._data = places.read_bytes(path) if places.exists(path) else b""
            self._uploaded, self._last = len(self._data), 0.0
        else:
            self._data = None
            self._open()

    def write(self, line: str, now: bool = False) -> None:
        """Appends `line` (ending in "\\n"); `now`: in a bucket, upload at once rather than on schedule."""
        if self._data is None:
            self._append(line)
            return
        self._data += line.encode("utf-8")
        if now or time.monotonic() - self._last >= UPLOAD_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Makes every line written so far durable where it goes (locally each write already is; the
        synced directory is synced too)."""
        try:
            if self._data is not None and self._uploaded != len(self._data):
                publish.write_bytes(self.path, self._data)
            if self._synced is not None:
                self._synced.sync()
        except Exception as e:  # the network or the bucket: keep the lines and try again with the next one
            self._report_failure("upload", e)
            return
        self._report_recovery()
        if self._data is not None:
            self._uploaded, self._last = len(self._data), time.monotonic()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
        if self._data is not None:
            self.lost += self._data[self._uploaded :].count(b"\n")
        if self.lost:
            logging.error("%s: %d records could not be written during this run", self.path, self.lost)

    def _append(self, line: str) -> None:
        try:
            if self._file is None or self._replaced():
                self._open()
            self._file.write(line)
            self._file.flush()
        except OSError as e:
            self.lost += 1
            self._report_failure("write", e)
            self._file = None  # reopen on the next line
            return
        self._report_recovery()

    def _report_failure(self, action: str, error: Exception) -> None:
        if self._failing:
            return
        self._failing = True
        if action == "upload":
            logging.error("cannot upload %s (%s): the next upload retries; training goes on", self.path, error)
        else:
            logging.error(
                "cannot write %s (%s): records are lost until it can be written again; training goes on",
                self.path,
                getattr(error, "strerror", None) or error,
            )

    def _report_recovery(self) -> None:
        if self._failing:
            if self._data is not None:
                logging.warning("%s uploaded again", self.path)
            else:
                logging.warning("%s is writable again (%d records were lost)", self.path, self.lost)
            self._failing = False

    def _replaced(self) -> bool:
        """Whether the open file is no longer the one at the path (deleted, or another file put there);
        re-created then, saying so."""
        try:
            same = os.path.samestat(os.fstat(self._file.fileno()), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:
            logging.warning(
                "%s was deleted or replaced while this run was writing it; re-creating it (the records "
                "written before are gone with the old file)",
                self.path,
            )
            self._file.close()
        return not same

    def _open(self) -> None:
        self._file = open(self.path, "a", encoding="utf-8")


def may_lag(path: str) -> bool:
    """Whether lines a killed writer had written to the log `path` may be missing from it: in a bucket
    they reach it with the next upload (at most `UPLOAD_EVERY_S` later, and at every `flush`)."""
    return places.is_remote(path)


def read_lines(path: str) -> bytes:
    """The complete lines of an `AppendLog`'s file (b"" when there is none). A last line cut short (a
    local disk filled mid-write) is removed from the file first, with a warning, so the file stays one
    record per line; an object in a bucket is always uploaded whole."""
    if not places.exists(path):
        return b""
    if places.is_remote(path):
        return places.read_bytes(path)
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            logging.warning(
                "%s: removing its last line, cut short by an interrupted write (%d bytes)", path, len(data) - keep
            )
            f.truncate(keep)
            data = data[:keep]
    return data
