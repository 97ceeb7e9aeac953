"""A training run's working directory: created only once the settings that can be checked cheaply have
passed, so a mistake leaves nothing behind, and held by one run at a time (`WorkdirLock`).

    WORKDIR/
      checkpoints/<step>/   orbax checkpoints (state, data stream position, meta)
      metrics.jsonl         one JSON object per logged step and evaluation
      tensorboard/          TensorBoard event files
      vocab.txt             the vocabulary the run trains with (unless config.data.vocab_file)
      data/                 prepared corpora (unless config.data.cache_dir)
      export/               the model directory written when training ends
      .elmo_jax.lock        who holds the workdir (pid, host, start, command) while a run is using it
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time

import jax
import ml_collections
from absl import logging
from jax.experimental import multihost_utils

from elmo_jax.data.training_corpus import check_data
from elmo_jax.formats import storage

LOCK_FILE = ".elmo_jax.lock"


class WorkdirInUseError(OSError):
    """Another run holds the workdir; the message names it (pid, host, since when, its command)."""


def make_workdir(workdir: str, config: ml_collections.ConfigDict) -> None:
    """Creates `workdir` once the data settings have passed their cheap checks; errors name --workdir."""
    if storage.isfile(workdir):
        raise NotADirectoryError(f"--workdir={workdir}: is a file, expected a directory")
    check_data(config.data)
    try:
        storage.makedirs(workdir)  # a bucket prefix needs no creation
    except OSError as e:
        raise type(e)(e.errno, f"cannot create --workdir={workdir}: {e.strerror}") from None


class WorkdirLock:
    """Holds a workdir for one training run: `with WorkdirLock(workdir): ...`.

    The lock is an exclusive `flock` on WORKDIR/.elmo_jax.lock, which the kernel releases when the
    holder exits or dies, so a killed run never blocks the next one. The file says who holds it (pid,
    host, start time, command), for the one-line error a second run prints. A file that still names a
    holder while nobody holds the lock is what a killed run left: the new run takes over and says so.
    On a clean exit the file is emptied (not removed: another run may be opening it).

    A workdir in Cloud Storage has no flock: the lock there is an object created only if absent
    (`bucket_lock.BucketLock`, docs/CLOUD_STORAGE.md).

    With several processes only process 0 locks; the others learn the outcome from it (one host
    collective), so a refused multi-host run stops on every process at once.
    """

    def __init__(self, workdir: str):
        self.path = storage.join(storage.absolute(workdir), LOCK_FILE)
        self._fd: int | None = None
        self._bucket_lock = None

    def __enter__(self) -> WorkdirLock:
        error = None
        if jax.process_index() == 0:
            try:
                self._acquire()
            except OSError as e:  # every process must hear of any failure, or the others wait forever
                error = e
        if jax.process_count() > 1:
            refused = int(multihost_utils.broadcast_one_to_all(int(error is not None)))
            if refused and error is None:
                raise WorkdirInUseError(f"{self.path}: process 0 could not lock the workdir (see its error line)")
        if error is not None:
            raise error
        return self

    def __exit__(self, *exc) -> None:
        if self._bucket_lock is not None:
            self._bucket_lock.release()
            self._bucket_lock = None
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            finally:
                os.close(self._fd)  # releases the flock
                self._fd = None

    def _acquire(self) -> None:
        if storage.is_remote(self.path):
            from elmo_jax.training.bucket_lock import BucketLock

            self._bucket_lock = BucketLock(self.path, this_process(), describe=_describe, error=WorkdirInUseError)
            self._bucket_lock.acquire()
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise WorkdirInUseError(
                    f"{os.path.dirname(self.path)} is in use by another training run ({_describe(holder)}); "
                    "wait for it to finish or stop it (Ctrl-C or SIGTERM saves a checkpoint), or use another --workdir"
                ) from None
            logging.warning(
                "cannot lock %s (%s): this file system has no locks; make sure no other run uses this workdir",
                self.path,
                e.strerror,
            )
            return
        previous = _read_holder(fd)
        if previous:
            logging.warning(
                "taking over %s: its run (%s) ended without releasing it (killed?)", self.path, _describe(previous)
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(this_process()) + "\n").encode("utf-8"), 0)
        os.fsync(fd)
        self._fd = fd


def this_process() -> dict:
    """Who this process is, as the lock records it."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv)[:500],
    }


def _read_holder(fd: int) -> dict:
    try:
        data = os.pread(fd, 65536, 0)
        return json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {"unreadable": True}


def _describe(holder: dict) -> str:
    if not holder or holder.get("unreadable"):
        return "holder unknown"
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')}, since {holder.get('started')}: "
        f"{holder.get('command', '')}"
    ).rstrip(": ")
