"""A training run's working directory: created only once the settings that can be checked cheaply have
passed, so a mistake leaves nothing behind, and held by one run at a time (`WorkdirLock`).

    WORKDIR/
      checkpoints/<step>/   orbax checkpoints (state, data stream position, meta)
      metrics.jsonl         one JSON object per logged step and evaluation
      tensorboard/          TensorBoard event files
      vocab.txt             the vocabulary the run trains with (unless config.data.vocab_file)
      data/                 prepared corpora (unless config.data.cache_dir)
      export/               the model directory written when training ends
      .elmo_jax.lock        who holds the workdir (pid, host, start, command) while a run is using it (the lock
                            itself is on the workdir directory: deleting this file does not undo it)
"""

from __future__ import annotations

import os
import socket
import sys
import time

import jax

from elmo_jax import storage
from elmo_jax.runtime import processes

LOCK_FILE = ".elmo_jax.lock"


class WorkdirInUseError(OSError):
    """Another run holds the workdir; the message names it (pid, host, since when, its command)."""


class WorkdirMovedError(OSError):
    """The workdir's path no longer names the directory this run locked (renamed, or deleted and made
    again, perhaps by another run): the run stops rather than write into what is there now."""


def make_workdir(workdir: str) -> None:
    """Creates `workdir` (the config has passed `settings.check_config`); errors name --workdir."""
    if storage.isfile(workdir):
        raise NotADirectoryError(f"--workdir={workdir}: is a file, expected a directory")
    problem = storage.creation_problem(workdir, parents=True)  # e.g. a bucket that does not exist
    if problem is not None:
        raise type(problem)(f"--workdir={workdir}: {problem}")
    try:
        storage.makedirs(workdir)  # a bucket prefix needs no creation
    except OSError as e:
        # One argument, so the message reads without OSError's "[Errno N]" prefix; errno kept for callers.
        error = type(e)(f"--workdir={workdir}: cannot create it: {e.strerror or e}")
        error.errno = e.errno
        raise error from None


class WorkdirLock:
    """Holds a workdir for one training run: `with WorkdirLock(workdir): ...`.

    A `storage.PlaceLock` on the workdir: locally an `flock` on the workdir directory itself, released by
    the kernel when the holder exits or dies (a killed run never blocks the next one) and not undone by
    deleting WORKDIR/.elmo_jax.lock, the file that says who holds it (pid, host, start time, command) for
    the one-line error a second run prints; in a bucket an object created only if absent, with a
    heartbeat (docs/CLOUD_STORAGE.md).

    With several processes only process 0 locks; the others learn the outcome from it (one host
    collective), so a refused multi-host run stops on every process at once.

    `check()` before each write by the workdir's path (a metrics record, a checkpoint, the export): a
    workdir renamed or replaced while the run trains (and perhaps now another run's) stops the run
    with `WorkdirMovedError` instead of being written into.
    """

    def __init__(self, workdir: str):
        directory = storage.absolute(workdir)
        self.path = storage.join(directory, LOCK_FILE)
        self._lock = storage.PlaceLock(
            directory,
            name=LOCK_FILE,
            holder=this_process(),
            describe=_describe,
            refused=lambda holder: WorkdirInUseError(
                f"{directory} is in use by another training run ({holder}); wait for it to finish or stop it "
                "(Ctrl-C or SIGTERM saves a checkpoint), or use another --workdir"
            ),
            moved=lambda where: WorkdirMovedError(
                f"the workdir {directory} is no longer the directory this run locked (moved or replaced"
                + (f"; it is now {where}" if where else "")
                + "): stopping; nothing more is written"
            ),
            what="the workdir",
        )

    def __enter__(self) -> WorkdirLock:
        error = None
        if jax.process_index() == 0:
            try:
                self._lock.acquire()
            except OSError as e:  # every process must hear of any failure, or the others wait forever
                error = e
        if jax.process_count() > 1:
            refused = processes.agree_max(int(error is not None))  # only process 0 can have failed
            if refused and error is None:
                raise WorkdirInUseError(f"{self.path}: process 0 could not lock the workdir (see its error line)")
        if error is not None:
            raise error
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def check(self) -> None:
        """Raises `WorkdirMovedError` when the workdir's path no longer names the directory this run
        locked: one `stat` (nothing on the processes that do not hold the lock, nor in a bucket)."""
        self._lock.check_in_place()


def this_process() -> dict:
    """Who this process is, as the lock records it."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv)[:500],
    }


def _describe(holder: dict) -> str:
    if not holder or holder.get("unreadable"):
        return "holder unknown"
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')}, since {holder.get('started')}: "
        f"{holder.get('command', '')}"
    ).rstrip(": ")
