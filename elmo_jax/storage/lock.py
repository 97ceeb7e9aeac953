"""An exclusive lock on a directory, local or in a bucket, held by one process at a time and naming its
holder: `with PlaceLock(directory, ...): ...`.

Locally the lock is an `flock` on the directory itself, which the kernel releases when the holder exits
or dies, so a killed holder never blocks the next one; and since it is the directory that is locked,
deleting the record file (the usual reflex for a lock believed stale) does not unlock it. The record
file in the directory (`name`) says who holds it (pid, host, start time, command) for the refusal
message; one that still names a holder while nobody holds the lock is what a killed holder left, and is
taken over with a warning. On a clean exit it is emptied. Where a file system cannot lock a directory
(some network file systems), the record file itself is locked instead, with a warning that deleting it
would undo the lock. The record is opened without following links: a symbolic link planted in its
place (to a user's file, which would be overwritten and then emptied) is refused, naming it.

On Windows (no `flock`, no directory descriptors, no `O_NOFOLLOW`) the record file itself is locked
(`lock_now`: `msvcrt.locking`), a link there is refused by a check before the open, and nothing watches
the path: Windows refuses to rename or delete a directory while a file in it is open.

The lock is on the directory, not on its path: renamed (`mv W W.old`) or deleted, it stays locked, and
a new directory made at the path is free for another process. `check_in_place` tells the holder when
its path no longer names the directory it locked, so that it stops writing by that path (into the
other process's directory).

In a bucket there is no `flock`: the lock is the record object, created only if absent and kept alive by
a heartbeat (`bucket_lock.BucketLock`, docs/CLOUD_STORAGE.md).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable

from absl import logging

from elmo_jax.storage import places


class PlaceLock:
    """An exclusive lock on `directory` (`acquire`/`release`, or a `with` block).

    Args:
      directory: the locked directory (local, or a URL); it must exist locally.
      name: the record file in it ("`.elmo_jax.lock`").
      holder: what the record says about this process (pid, host, started, command).
      describe: a holder record -> the words naming it in messages.
      refused: (the holder's description) -> the exception to raise when another process holds the lock.
      moved: (where the locked directory is now, or None if unknown) -> the exception `check_in_place`
        raises when the path no longer names the locked directory.
      what: how messages name the directory ("the workdir").
    """

    def __init__(
        self,
        directory: str,
        *,
        name: str,
        holder: dict,
        describe: Callable[[dict], str],
        refused: Callable[[str], Exception],
        moved: Callable[[str | None], Exception],
        what: str,
    ):
        self.directory = places.absolute(directory)
        self.path = places.join(self.directory, name)
        self._holder, self._describe, self._refused, self._what = holder, describe, refused, what
        self._moved = moved
        self._fds: list[int] = []
        self._record: int | None = None
        self._locked: int | None = None  # the locked directory's descriptor (local), while held
        self._bucket_lock = None

    def __enter__(self) -> PlaceLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Takes the lock, or raises `refused(...)` (another process holds it) or OSError."""
        if places.is_remote(self.path):
            from elmo_jax.storage.bucket_lock import BucketLock

            self._bucket_lock = BucketLock(
                self.path, self._holder, describe=self._describe, refused=self._refused, what=self._what
            )
            self._bucket_lock.acquire()
            return
        record = self._open_record()
        try:
            locked = self._lock_directory(record)
        except BaseException:
            os.close(record)
            raise
        if not locked:
            return
        previous = _read(record)
        if previous:
            logging.warning(
                "taking over %s: its run (%s) ended without releasing it (killed?)", self.path, self._describe(previous)
            )
        os.ftruncate(record, 0)
        os.lseek(record, 0, os.SEEK_SET)  # (no os.pwrite on Windows)
        os.write(record, (json.dumps(self._holder) + "\n").encode("utf-8"))
        os.fsync(record)
        self._record = record

    def _open_record(self) -> int:
        """The record file's descriptor, created if absent; never through a link (a planted one would
        have a user's file overwritten, then emptied at release), nor anything but a regular file (a FIFO
        there does not block the open: O_NONBLOCK). Where the OS has no O_NOFOLLOW (Windows) the check
        before the open is all there is."""
        if os.path.islink(self.path):
            raise self._link_refused()
        try:
            record = os.open(self.path, os.O_RDWR | os.O_CREAT | NO_LINK_NO_WAIT_BYTES, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP and os.path.islink(self.path):  # O_NOFOLLOW met a link planted since
                raise self._link_refused() from None
            raise type(e)(f"cannot open the lock file {self.path}: {e.strerror}") from None
        if not stat.S_ISREG(os.fstat(record).st_mode):
            os.close(record)
            raise OSError(f"{self.path} is not a regular file, not the lock file of {self._what}: remove it")
        return record

    def _link_refused(self) -> OSError:
        return OSError(
            f"{self.path} is a symbolic link (to {_target(self.path)}), not the lock file of "
            f"{self._what}: refusing to write through it; remove the link"
        )

    def check_in_place(self) -> None:
        """Raises `moved(...)` when the path no longer names the directory this lock holds (renamed,
        or deleted and made again): one `stat`. The held descriptor keeps the locked directory's inode
        number from being reused, so a directory made at the path never passes for it. Nothing to check
        in a bucket (no directories; the lock object's heartbeat watches it), on Windows (see the module
        docstring) or when not held."""
        if self._locked is None:
            return
        try:
            here = os.stat(self.directory)
        except OSError:
            here = None
        if here is None or not os.path.samestat(here, os.fstat(self._locked)):
            raise self._moved(_where(self._locked))

    def _lock_directory(self, record: int) -> bool:
        """`lock_now` on the directory (else on the record file); whether this process now holds it
        (False: the file system has no locks, said in a warning). Windows cannot open a directory as a
        file: there the record file is locked, without a warning."""
        directories = []
        if os.name != "nt":
            directory = os.open(self.directory, os.O_RDONLY)
            self._fds.append(directory)
            self._locked = directory  # kept open while held (`check_in_place`)
            directories.append(directory)
        for fd in (*directories, record):
            try:
                lock_now(fd)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    self.release()
                    raise self._refused(self._describe(_read(record))) from None
                if fd != record:
                    continue
                logging.warning(
                    "cannot lock %s (%s): this file system has no locks; make sure no other process uses %s",
                    self.path,
                    e.strerror,
                    self.directory,
                )
                self._fds.append(record)
                return False
            if fd == record and directories:
                logging.warning(
                    "%s cannot be locked on this file system; %s is locked instead: do not delete it while in use",
                    self.directory,
                    self.path,
                )
            return True
        raise AssertionError("unreachable")

    def release(self) -> None:
        if self._bucket_lock is not None:
            self._bucket_lock.release()
            self._bucket_lock = None
        if self._record is not None:
            try:
                os.ftruncate(self._record, 0)
            finally:
                os.close(self._record)
                self._record = None
        self._locked = None
        while self._fds:
            os.close(self._fds.pop())  # releases the lock


# How the storage layer opens a file it did not make (the lock's record, sync's sources): never through a
# symbolic link, never waiting for a FIFO's writer, bytes as they are. O_NOFOLLOW and O_NONBLOCK exist on
# POSIX only (Windows' file systems have no FIFOs; its callers check for a link before the open), O_BINARY
# on Windows only (without it Windows translates line ends).
NO_LINK_NO_WAIT_BYTES = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
# Where Windows locks the record: one byte far beyond the record's text. Its locks are mandatory (another
# process cannot read a locked byte), and the process that is refused reads the record to name the holder.
WINDOWS_LOCK_OFFSET = 1 << 20


def lock_now(fd: int) -> None:
    """An exclusive lock on the open file (or, on POSIX, directory) `fd`, taken at once or not at all,
    and held until `fd` is closed or the process ends: `flock` on POSIX, `msvcrt.locking` of one byte
    at `WINDOWS_LOCK_OFFSET` on Windows (the file position is left where it was).

    Raises:
      OSError: errno EWOULDBLOCK or EACCES when another open file holds the lock; another errno where
        there are no locks (the file system's, or ENOLCK on a platform with neither call).
    """
    try:
        import fcntl  # POSIX only: imported here so that the package imports on Windows
    except ImportError:
        fcntl = None
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    try:
        import msvcrt  # Windows only
    except ImportError:
        raise OSError(errno.ENOLCK, "this platform has neither flock nor msvcrt.locking") from None
    position = os.lseek(fd, 0, os.SEEK_CUR)
    os.lseek(fd, WINDOWS_LOCK_OFFSET, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    finally:
        os.lseek(fd, position, os.SEEK_SET)


def _target(link: str) -> str:
    try:
        return os.readlink(link)
    except OSError:  # gone since
        return "?"


def _where(directory: int) -> str | None:
    """Where the directory open as `directory` is now (Linux's /proc), or None if unknown or deleted."""
    try:
        path = os.readlink(f"/proc/self/fd/{directory}")
    except OSError:
        return None
    return None if path.endswith(" (deleted)") else path


def _read(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)  # (no os.pread on Windows)
        data = os.read(fd, 65536)
        return json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {"unreadable": True}
