"""Downloading one file over HTTP(S): resumable, verified, and renamed into place only when complete.

    size, sha256 = download(url, "cache/weights.hdf5", expected_bytes=..., expected_sha256=...)

Bytes go to `TARGET.part`. A connection that breaks mid-file (or a process killed mid-file) leaves the
part on disk, and the next attempt, in this call or a later one, asks the server for the rest with an
HTTP `Range` request (a server that ignores it sends the whole file again, which is then written from
the start). When every byte is there, the size and SHA-256 are checked against what is expected, and
only then is the part flushed and renamed to TARGET: a reader sees no file or the complete, checked one.
A file that fails its check is deleted, so the next attempt starts afresh. Standard library only (urllib).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable

CHUNK = 1 << 20
RETRY_PAUSE_S = 0.5  # before the second attempt; then twice that, at most 2 s
USER_AGENT = "elmo-jax (urllib)"


class DownloadError(OSError):
    """A download failed; the message names the address, the file and what went wrong, in one line."""


def download(
    url: str,
    target: str,
    *,
    expected_bytes: int | None = None,
    expected_sha256: str | None = None,
    checksum_source: str = "",
    attempts: int = 3,
    timeout: float = 60.0,
    progress: Callable[[int, int | None], None] | None = None,
) -> tuple[int, str]:
    """Downloads `url` to `target` (through `target + ".part"`); returns (bytes, SHA-256 hex).

    Args:
      url: http(s) address.
      target: the file to create; its directory must exist. An existing `target` is replaced only by a
        complete, checked download.
      expected_bytes: the size the file must have (None: whatever the server sends, complete).
      expected_sha256: the hex SHA-256 it must have (None: not checked).
      checksum_source: where the expectations come from, for the mismatch message.
      attempts: connections tried before giving up on a broken or refused one (HTTP 4xx is final).
      timeout: seconds a connection may stay silent.
      progress: called as progress(bytes so far, total bytes or None) while bytes arrive.

    Raises:
      DownloadError: the server refused (HTTP status), the connection failed `attempts` times, or the
        file is not what was expected (it is deleted then).
    """
    part = target + ".part"
    failure = ""
    for attempt in range(attempts):
        if attempt:
            time.sleep(min(RETRY_PAUSE_S * attempt, 2.0))
        failure = _attempt(url, part, expected_bytes, timeout, progress)
        if failure is None:
            break
    else:
        kept = (
            f"; {os.path.getsize(part):,} bytes are kept in {part} and the next try resumes there"
            if os.path.exists(part)
            else ""
        )
        raise DownloadError(f"{url}: {failure} ({attempts} attempts){kept}")
    size, digest = _check(url, part, expected_bytes, expected_sha256, checksum_source)
    with open(part, "rb") as f:
        os.fsync(f.fileno())
    os.replace(part, target)
    return size, digest


def _attempt(url: str, part: str, expected_bytes: int | None, timeout: float, progress) -> str | None:
    """One connection's try at completing `part`: None when it is complete, else what went wrong (worth
    another try); raises DownloadError when another try cannot help (HTTP 4xx, a server sending other
    bytes than asked for)."""
    try:
        if _fetch_rest(url, part, expected_bytes, timeout, progress):
            return None
        return f"the connection closed after {os.path.getsize(part):,} bytes"
    except urllib.error.HTTPError as e:
        if e.code == 416 and os.path.exists(part):  # asked for bytes from the part's end: there are none
            if _range_total(e.headers.get("Content-Range", "")) == os.path.getsize(part):
                return None  # the part is the whole file
            _remove(part)  # not a part of the file the server has: start again
            return f"HTTP 416 for a part of {part}, which was deleted"
        if 400 <= e.code < 500:
            raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
        return f"HTTP {e.code} {e.reason}"
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # refused, reset, timed out, cut
        if isinstance(e, DownloadError):
            raise
        return str(getattr(e, "reason", None) or e)


def _fetch_rest(url: str, part: str, expected_bytes: int | None, timeout: float, progress) -> bool:
    """Appends the bytes `part` lacks; returns whether it is now complete (False: the connection ended early)."""
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    if expected_bytes is not None and offset >= expected_bytes:
        if offset == expected_bytes:
            return True
        os.unlink(part)  # longer than the file can be: not a part of it
        offset = 0
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
        if response.status == 206:
            start = _range_start(response.headers.get("Content-Range", ""))
            if start != offset:
                raise DownloadError(f"{url}: asked for the bytes from {offset:,}, the server sent them from {start}")
        else:  # 200: the server ignored the range and sends the whole file
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else expected_bytes
        if expected_bytes is not None and total is not None and total != expected_bytes:
            _remove(part)
            raise DownloadError(f"{url}: the server's file has {total:,} bytes, expected {expected_bytes:,}")
        with open(part, "ab" if offset else "wb") as f:
            done = offset
            while chunk := response.read(CHUNK):
                f.write(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    return total is None or done >= total


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
        raise DownloadError(f"{url}: the downloaded file has {problem}{origin}; it was deleted")
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
