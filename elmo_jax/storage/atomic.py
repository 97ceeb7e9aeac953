"""Writing local files and directories so that a reader only ever sees the old one or the complete new one.

A file or directory is built under a temporary name next to its target (so the rename stays on one file
system), flushed to disk, then renamed onto the target; a failure removes the temporary and leaves the
target untouched. `stage` lets a caller write several files before renaming any of them;
`publish_directory` builds and publishes a whole directory, `publish_file` a file built elsewhere.

The policy, the same for every file and directory the project publishes locally:
- durable: every file is fsynced before its rename, a directory's files and the directory itself before
  the directory's rename, and the target's parent directory after it, so that after a power loss the
  target is the old one or the whole new one;
- an existing target, also one another writer published while this one was building its own (the
  concurrent winner), is dealt with as the caller says (`EXISTING`): refused; kept (this copy is
  dropped: two writers of the same content, e.g. two processes preparing one corpus); or replaced, the
  old one renamed aside first and removed only once the new one is in place (put back if that fails);
- temporary names are hidden and say who writes them: `.<name>.<host>.<pid>.<random>.tmp`. A process
  killed while writing (SIGKILL, power loss) leaves one behind; `remove_stale_staging` removes those of
  a target whose writer is no longer running on this host, and leaves those of a live writer alone
  (`live_staging` lists those, for a writer that refuses to work beside another).

`elmo_jax.storage.publish` gives the same operations for targets in a bucket.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from absl import logging

from elmo_jax.storage import places

# What `publish_directory` does with an existing target (see the module docstring).
EXISTING = ("refuse", "keep", "replace")


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


def is_staging_name(name: str) -> bool:
    """Whether the base name `name` is a staging file's or directory's (`.<target>.<host>.<pid>.<random>.tmp`),
    of any target, host and writer."""
    if not (name.startswith(".") and name.endswith(STAGING_SUFFIX)):
        return False
    parts = name[1 : -len(STAGING_SUFFIX)].split(".")
    return len(parts) >= 4 and parts[-2].isdigit()


def stale_staging(path: str | os.PathLike) -> list[tuple[str, int]]:
    """(staging path, writer pid) of every staging file or directory of `path` whose writer was a process
    on this host that no longer runs. Those of live writers, of other hosts and of other targets are
    not listed."""
    return [(staging, pid) for staging, pid, running in _staging_of(path) if not running]


def live_staging(path: str | os.PathLike) -> list[tuple[str, int]]:
    """(staging path, writer pid) of every staging file or directory of `path` whose writer runs on this
    host (this process included): a writer that another one must not disturb. Other hosts' are not
    listed (whether their writer runs cannot be told from here)."""
    return [(staging, pid) for staging, pid, running in _staging_of(path) if running]


def _staging_of(path: str | os.PathLike) -> list[tuple[str, int, bool]]:
    """(staging path, writer pid, whether the writer runs) of this host's staging names of `path`."""
    path = os.fspath(path)
    if places.is_remote(path):  # objects are uploaded whole: nothing is staged next to them
        return []
    directory, prefix = _directory(path), f".{os.path.basename(path)}."
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(STAGING_SUFFIX)):
            continue
        parts = name[len(prefix) : -len(STAGING_SUFFIX)].split(".")
        if len(parts) != 3 or parts[0] != _host() or not parts[1].isdigit():
            continue
        found.append((os.path.join(directory, name), int(parts[1]), pid_running(int(parts[1]))))
    return sorted(found)


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


def pid_running(pid: int) -> bool:
    """Whether a process with this pid runs on this host (a reused pid counts as running: never remove
    the files of a process that might still write them; another user's process counts as running)."""
    if os.name == "nt":
        return _windows_pid_running(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _windows_pid_running(pid: int, kernel32=None, last_error=None) -> bool:
    """`pid_running` on Windows, where `os.kill(pid, 0)` is no probe: 0 is CTRL_C_EVENT there, sent to
    the pid's console process group (and any other signal number terminates the process). Asks the
    kernel for a handle instead: none and "access denied" is another user's process; a handle whose
    wait times out is a process still running (an exited one's handle is signalled)."""
    import ctypes

    kernel32 = kernel32 or ctypes.WinDLL("kernel32", use_last_error=True)
    last_error = last_error or ctypes.get_last_error
    query_and_wait = 0x1000 | 0x00100000  # PROCESS_QUERY_LIMITED_INFORMATION | SYNCHRONIZE
    handle = kernel32.OpenProcess(query_and_wait, False, pid)
    if not handle:
        return last_error() == 5  # ERROR_ACCESS_DENIED
    try:
        return kernel32.WaitForSingleObject(handle, 0) == 0x102  # WAIT_TIMEOUT
    finally:
        kernel32.CloseHandle(handle)


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


def publish_file(built: str | os.PathLike, target: str | os.PathLike) -> None:
    """Publishes the local file `built` (written elsewhere on `target`'s file system, e.g. in a staging
    directory) at `target`: given the mode `open()` would give a new file, synced, renamed over `target`
    (replacing it), and `target`'s directory synced."""
    os.chmod(built, new_file_mode())
    fsync(built)
    os.replace(built, target)
    fsync(os.path.dirname(os.path.abspath(os.fspath(target))))


def publish_directory(
    target: str | os.PathLike,
    fill: Callable[[str], object],
    *,
    existing: str = "refuse",
    accept: Callable[[str], bool] | None = None,
) -> str:
    """Builds a directory with `fill(directory)` under a staging name next to `target`, then renames it
    onto `target` (the module docstring's policy); returns `target`.

    Args:
      target: the local directory to publish; its parent must exist.
      fill: writes the directory's content into the directory it is given (any layout).
      existing: "refuse" (FileExistsError), "keep" or "replace" an existing target (`EXISTING`).
      accept: with "keep", whether the existing target is usable; False raises FileExistsError naming it.

    Raises:
      FileExistsError: the target exists (or was published meanwhile) and may not be kept or replaced.
      whatever `fill` raises; OSError from the file system. The staging directory is removed, and the
      target is as it was.
    """
    if existing not in EXISTING:
        raise ValueError(f"existing={existing!r}: expected one of {EXISTING}")
    target = os.path.abspath(os.fspath(target))
    remove_stale_staging(target, log=logging.info)
    staging = temporary_directory(target)
    try:
        fill(staging)
        _fsync_tree(staging)
        os.chmod(staging, 0o777 & ~umask())  # mkdtemp makes it owner-only; give it what mkdir would
        if not os.path.lexists(target):
            try:
                os.rename(staging, target)
            except OSError as e:  # published by another writer since the check
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                    raise
                _existing(staging, target, existing, accept)
        else:
            _existing(staging, target, existing, accept)
        fsync(os.path.dirname(target))
    finally:
        if os.path.lexists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _existing(staging: str, target: str, existing: str, accept: Callable[[str], bool] | None) -> None:
    """Applies the `existing` rule to a `target` already there; the staging directory is either renamed
    onto it ("replace") or left for the caller to remove."""
    if existing == "refuse":
        raise FileExistsError(errno.EEXIST, f"{target} already exists")
    if existing == "keep":
        if accept is not None and not accept(target):
            raise FileExistsError(errno.EEXIST, f"{target} already exists and is not a complete copy")
        return
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".old", dir=os.path.dirname(target))
    os.rmdir(aside)
    os.rename(target, aside)
    try:
        os.rename(staging, target)
    except BaseException:  # put the old one back under its name before reporting
        os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def fsync(path: str | os.PathLike) -> None:
    """Flushes a file's or a directory's data to disk (a directory: its entries)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: str) -> None:
    """`fsync` of every file and directory under `directory`, the directories after their content."""
    for root, _, files in os.walk(directory, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                fsync(path)
        fsync(root)
