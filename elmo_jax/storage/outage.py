"""Cloud Storage out of reach: a bounded wait and one error naming the place, not minutes of retries.

gcsfs (etils.epath, orbax's directory operations, every `gs://` operation of this package) retries a
request that cannot reach the service 6 times with backoff, about 31-36 s, then raises. A job whose
service has gone away makes many requests in a row: training's metrics upload, the checkpoint save, its
error path, the closing uploads; each paid those 33 s again, so `train.py` took 330 s to exit after the
service stopped (and ended in a traceback), `export` of a workdir 70 s (one retry cycle per checkpoint
it tried).

The guard is `reaching(place)`, the block of one operation on a `gs://` place: every operation of
`storage` on a URL runs in one (`places.reaching`), and so do the operations of another library that this
package hands a place (orbax's checkpoint saves and restores, `training/checkpoint.py`).

- The deadline: the operation's client gives up after one retry cycle, each try bounded by `CONNECT_S`
  to connect and `READ_S` of silence while its answer arrives (`install`), so that a network that
  drops packets rather than refusing them also ends the cycle (gcsfs sets no bound of its own).
- The window: once a block failed on a connection failure (no answer at all; the service answering with
  an error, a 4xx or 5xx, is not one), the service counts as unreachable for `UNREACHABLE_S`: every
  block started in that time fails at once with `StorageUnreachable` (an OSError, so a command reports it
  in its one error line) naming its place. A job therefore ends about one retry cycle after the service
  went away; a block after the window tries again (a long job survives an outage shorter than the time
  to its next checkpoint).

The window is per process and sees blocks, not requests: the requests another library makes on its
own (orbax's background writes, TFDS reading metadata) each cost their client's own retry cycle until
a block has failed. The clients' tracebacks of exhausted retries are logged as one line (`install`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

UNREACHABLE_S = 300.0  # after a block failed on a connection failure, later ones fail at once
CONNECT_S = 20.0  # a try of a gcsfs request that has not connected by then fails (and is retried)
READ_S = 60.0  # a try whose answer stops arriving for this long fails (and is retried)

_lock = threading.Lock()
_since: float | None = None  # time.monotonic() when a block last failed on an unreachable service
_cause = ""


class StorageUnreachable(ConnectionError):
    """The storage service cannot be reached (its client's retries spent, or spent by a block less than
    `UNREACHABLE_S` ago); the message names the place."""


def unreachable() -> bool:
    """Whether a block failed on an unreachable service less than `UNREACHABLE_S` ago."""
    with _lock:
        return _since is not None and time.monotonic() - _since < UNREACHABLE_S


def reset() -> None:
    """Forgets an earlier outage (tests that restart a service inside one process)."""
    global _since, _cause
    with _lock:
        _since, _cause = None, ""


@contextlib.contextmanager
def reaching(place: str, refuse: bool = True) -> Iterator[None]:
    """The block of one operation on the Cloud Storage place `place` (see the module docstring).

    Args:
      place: the gs:// URL that messages name.
      refuse: fail at once while the service counts as unreachable; False for a block that only
        collects work started earlier (waiting for a background write), which must still be waited for.

    Raises:
      StorageUnreachable: refused, or the block failed on a connection failure (raised from it).
    """
    refused = _refused(place) if refuse else None
    if refused is not None:
        raise refused
    start = time.monotonic()
    try:
        yield
    except StorageUnreachable:  # a block inside this one named its own place
        raise
    except Exception as e:
        failure = _connection_failure(e)
        if failure is None:
            raise
        raise _found(place, failure, time.monotonic() - start) from e


def _connection_failure(error: BaseException | None) -> BaseException | None:
    """The error in `error`'s chain (itself, or one it was raised from or while handling) that says the
    service could not be reached at all, or None."""
    try:
        import aiohttp

        kinds: tuple[type[BaseException], ...] = (ConnectionError, aiohttp.ClientConnectionError)
    except ImportError:
        kinds = (ConnectionError,)
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kinds):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _found(place: str, error: BaseException, seconds: float) -> StorageUnreachable:
    global _since, _cause
    with _lock:
        _since, _cause = time.monotonic(), f"{type(error).__name__}: {' '.join(str(error).split())}"
    return StorageUnreachable(f"{place}: Cloud Storage cannot be reached (gave up after {seconds:.0f} s; {_cause})")


def _refused(place: str) -> StorageUnreachable | None:
    with _lock:
        if _since is None or time.monotonic() - _since >= UNREACHABLE_S:
            return None
        ago = time.monotonic() - _since
        return StorageUnreachable(f"{place}: Cloud Storage cannot be reached ({ago:.0f} s ago: {_cause})")


class _OneLine(logging.Filter):
    """gcsfs logs each request that spent its retries with the whole traceback, before raising it to the
    caller (who reports it): the traceback is dropped, the line kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """Bounds each try of the gcsfs file systems made from now on, this package's and those etils.epath
    makes for orbax and TFDS (`requests_timeout`, a gcsfs constructor argument, given through fsspec's
    configuration of the `gs` and `gcs` protocols, which fsspec applies to every instance; a value the
    user configured is kept), and keeps gcsfs's exhausted-retry logs to one line. Cheap when done."""
    import aiohttp
    import fsspec

    configured = [fsspec.config.conf.setdefault(protocol, {}) for protocol in ("gs", "gcs")]
    if not any("requests_timeout" in options for options in configured):
        timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_S, sock_read=READ_S)
        for options in configured:
            options["requests_timeout"] = timeout
    gcsfs_logger = logging.getLogger("gcsfs")
    if not any(isinstance(f, _OneLine) for f in gcsfs_logger.filters):
        gcsfs_logger.addFilter(_OneLine())
