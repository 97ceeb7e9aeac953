"""Writing files so that a reader only ever sees the old file or the complete new one.

A file is written to a temporary name in its own directory (so the rename stays on one file system),
flushed to disk, then renamed over the target; a failure removes the temporary file and leaves the
target untouched. `stage` lets a caller write several files before renaming any of them.

Temporary names are hidden and say who writes them: `.<name>.<host>.<pid>.<random>.tmp`. A process
killed while writing (SIGKILL, power loss) leaves one behind; `remove_stale_staging` removes those of a
target whose writer is no longer running on this host, and leaves those of a live writer alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from typing import BinaryIO


def stage(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> str:
    """Calls `write` on a new temporary file next to `path` and returns its name (not yet renamed).

    The file object is opened "w+b" (readable and seekable, as h5py needs). Raises FileNotFoundError,
    IsADirectoryError or PermissionError, naming `path`, before anything is written.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path}: directory {directory} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path}: it is a directory")
    fd, tmp = temporary_file(path)
    try:
        os.chmod(tmp, new_file_mode())  # mkstemp makes it owner-only; give it what open() would
        with os.fdopen(fd, "w+b") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def temporary_file(path: str | os.PathLike) -> tuple[int, str]:
    """(fd, name) of a new staging file for `path`, next to it; an OSError names `path`, not the temporary."""
    path = os.fspath(path)
    try:
        return tempfile.mkstemp(prefix=_staging_prefix(path), suffix=STAGING_SUFFIX, dir=_directory(path))
    except OSError as e:
        raise type(e)(e.errno, f"cannot write {path}: {e.strerror}") from None


def temporary_directory(path: str | os.PathLike) -> str:
    """A new staging directory for `path`, next to it."""
    path = os.fspath(path)
    try:
        return tempfile.mkdtemp(prefix=_staging_prefix(path), suffix=STAGING_SUFFIX, dir=_directory(path))
    except OSError as e:
        raise type(e)(e.errno, f"cannot write {path}: {e.strerror}") from None


STAGING_SUFFIX = ".tmp"


def _host() -> str:
    return socket.gethostname().replace(".", "-") or "localhost"  # no dots: the name is split at them


def _directory(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def _staging_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.{_host()}.{os.getpid()}."


def stale_staging(path: str | os.PathLike) -> list[tuple[str, int]]:
    """(staging path, writer pid) of every staging file or directory of `path` whose writer was a process
    on this host that no longer runs. Those of live writers, of other hosts and of other targets are
    not listed."""
    path = os.fspath(path)
    directory, prefix = _directory(path), f".{os.path.basename(path)}."
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    stale = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(STAGING_SUFFIX)):
            continue
        parts = name[len(prefix) : -len(STAGING_SUFFIX)].split(".")
        if len(parts) != 3 or parts[0] != _host() or not parts[1].isdigit():
            continue
        if not _running(int(parts[1])):
            stale.append((os.path.join(directory, name), int(parts[1])))
    return sorted(stale)


def remove_stale_staging(path: str | os.PathLike, log=None) -> list[str]:
    """Removes `stale_staging(path)`, saying so through `log(message)` (e.g. `logging.warning`); returns
    what it removed."""
    removed = []
    for staging, pid in stale_staging(path):
        if os.path.isdir(staging) and not os.path.islink(staging):
            shutil.rmtree(staging, ignore_errors=True)
        else:
            try:
                os.unlink(staging)
            except FileNotFoundError:
                continue
        removed.append(staging)
        if log is not None:
            log(f"removed {staging}: left behind by an interrupted run (pid {pid}) writing {os.fspath(path)}")
    return removed


def _running(pid: int) -> bool:
    """Whether a process with this pid runs on this host (a reused pid counts as running: never remove
    the files of a process that might still write them)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write(path: str | os.PathLike, write_fn: Callable[[BinaryIO], object]) -> None:
    """`write_fn(file)` into a temporary file, then renamed over `path`."""
    tmp = stage(path, write_fn)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """UTF-8 `text` (newlines as given) written atomically to `path`."""
    data = text.encode("utf-8")  # encoded first: an unencodable string fails before any file exists
    write(path, lambda f: f.write(data))


def new_file_mode() -> int:
    """The permission bits `open()` would give a new file under the current umask."""
    return 0o666 & ~umask()


def umask() -> int:
    """The process umask (read without changing it for longer than the call)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
