"""A copy of a training workdir kept somewhere that outlives the machine: the training notebook trains
on the runtime's own disk and copies the workdir to Google Drive after each checkpoint
(`train_and_evaluate(..., after_checkpoint=...)`), and a new runtime copies it back before it resumes.

Training in the copy's place directly would work too, but Drive's mount uploads lazily and is flushed
only by unmounting it, which a run holding files open there (its lock, its logs) cannot do.

What is copied: everything a resumed run or a reader needs (complete checkpoints, each appearing whole;
metrics.jsonl; TensorBoard events; the vocabulary; prepared data; the export). What is not: the
workdir lock (the copy is nobody's run), a checkpoint still being written and the old steps orbax is
removing (`storage.sync_directory` does the copying), nor symbolic links, FIFOs and sockets (counted in
the step's line).

The copy only ever touches its own (`storage.sync_directory`): its place must be a new or empty folder
or an earlier copy (marked by its first sync), never a folder of the user's, which a copy would empty;
`restore`, which the notebook calls before training, refuses any other in one line.
"""

from __future__ import annotations

import os
import time

from absl import logging

from elmo_jax import storage
from elmo_jax.training.checkpoint import DELETING, TMP_SUFFIX
from elmo_jax.training.workdir import LOCK_FILE


def copy_workdir(source: str, target: str) -> storage.SyncStats:
    """Makes the local directory `target` a copy of the workdir `source`, copying only what changed; call
    it between checkpoints (`after_checkpoint`), or on a workdir no run is using."""
    return storage.sync_directory(source, target, skip=_not_copied)


def _not_copied(relative: str) -> bool:
    """Whether a path in a workdir (relative, '/'-separated) is left out of its copy."""
    if relative == LOCK_FILE:
        return True
    parts = relative.split("/")
    return len(parts) == 2 and parts[0] == "checkpoints" and (TMP_SUFFIX in parts[1] or parts[1] == DELETING)


class WorkdirCopy:
    """A workdir on this machine's disk with its copy at `target` (e.g. on Google Drive), kept by
    `train_and_evaluate(config, workdir, after_checkpoint=copy)`.

    Args:
      workdir: the local workdir training writes.
      target: where its copy lives, outliving the machine.
      flush: makes what was copied durable at `target` (on Colab: flushing Drive's mount), or None; called
        after a copy at most every `flush_every_s` seconds, and always by `finish`.
      clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, workdir: str, target: str, flush=None, flush_every_s: float = 600.0, clock=time.monotonic):
        self.workdir, self.target = workdir, target
        self._flush, self._flush_every_s, self._clock = flush, flush_every_s, clock
        self._flushed_at = clock()

    def restore(self) -> bool:
        """Before training: when the local workdir has no checkpoint and the copy has, copies the copy back
        (a new machine continues the run); returns whether it did.

        Raises:
          ValueError: `target` cannot be the copy (a folder that is not a copy, or nested with the
            workdir: `storage.check_copy_target`), before anything is written.
        """
        storage.check_copy_target(self.workdir, self.target)
        if _has_checkpoints(self.workdir) or not _has_checkpoints(self.target):
            return False
        stats = copy_workdir(self.target, self.workdir)
        logging.info(
            "copied %s back to %s (%d files, %.1f MB%s)",
            self.target,
            self.workdir,
            stats.files,
            stats.bytes / 1e6,
            stats.skipped_note(),
        )
        return True

    def __call__(self, step: int) -> None:
        """`after_checkpoint`: copies the workdir, and flushes when the last flush is old enough."""
        stats = copy_workdir(self.workdir, self.target)
        flush = self._flush is not None and self._clock() - self._flushed_at >= self._flush_every_s
        logging.info(
            "step %d: copied %d files (%.1f MB) to %s%s%s",
            step,
            stats.files,
            stats.bytes / 1e6,
            self.target,
            stats.skipped_note(),
            "; flushing" if flush else "",
        )
        if flush:
            self.flush()

    def finish(self) -> None:
        """After training (also an interrupted one): a last copy, flushed."""
        copy_workdir(self.workdir, self.target)
        self.flush()

    def flush(self) -> None:
        if self._flush is not None:
            self._flush()
        self._flushed_at = self._clock()


def _has_checkpoints(workdir: str) -> bool:
    directory = os.path.join(workdir, "checkpoints")
    return os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))
