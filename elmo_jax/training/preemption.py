"""Stopping training cleanly on SIGTERM (what TPU/GPU preemption sends) or SIGINT (Ctrl-C).

The handlers only record the request. The training loop looks at it after every step: it finishes the
step, saves a checkpoint (unless that step was just saved), waits for the write and raises `Stopped`,
which `train.py` reports before exiting 0; re-running the same command resumes from that checkpoint.
Handlers are installed only while the loop runs and the previous ones are put back afterwards. A second
SIGINT or SIGTERM is absorbed with one line: raising inside the checkpoint write or the cleanup the first
one started could leave a half-written or half-deleted step. `kill -9` still stops at once, and the next
run resumes from the newest complete checkpoint.

With several processes every one must stop after the same step (each saves its part of the same
checkpoint): `agree` makes the request global in the one host collective each step already makes.
"""

from __future__ import annotations

import signal
import sys
import threading

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """Training stopped on a signal after saving a checkpoint; the message says how to resume."""

    def __init__(self, signal_name: str, step: int, directory: str):
        super().__init__(
            f"stopped by {signal_name} at step {step}; checkpoint saved in {directory}; re-run the "
            "same command to resume"
        )
        self.signal_name, self.step, self.directory = signal_name, step, directory


class StopSignals:
    """Context manager: while active, SIGTERM and SIGINT set `received` (the signal's name) instead of
    killing the process. Outside the main thread (where Python cannot install handlers) it does nothing."""

    def __init__(self):
        self.received: str | None = None
        self._repeated = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def stop_if_requested(self, step: int, checkpoints, agreed: bool = False) -> None:
        """Raises `Stopped` once checkpoint `step` is on disk (`checkpoints.wait()`), if a signal asked
        to stop on any process: all of them call this at the same points (a collective), unless
        `agreed` says they already agreed to stop."""
        if agreed or agree(0, None, self.received is not None)[2]:
            checkpoints.wait()
            raise Stopped(self.received or "a signal to another process", step, checkpoints.directory)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            logging.warning("%s received: stopping after this step, once a checkpoint is saved", name)
            return
        # A second signal must not interrupt the checkpoint write or the cleanup that the first started
        # (raising here could leave a half-written or half-deleted step): it is absorbed.
        if not self._repeated:
            self._repeated = True
            print(
                f"{name} again: already stopping, waiting for the checkpoint to be saved (kill -9 stops at "
                "once; the run then resumes from the newest complete checkpoint)",
                file=sys.stderr,
                flush=True,
            )


def agree(positions: int, distinct: int | None, stop: bool) -> tuple[int, int | None, bool]:
    """(the largest char CNN buckets: positions and distinct-token slots (None: every token, the largest),
    whether any process must stop) over all processes: one host collective for all three, so the
    processes compile the same program and stop after the same step."""
    if jax.process_count() == 1:
        return positions, distinct, stop
    every = np.iinfo(np.int32).max  # None
    mine = np.array([positions, every if distinct is None else distinct, int(stop)], np.int32)
    largest = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 3).max(axis=0)
    return int(largest[0]), None if largest[1] == every else int(largest[1]), bool(largest[2])
