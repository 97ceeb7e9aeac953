"""An exclusive lock on a directory, local or in a bucket, held by one process at a time and naming its
holder: `with PlaceLock(directory, ...): ...`.

Locally the lock is an `flock` on the directory itself, which the kernel releases when the holder exits
or dies, so a killed holder never blocks the next one; and since it is the directory that is locked,
deleting the record file (the usual reflex for a lock believed stale) does not unlock it. The record
file in the directory (`name`) says who holds it (pid, host, start time, command) for the refusal
message; one that still names a holder while nobody holds the lock is what a killed holder left, and is
taken over with a warning. On a clean exit it is emptied. Where a file system cannot lock a directory
(some network file systems), the record file itself is locked instead, with a warning that deleting it
would undo the lock.

In a bucket there is no `flock`: the lock is the record object, created only if absent and kept alive by
a heartbeat (`bucket_lock.BucketLock`, docs/CLOUD_STORAGE.md).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
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
        what: str,
    ):
        self.directory = places.absolute(directory)
        self.path = places.join(self.directory, name)
        self._holder, self._describe, self._refused, self._what = holder, describe, refused, what
        self._fds: list[int] = []
        self._record: int | None = None
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
        record = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        os.pwrite(record, (json.dumps(self._holder) + "\n").encode("utf-8"), 0)
        os.fsync(record)
        self._record = record

    def _lock_directory(self, record: int) -> bool:
        """flock on the directory (else on the record file); whether this process now holds it (False:
        the file system has no locks, said in a warning)."""
        directory = os.open(self.directory, os.O_RDONLY)
        self._fds.append(directory)
        for fd, fallback in ((directory, False), (record, True)):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    self.release()
                    raise self._refused(self._describe(_read(record))) from None
                if not fallback:
                    continue
                logging.warning(
                    "cannot lock %s (%s): this file system has no locks; make sure no other process uses %s",
                    self.path,
                    e.strerror,
                    self.directory,
                )
                self._fds.append(record)
                return False
            if fallback:
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
        while self._fds:
            os.close(self._fds.pop())  # releases the flock


def _read(fd: int) -> dict:
    try:
        data = os.pread(fd, 65536, 0)
        return json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {"unreadable": True}
