"""Downloading one file over HTTP(S): resumable, verified, and renamed into place only when complete.

    report = Report("weights.hdf5")   # progress lines on standard error (log=True: absl's log)
    size, sha256 = download(url, "cache/weights.hdf5", expected_bytes=..., expected_sha256=...,
                            progress=report, waiting=report.waiting)

Bytes go to `TARGET.part`. A connection that breaks mid-file (or a process killed mid-file) leaves the
part on disk, and the next attempt, in this call or a later one, asks the server for the rest with an
HTTP `Range` request (a server that ignores it sends the whole file again, which is then written from
the start). When every byte is there, the size and SHA-256 are checked against what is expected, and
only then is the part flushed and renamed to TARGET: a reader sees no file or the complete, checked one.
A file that fails its check is deleted, so the next attempt starts afresh. The transfer is the standard
library's (urllib), which reads a `file://` address (a local mirror) the same way, from the start each
time. Two processes downloading into one place take turns with `locked` (a `filelock.FileLock`: `flock`
on POSIX, `msvcrt.locking` on Windows).

A failure is classified where it happens, and only the kinds another try can cure are retried:

  AddressError  the address is not an http(s) or file:// URL: refused before any connection.
  DiskError     the part could not be written (disk full, quota, read-only, permissions): never retried;
                on a full disk the part is deleted, since it holds the space that is missing.
  NetworkError  refused, reset or cut connections (`attempts` tries, resuming), or a server silent for
                `SILENCE_S` in all (one deadline over every reconnection, with a word every `WAIT_NOTE_S`).
  ServerError   an answer that is final: HTTP 4xx, other bytes than asked for, a file that fails its size
                or checksum (deleted), HTTP 5xx still after `attempts` tries, or a file:// address
                naming no readable file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from filelock import FileLock

from elmo_jax.runtime.progress import Progress, duration

CHUNK = 1 << 20
RETRY_PAUSE_S = 0.5  # before the second attempt; then twice that, at most 2 s
SILENCE_S = 60.0  # the longest a server may stay silent, over all reconnections of one download
WAIT_NOTE_S = 10.0  # while it is silent, a word this often
USER_AGENT = "elmo-jax (urllib)"
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # the part holds space another file may need


class DownloadError(OSError):
    """A download failed; the message names the address, the file and what went wrong, in one line."""


class AddressError(DownloadError):
    """The address is not one this module can download (not http(s)); nothing was tried."""


class DiskError(DownloadError):
    """The downloaded bytes could not be written locally (ENOSPC, EDQUOT, EROFS, EACCES, ...)."""


class NetworkError(DownloadError):
    """No connection, or every one broke or stayed silent; the part (if any) is kept for a later call."""


class ServerError(DownloadError):
    """The server's answer cannot become the file: HTTP status, other bytes than asked for, a mismatch."""


def check_address(url: str, *, local: bool = False) -> None:
    """Raises AddressError unless `url` is an http(s) address with a host (`local`: or a file:// address
    with a path)."""
    parts = urllib.parse.urlsplit(url)
    if local and _is_local(url) and parts.path:
        return
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise AddressError(f"{url!r} is not an http:// or https:// address with a host")


def _is_local(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() == "file"


def download(
    url: str,
    target: str,
    *,
    expected_bytes: int | None = None,
    expected_sha256: str | None = None,
    checksum_source: str = "",
    attempts: int = 3,
    progress: Callable[[int, int | None], None] | None = None,
    waiting: Callable[[float, float], None] | None = None,
) -> tuple[int, str]:
    """Downloads `url` to `target` (through `target + ".part"`); returns (bytes, SHA-256 hex).

    Args:
      url: http(s) address, or file:// (read from the start each time, no retry for a missing file).
      target: the file to create; its directory must exist. An existing `target` is replaced only by a
        complete, checked download.
      expected_bytes: the size the file must have (None: whatever the server sends, complete).
      expected_sha256: the hex SHA-256 it must have (None: not checked).
      checksum_source: where the expectations come from, for the mismatch message.
      attempts: connections tried before giving up on broken or refused ones (silence has its own bound,
        `SILENCE_S`; HTTP 4xx is final).
      progress: called as progress(bytes so far, total bytes or None) when a connection starts (with the
        bytes it resumes from) and while bytes arrive; e.g. a `Report`.
      waiting: called as waiting(seconds silent so far, SILENCE_S) every `WAIT_NOTE_S` of silence.

    Raises:
      AddressError, DiskError, NetworkError, ServerError (all DownloadError, an OSError): see the module.
    """
    check_address(url, local=True)
    part = target + ".part"
    silence = _Silence(waiting)
    failures = 0
    while (failure := _attempt(url, part, expected_bytes, silence, progress)) is not None:
        if failure is _SILENT:
            if silence.over():
                raise NetworkError(f"{url}: no answer in {SILENCE_S:.0f} s{_kept(part)}")
            continue  # reconnect at once: the silence was the pause
        failures += 1
        if failures == attempts:
            kind = ServerError if failure.startswith("HTTP 5") else NetworkError
            raise kind(f"{url}: {failure} ({attempts} attempts){_kept(part)}")
        time.sleep(min(RETRY_PAUSE_S * failures, 2.0))
    size, digest = _check(url, part, expected_bytes, expected_sha256, checksum_source)
    with _writing(part, url, expected_bytes):
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        os.replace(part, target)
    return size, digest


class Report:
    """A download's progress lines (`runtime.progress.Progress`) for `download(progress=report,
    waiting=report.waiting)`: MB so far (of the total), MB/s and the ETA of this run's bytes (not those a
    resumed part held), a line at most every 2 s on standard error (with `log`: every 30 s in absl's log)
    and one at the end; and a word each `WAIT_NOTE_S` the server stays silent.

    Args:
      what: how the lines name the file ("small: weights.hdf5").
      log: write to absl's log instead of standard error.
    """

    def __init__(self, what: str, *, log: bool = False):
        self.what, self.log = what, log
        self.progress: Progress | None = None

    def _start(self, done: int) -> Progress:
        every_s = None if self.log else 2.0
        self.progress = Progress({"bytes": None}, start={"bytes": done}, every_s=every_s, log=self.log)
        return self.progress

    def __call__(self, done: int, total: int | None) -> None:
        progress = self.progress
        if progress is None or done < progress.done["bytes"]:  # the first connection, or one from the start
            progress = self._start(done)
        progress.totals["bytes"] = total
        progress.add(bytes=done - progress.done["bytes"])
        if done != total and not progress.due():
            return
        of = f" of {total / 1e6:,.1f} MB ({100 * done / total:.0f}%)" if total else " MB"
        eta = f", ETA {duration(progress.eta())}" if total and done != total else ""
        line = f"downloading {self.what}: {done / 1e6:,.1f}{of}, {progress.rate() / 1e6:.1f} MB/s{eta}"
        progress.write(line, final=done == total)

    def waiting(self, silent_s: float, limit_s: float) -> None:
        """For `download(waiting=...)`: the server has been silent for `silent_s` of at most `limit_s`."""
        progress = self.progress or self._start(0)
        note = f"no answer for {silent_s:.0f} s, waiting (gives up after {limit_s:.0f} s)"
        progress.write(f"downloading {self.what}: {note}", final=True)


@contextlib.contextmanager
def locked(path: str):
    """An exclusive lock while the block runs, waiting for another process that holds it: a
    `filelock.FileLock` on `path`, a lock file (created if missing), or for a directory on the lock file
    `DIRECTORY.lock` beside it (a lock file cannot be a directory, and the directory's listing stays its
    own). Where the file system has no locks (`flock` fails with ENOSYS, e.g. some FUSE mounts) the
    block runs unlocked: filelock 3 says so with NotImplementedError, filelock 4 takes its soft lock
    (a marker file) instead."""
    if os.path.isdir(path):
        path = os.path.normpath(path) + ".lock"
    lock = FileLock(path)
    try:
        lock.acquire()
    except NotImplementedError:
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


_SILENT = "silent"  # _attempt's word for a connection on which nothing arrived for a while


class _Silence:
    """The one deadline on a silent server: `SILENCE_S` without a byte, over every reconnection."""

    def __init__(self, waiting):
        self.waiting, self.since = waiting, time.monotonic()

    def heard(self) -> None:
        self.since = time.monotonic()

    def timeout(self) -> float:
        """The socket timeout for the next wait: until the next word, or the deadline if sooner."""
        return max(0.01, min(WAIT_NOTE_S, SILENCE_S - (time.monotonic() - self.since)))

    def over(self) -> bool:
        """Whether the deadline has passed; else tells `waiting` how long the silence has lasted."""
        silent = time.monotonic() - self.since
        if silent >= SILENCE_S - 0.01:
            return True
        if self.waiting is not None:
            self.waiting(silent, SILENCE_S)
        return False


def _kept(part: str) -> str:
    if not os.path.exists(part):
        return ""
    return f"; {os.path.getsize(part):,} bytes are kept in {part} and the next try resumes there"


def _attempt(url: str, part: str, expected_bytes: int | None, silence: _Silence, progress) -> str | None:
    """One connection's try at completing `part`: None when it is complete, `_SILENT` when nothing came
    for a while, else what went wrong (worth another try); raises DownloadError when another try cannot
    help (HTTP 4xx, a server sending other bytes than asked for, a local disk error, an unreadable
    file:// address)."""
    try:
        if _fetch_rest(url, part, expected_bytes, silence, progress):
            return None
        return f"the connection closed after {os.path.getsize(part):,} bytes"
    except urllib.error.HTTPError as e:
        if e.code == 416 and os.path.exists(part):  # asked for bytes from the part's end: there are none
            if _range_total(e.headers.get("Content-Range", "")) == os.path.getsize(part):
                return None  # the part is the whole file
            _remove(part)  # not a part of the file the server has: start again
            return f"HTTP 416 for a part of {part}, which was deleted"
        if 400 <= e.code < 500:
            raise ServerError(f"{url}: HTTP {e.code} {e.reason}") from None
        return f"HTTP {e.code} {e.reason}"
    except DownloadError:
        raise
    except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e  # refused, reset, timed out, cut
        if _is_local(url):  # a local file that cannot be read: another try reads the same
            raise ServerError(f"{url}: {getattr(reason, 'strerror', None) or reason}") from None
        if isinstance(reason, TimeoutError):
            return _SILENT
        return str(reason)


def _fetch_rest(url: str, part: str, expected_bytes: int | None, silence: _Silence, progress) -> bool:
    """Appends the bytes `part` lacks; returns whether it is now complete (False: the connection ended early)."""
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    if expected_bytes is not None and offset >= expected_bytes:
        if offset == expected_bytes:
            return True
        _remove(part)  # longer than the file can be: not a part of it
        offset = 0
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=silence.timeout()) as response:
        silence.heard()
        if response.status == 206:
            start = _range_start(response.headers.get("Content-Range", ""))
            if start != offset:
                raise ServerError(f"{url}: asked for the bytes from {offset:,}, the server sent them from {start}")
        else:  # 200: the server ignored the range and sends the whole file
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else expected_bytes
        if expected_bytes is not None and total is not None and total != expected_bytes:
            _remove(part)
            raise ServerError(f"{url}: the server's file has {total:,} bytes, expected {expected_bytes:,}")
        done = _append(response, part, offset, total, silence, progress, url)
    return total is None or done >= total


def _append(response, part: str, offset: int, total: int | None, silence: _Silence, progress, url: str) -> int:
    """Writes the response's body to `part` from `offset`; returns the part's size after it. Only the
    file's own errors are disk errors (`_writing`); the response's are the connection's."""
    with _writing(part, url, total):
        f = open(part, "ab" if offset else "wb")  # noqa: SIM115 (closed below, its errors classified)
    done = offset
    if progress is not None:
        progress(done, total)  # where this connection starts: the bytes before it are not its rate
    try:
        while chunk := response.read(CHUNK):
            silence.heard()
            with _writing(part, url, total):
                f.write(chunk)
                f.flush()  # a full disk shows here, not at a close the connection's error may pre-empt
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    finally:
        with contextlib.suppress(OSError):  # flushed above; after a failed write there is nothing to keep
            f.close()
    return done


class _writing:  # noqa: N801 (a context manager read as a phrase)
    """Turns an OSError of the local file into a DiskError naming the file, the errno's words and, on a
    full disk, the space wanted and free; a part on a full disk is deleted (it holds the missing space)."""

    def __init__(self, part: str, url: str, total: int | None):
        self.part, self.url, self.total = part, url, total

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if not isinstance(error, OSError) or isinstance(error, DownloadError):
            return False
        words = error.strerror or str(error)
        if error.errno in _FULL:
            written = os.path.getsize(self.part) if os.path.exists(self.part) else 0
            _remove(self.part)
            wanted = f"the file has {self.total:,} bytes, " if self.total else ""
            words += f" ({wanted}{_free_space(self.part)}); the {written:,} bytes written were deleted"
        raise DiskError(f"cannot write {self.part} (downloading {self.url}): {words}") from None


def _free_space(path: str) -> str:
    """'N bytes free in DIR' (or what could not be known)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        return f"{shutil.disk_usage(folder).free:,} bytes free in {folder}"
    except OSError:
        return f"the free space in {folder} is not known"


def _range_start(content_range: str) -> int | None:
    """The first byte of a `Content-Range: bytes START-END/TOTAL` header (None if malformed)."""
    try:
        return int(content_range.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _range_total(content_range: str) -> int | None:
    """The TOTAL of a `Content-Range: bytes */TOTAL` header (a 416 response's), None if absent."""
    try:
        return int(content_range.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


def _check(url: str, part: str, expected_bytes, expected_sha256, source: str) -> tuple[int, str]:
    """(size, SHA-256) of the complete download; deletes it and raises when either is not as expected."""
    size = os.path.getsize(part)
    digest = sha256_of(part)
    problem = None
    if expected_bytes is not None and size != expected_bytes:
        problem = f"{size:,} bytes, expected {expected_bytes:,}"
    elif expected_sha256 is not None and digest != expected_sha256:
        problem = f"SHA-256 {digest}, expected {expected_sha256}"
    if problem:
        _remove(part)
        origin = f" (from {source})" if source else ""
        raise ServerError(f"{url}: the downloaded file has {problem}{origin}; it was deleted")
    return size, digest


def sha256_of(path: str) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
