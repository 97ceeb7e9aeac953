"""Cloud Storage out of reach: a bounded wait and one error naming the place, not minutes of retries.

gcsfs (etils.epath, orbax's directory operations, every `gs://` call of this package) retries a request
that cannot reach the service 6 times with backoff, about 31-36 s, then raises. A job whose service has
gone away makes many requests in a row: training's metrics upload, the checkpoint save, its error path
(orbax's reload, the listing of incomplete steps), the closing uploads; each paid those 33 s again, so
`train.py` took 330 s to exit after the service stopped (and ended in a traceback), `export` of a
workdir 70 s (one retry cycle per checkpoint it tried).

So once one request has spent its retries on a connection failure, the service counts as unreachable
for `UNREACHABLE_S`: every later gcsfs request in that time fails at once with `StorageUnreachable`
(an OSError, so a command reports it in its one error line), naming the `gs://` place. A job therefore
ends about one retry cycle after the service went away. A request after that window tries again (a
long job survives an outage shorter than the time to its next checkpoint). The clients' own tracebacks
of the exhausted retries are logged as one line (`install`).

Installed by `places._check_client` on the first `gs://` path: the gcsfs class registered for `gs`
and `gcs` in fsspec is replaced by a subclass of it (whatever gcsfs registered) that adds the check.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
import urllib.parse

UNREACHABLE_S = 300.0  # after a request spent its retries on a connection failure, later ones fail at once

_lock = threading.Lock()
_since: float | None = None  # time.monotonic() when a request last gave up on an unreachable service
_cause = ""


class StorageUnreachable(ConnectionError):
    """The storage service cannot be reached (its client's retries spent, or spent by a request less than
    `UNREACHABLE_S` ago); the message names the place."""


def unreachable() -> bool:
    """Whether a request gave up on an unreachable service less than `UNREACHABLE_S` ago."""
    with _lock:
        return _since is not None and time.monotonic() - _since < UNREACHABLE_S


def reset() -> None:
    """Forgets an earlier outage (tests that restart a service inside one process)."""
    global _since, _cause
    with _lock:
        _since, _cause = None, ""


def _found(place: str, error: BaseException, seconds: float) -> StorageUnreachable:
    global _since, _cause
    with _lock:
        _since, _cause = time.monotonic(), f"{type(error).__name__}: {' '.join(str(error).split())}"
    return StorageUnreachable(
        f"{place}: Cloud Storage cannot be reached (gave up after {seconds:.0f} s of retries; {_cause})"
    )


def _refused(place: str) -> StorageUnreachable | None:
    with _lock:
        if _since is None or time.monotonic() - _since >= UNREACHABLE_S:
            return None
        ago = time.monotonic() - _since
        return StorageUnreachable(f"{place}: Cloud Storage cannot be reached ({ago:.0f} s ago: {_cause})")


def _connection_errors() -> tuple[type[BaseException], ...]:
    import aiohttp

    # Not the service answering with an error (a 4xx or 5xx status): no connection, or it went away.
    return (aiohttp.ClientConnectionError, asyncio.TimeoutError)


_OBJECT = re.compile(r"/b/(?P<bucket>[^/?]+)(?:/o/(?P<object>[^?]+))?")


def _place(fs, method: str, args: tuple, kwargs: dict) -> str:
    """The gs:// place a gcsfs request is about (best effort: the bucket and object it names)."""
    if method == "_request" and len(args) >= 2:
        try:
            url = fs._format_path(args[1], args[2:])
        except Exception:
            url = str(args[1])
        match = _OBJECT.search(url)
        if match:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("name", [None])[0]
            name = match["object"] or query or kwargs.get("name") or _uploaded_name(kwargs.get("data"))
            bucket = urllib.parse.unquote(match["bucket"])
            return f"gs://{bucket}/{urllib.parse.unquote(name)}" if name else f"gs://{bucket}"
        return url
    if args and isinstance(args[0], str):  # _get_file_request(rpath, lpath, ...): "bucket/object"
        return f"gs://{args[0].split('://', 1)[-1]}"
    return "gs://"


_METADATA_NAME = re.compile(r'"name":\s*("(?:[^"\\]|\\.)*")')


def _uploaded_name(data) -> str | None:
    """The object name in the JSON part of a multipart upload's body (gcsfs's simple upload)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    match = _METADATA_NAME.search(bytes(data[:4096]).decode("utf-8", "replace"))
    return json.loads(match[1]) if match else None


def _guarded(name: str):
    async def request(self, *args, **kwargs):
        place = _place(self, name, args, kwargs)
        refused = _refused(place)
        if refused is not None:
            raise refused
        start = time.monotonic()
        try:
            return await getattr(super(self._elmo_jax_guarded, self), name)(*args, **kwargs)
        except _connection_errors() as e:
            raise _found(place, e, time.monotonic() - start) from e

    request.__name__ = name
    return request


_GUARDED_METHODS = ("_request", "_get_file_request")
_classes: dict[type, type] = {}


def _guarded_class(base: type) -> type:
    if getattr(base, "_elmo_jax_guarded", None) is base:
        return base
    if base not in _classes:
        # A name of this module that says which class it extends, so that an instance pickles (fsspec
        # pickles a file system as its class and arguments) and unpickles in another process
        # (`__getattr__`).
        name = "__".join(["Guarded", *base.__module__.split("."), base.__qualname__])
        cls = type(name, (base,), {method: _guarded(method) for method in _GUARDED_METHODS})
        cls._elmo_jax_guarded = cls
        cls.__module__, cls.__qualname__ = __name__, name
        _classes[base] = cls
        globals()[name] = cls
    return _classes[base]


def __getattr__(name: str):
    """A guarded class by its name (`_guarded_class`), made on first use (unpickling)."""
    parts = name.split("__")
    if parts[0] != "Guarded" or len(parts) < 3:
        raise AttributeError(name)
    import importlib

    return _guarded_class(getattr(importlib.import_module(".".join(parts[1:-1])), parts[-1]))


class _OneLine(logging.Filter):
    """gcsfs logs each request that spent its retries with the whole traceback, before raising it to the
    caller (who reports it): the traceback is dropped, the line kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """Puts the check in front of gcsfs's requests (the class fsspec uses for gs:// and gcs://) and keeps
    gcsfs's exhausted-retry logs to one line. Cheap when already done; done again if something registered
    another class since."""
    import fsspec

    for protocol in ("gs", "gcs"):
        current = fsspec.get_filesystem_class(protocol)
        guarded = _guarded_class(current)
        if guarded is not current:
            fsspec.register_implementation(protocol, guarded, clobber=True)
    gcsfs_logger = logging.getLogger("gcsfs")
    if not any(isinstance(f, _OneLine) for f in gcsfs_logger.filters):
        gcsfs_logger.addFilter(_OneLine())
