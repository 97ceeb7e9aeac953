"""Stopping training cleanly on SIGTERM (what TPU/GPU preemption sends) or SIGINT (Ctrl-C).

While the loop runs, `stop_signals()` records a request (`runtime.signals.StopSignals`). The loop looks
at it after every step: it finishes the step, saves a checkpoint (unless that step was just saved),
waits for the write and raises `Stopped`, which `train.py` reports before exiting 0; re-running the same
command resumes from that checkpoint. A second SIGINT or SIGTERM is absorbed with one line: raising
inside the checkpoint write or the cleanup the first one started could leave a half-written or
half-deleted step. `kill -9` still stops at once, and the next run resumes from the newest complete
checkpoint.

With several processes every one must stop after the same step (each saves its part of the same
checkpoint): `agree` makes the request global in the one host collective each step already makes.
"""

from __future__ import annotations

import numpy as np

from elmo_jax.runtime import processes
from elmo_jax.runtime.signals import StopSignals


class Stopped(Exception):
    """Training stopped on a signal after saving a checkpoint; the message says how to resume."""

    def __init__(self, signal_name: str, step: int, directory: str):
        super().__init__(
            f"stopped by {signal_name} at step {step}; checkpoint saved in {directory}; re-run the "
            "same command to resume"
        )
        self.signal_name, self.step, self.directory = signal_name, step, directory


def stop_signals() -> StopSignals:
    """Training's stop requests: taken after a step, a second signal absorbed (see the module doc)."""
    return StopSignals(
        second_signal="absorb",
        first_note="stopping after this step, once a checkpoint is saved",
        second_note=(
            "already stopping, waiting for the checkpoint to be saved (kill -9 stops at once; the run then "
            "resumes from the newest complete checkpoint)"
        ),
    )


def stop_if_requested(signals: StopSignals, step: int, checkpoints, agreed: bool = False) -> None:
    """Raises `Stopped` once checkpoint `step` is on disk (`checkpoints.wait()`), if a signal asked to
    stop on any process: all of them call this at the same points (a collective), unless `agreed` says
    they already agreed to stop."""
    if agreed or agree(0, None, signals.requested is not None)[2]:
        checkpoints.wait()
        raise Stopped(signals.requested or "a signal to another process", step, checkpoints.directory)


def agree(positions: int, distinct: int | None, stop: bool) -> tuple[int, int | None, bool]:
    """(the largest char CNN buckets: positions and distinct-token slots (None: every token, the largest),
    whether any process must stop) over all processes: one host collective for all three, so the
    processes compile the same program and stop after the same step."""
    every = np.iinfo(np.int32).max  # None
    mine = np.array([positions, every if distinct is None else distinct, int(stop)], np.int32)
    largest = processes.agree_max_each(mine)
    return int(largest[0]), None if largest[1] == every else int(largest[1]), bool(largest[2])
