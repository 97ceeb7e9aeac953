"""Writing files so that a reader only ever sees the old file or the complete new one.

A file is written to a temporary name in its own directory (so the rename stays on one file system),
flushed to disk, then renamed over the target; a failure removes the temporary file and leaves the
target untouched. `stage` lets a caller write several files before renaming any of them.
"""

from __future__ import annotations

import os
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
    """(fd, name) of a new file `<name>.XXXX.tmp` next to `path`; an OSError names `path`, not the temporary."""
    path = os.fspath(path)
    try:
        return tempfile.mkstemp(
            prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path))
        )
    except OSError as e:
        raise type(e)(e.errno, f"cannot write {path}: {e.strerror}") from None


def temporary_directory(path: str | os.PathLike) -> str:
    """A new directory `.<name>.XXXX.tmp` next to `path` (hidden: it is not the result yet)."""
    path = os.fspath(path)
    try:
        return tempfile.mkdtemp(
            prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path))
        )
    except OSError as e:
        raise type(e)(e.errno, f"cannot write {path}: {e.strerror}") from None


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
