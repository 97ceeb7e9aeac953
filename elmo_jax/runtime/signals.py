"""Stopping a long run at a safe point on SIGINT (Ctrl-C) or SIGTERM (what TPU/GPU preemption, a job
scheduler or `kill` sends): training finishes its step and saves a checkpoint, the file pipeline stops
between batches and lines where everything it has written is whole.

A handler that raises (Ctrl-C's KeyboardInterrupt, the commands' `cli.Terminated`) raises in whatever
code the main thread runs at that instant, and the code there may lose the exception or turn it into
another one. JAX does both while it traces a new shape: its garbage-collection callback reports the
exception as "Exception ignored" and goes on, and bare `except:` clauses take it for a failed
conversion (measured: 32 of 379 KeyboardInterrupts landing while the biLM was traced and lowered were
lost). A lost stop lets a stopped run go on; a stop turned into an error can throw away the progress
that the next run would continue from.

So while `StopSignals` is active, SIGINT and SIGTERM only record the request (`received`, `requested`).
The run acts on it at its own safe points, in one of two ways:
- it polls `requested` and stops itself (training: after the step, once a checkpoint is saved);
- it calls `check()`, which hands the signal to the handler that was there before (a Python handler
  raises there, in the run's own code; the default action ends the process there; an ignored signal
  stays ignored). Whatever that exception becomes on its way out, the run knows it was asked to stop
  (`stopped`).
Inside `finishing()` (the finished output being put in place) signals are only recorded: a stop there
comes too late to leave the run unfinished, so the run finishes and says so.

What a second signal does is the run's policy (`second_signal`): "absorb" (training: raising inside the
checkpoint write or the cleanup the first one started could leave a half-written or half-deleted step;
one line says so) or "at_once" (the file pipeline: it is handed on at once, so a run waiting on
something slow can still be stopped at once). `kill -9` always stops at once, and the next run
continues from what is whole on disk.

Handlers are installed only while the run is active, only in the main thread (where Python allows
them), and the previous ones are put back afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from absl import logging

SIGNALS = (signal.SIGINT, signal.SIGTERM)
SECOND_SIGNAL_POLICIES = ("absorb", "at_once")


class StopSignals:
    """A context manager: while active, SIGINT and SIGTERM are requests the run takes at its safe points
    (see the module doc).

    Args:
      second_signal: "absorb" (a second signal is reported once and otherwise ignored) or "at_once" (it
        is handed to the previous handler at once).
      first_note: logged as a warning when the first signal arrives, after the signal's name (e.g.
        "stopping after this step, once a checkpoint is saved"); None: nothing is logged.
      second_note: printed to standard error, after the signal's name, the first time a second signal
        is absorbed.
    """

    def __init__(self, second_signal: str = "at_once", first_note: str | None = None, second_note: str = ""):
        if second_signal not in SECOND_SIGNAL_POLICIES:
            raise ValueError(f"second_signal: expected one of {SECOND_SIGNAL_POLICIES}, found {second_signal!r}")
        self.second_signal, self.first_note, self.second_note = second_signal, first_note, second_note
        self.received: list[int] = []  # every signal that came, in order
        self._pending: list[int] = []  # recorded, not yet handed to the previous handler by `check`
        self._previous: dict[int, object] = {}
        self._finishing = self._absorbed = False

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @property
    def stopped(self) -> bool:
        """Whether a signal asked the run to stop (also one that was lost or changed on its way)."""
        return bool(self.received)

    @property
    def requested(self) -> str | None:
        """The first signal's name ("SIGTERM"), or None while none came."""
        return signal.Signals(self.received[0]).name if self.received else None

    def check(self) -> None:
        """A safe point: hands a recorded signal to the handler it replaced (which raises here)."""
        while self._pending and not self._finishing:
            self._hand_on(self._pending.pop(0))

    def raise_stop(self) -> None:
        """Hands the first signal on again (after the code it interrupted turned its exception into an
        error); returns only when that handler does not raise."""
        self._hand_on(self.received[0])

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """Signals are only recorded inside the block; one that came (also since the last `check`) is
        logged as too late afterwards, and not raised."""
        self._finishing = True
        try:
            yield
        finally:
            self._finishing = False
            late, self._pending = self._pending, []
            if late:
                logging.warning(
                    "%s came while the finished output was being put in place: too late to stop the run, which "
                    "finished",
                    signal.Signals(late[0]).name,
                )

    def _record(self, signum: int, frame) -> None:
        self.received.append(signum)
        name = signal.Signals(signum).name
        if len(self.received) == 1:
            self._pending.append(signum)
            if self.first_note:
                logging.warning("%s received: %s", name, self.first_note)
        elif self._finishing:
            self._pending.append(signum)
        elif self.second_signal == "at_once":
            self._hand_on(signum)
        elif not self._absorbed:  # absorbed: the stop the first signal started must not be interrupted
            self._absorbed = True
            print(f"{name} again: {self.second_note}", file=sys.stderr, flush=True)

    def _hand_on(self, signum: int) -> None:
        """What the handler this one replaced would have done with `signum`."""
        handler = self._previous.get(signum, signal.getsignal(signum))
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:  # the default action (SIGTERM, SIGINT without Python's): end here
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
