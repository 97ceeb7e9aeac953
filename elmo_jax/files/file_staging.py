"""The staging directory of an `embed_file` run, from taking it to removing it.

A run works in a staging directory next to its output (`formats.vector_spool`: the spool of finished
vectors, then the finished file). This module decides what becomes of it:

- taken: a killed run's with the same identity (`vector_spool.adopt`), or a new one (`open_spool`);
  never beside another live run writing the same output (`refuse_another_writer`, one line naming it);
- ended early (`ended_early`): a stop (SIGTERM, Ctrl-C, also one that the code it landed in turned into
  an error: `runtime.signals`) or the loss of another process of the run keeps it, synced, for the same
  command to continue, and says where; an error removes it, so a full disk gets its space back;
- finished (`put_in_place`): the finished file is renamed onto the output, then the directory removed,
  with signals waiting; if anything ends that early, the run is resumable while the file is not in
  place and finished once it is (the directory is removed all the same).

So at every moment a run is finished (the output complete under its name, nothing staged) or resumable
(the output untouched, the staging directory kept), never neither.
"""

from __future__ import annotations

import os

from absl import logging

from elmo_jax.formats import vector_spool
from elmo_jax.runtime import processes
from elmo_jax.runtime.signals import StopSignals
from elmo_jax.storage import atomic


def open_spool(target: str, identity: dict, resume: bool, shown: str) -> tuple[str, vector_spool.Spool]:
    """The staging directory and spool of this run: a killed run's with the same identity, or a new one."""
    found = vector_spool.adopt(target, identity, logging.warning) if resume else None
    if found is not None:
        staging, pid = found
        try:
            spool = vector_spool.Spool.open(staging, identity, shown)
        except OSError as e:
            logging.warning(
                "not resuming from %s (left by pid %d): cannot read it (%s); starting over", staging, pid, e
            )
            vector_spool.remove(staging)
        else:
            logging.warning(
                "resuming the run of pid %d: %d sentences already embedded are taken from %s",
                pid,
                len(spool.pieces.lines()),
                staging,
            )
            return staging, spool
    try:
        staging = atomic.temporary_directory(target)
    except OSError as e:
        raise named(f"{shown}: cannot create its staging directory", e) from None
    try:
        return staging, vector_spool.Spool.create(staging, identity, shown)
    except BaseException:  # nothing was embedded yet: nothing to keep
        vector_spool.remove(staging)
        raise


class OutputInUse(ValueError):
    """Another run is writing the same output."""


def refuse_another_writer(target: str, shown: str, ours=()) -> None:
    """Raises `OutputInUse` naming it when a live process of this host other than this run's (its staging
    directories `ours`) holds a staging directory of `target`: two runs never write one output at once."""
    for staging, pid in atomic.live_staging(target):
        if pid != os.getpid() and staging not in ours:
            raise OutputInUse(
                f"{shown} is being written by another run (pid {pid} on this host, staging directory {staging}); "
                "wait for it to finish or stop it (the same command then continues from what it did), or choose "
                "another --output"
            )


def ended_early(failure: BaseException, stops: StopSignals, spool, staging: str, shown: str) -> BaseException:
    """What to raise when a run ends before its output is in place. A stop (a signal, also one that the
    code it landed in turned into an error) and a lost process keep the staging directory, synced, for
    the next run, and say so; an error removes it (unless another writer was found while it held a
    stopped run's sentences)."""
    kept = len(spool.pieces.lines())
    lost = isinstance(failure, processes.ProcessLost)
    if isinstance(failure, Exception) and not (stops.stopped or lost or (isinstance(failure, OutputInUse) and kept)):
        spool.close()
        vector_spool.remove(staging)
        return failure
    try:
        spool.sync()
    except OSError:  # a full disk: what reached the files is kept, the journal's CRCs tell what is whole
        pass
    spool.close()
    where = f"the {kept:,} sentences embedded so far are kept in {staging}"
    if lost:
        return processes.ProcessLost(
            f"{shown}: {failure}; {where}; run the same commands again (every process) to continue from them"
        )
    if isinstance(failure, OutputInUse):
        return OutputInUse(f"{failure}; {where} for this command to continue from them later")
    if isinstance(failure, Exception):  # the code the signal landed in turned it into an error: a stop
        try:
            stops.raise_stop()
        except BaseException as stop:
            failure = stop
    failure.add_note(f"{where}; run the same command again to continue from them")
    return failure


def put_in_place(staged: str | None, target: str, staging: str, spool, stops: StopSignals, shown: str) -> None:
    """Process 0 renames the finished file `staged` onto `target`, then every process removes its staging
    directory; signals wait until both are done. Ended early anyway (an error, an exception), the run is
    resumable while the file is not in place (`ended_early`), and finished once it is (the staging
    directory is removed all the same)."""
    with stops.finishing():
        try:
            if staged is not None:
                try:
                    atomic.publish_file(staged, target)  # synced, renamed into place (storage/atomic.py's policy)
                except OSError as e:
                    raise named(f"{shown}: putting the finished file in place failed", e) from None
            processes.barrier("embed_file: written")  # process 0 has read every spool
        except BaseException as failure:
            if staged is None or os.path.exists(staged):  # the output is untouched
                raise ended_early(failure, stops, spool, staging, shown)  # noqa: B904
            vector_spool.remove(staging)
            if not isinstance(failure, processes.ProcessLost):
                raise
            logging.warning("%s; the output %s was complete before", failure, target)
            return
        try:
            vector_spool.remove(staging)
        except BaseException:  # the output is in place: nothing of the run may stay
            vector_spool.remove(staging)
            raise


def named(message: str, error: OSError) -> OSError:
    """An OSError saying `message` (naming --output) with `error`'s errno and text."""
    renamed = OSError(f"{message} ({error})")
    renamed.errno = error.errno
    return renamed
