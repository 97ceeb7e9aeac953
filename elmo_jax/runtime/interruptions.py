"""SIGINT and SIGTERM during `embed_file`, acted on where what the run has written is whole.

A signal handler that raises (Ctrl-C's KeyboardInterrupt, the commands' `cli.Terminated`) raises in
whatever code the main thread runs at that instant, and the code there may lose the exception or turn
it into another one. JAX does both while it traces a new batch shape: its garbage-collection callback
reports the exception as "Exception ignored" and goes on, and bare `except:` clauses take it for a
failed conversion (measured: 32 of 379 KeyboardInterrupts landing while the biLM was traced and
lowered were lost). A lost stop lets a stopped run go on; a stop turned into an error made
`embed_file` remove the spool the next run would have continued from.

So while an `embed_file` run holds its staging directory, `Interruptions` replaces the Python handlers
of SIGINT and SIGTERM with one that records the signal; the run calls `check()` where everything it has
written is whole (between lines and batches, between the lines of the final file), which calls the
handler it replaced there, so the stop is raised in the run's own code. A second signal calls it at
once (a run waiting on something slow can still be stopped at once), and whatever that exception
becomes, the run knows it was asked to stop (`stopped`). Inside `finishing()` (the finished file put
in place, the staging directory removed) signals are only recorded: a stop there comes too late to
leave the run unfinished, so the run finishes and says so.

Handlers that are not Python functions are left alone (SIGTERM's default action ends the process at
once, like `kill -9`, which leaves the spool for the next run), and so is everything outside the main
thread, where Python cannot install handlers.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from absl import logging

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interruptions:
    """A context manager: while active, SIGINT and SIGTERM are taken at `check()` (see the module doc)."""

    def __init__(self):
        self.received: list[int] = []  # every signal that came, in order
        self._pending: list[int] = []  # recorded, not yet handed to the replaced handler
        self._replaced: dict[int, object] = {}
        self._finishing = False

    def __enter__(self) -> Interruptions:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                handler = signal.getsignal(signum)
                if callable(handler):
                    self._replaced[signum] = handler
                    signal.signal(signum, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._replaced.items():
            signal.signal(signum, handler)
        self._replaced.clear()

    @property
    def stopped(self) -> bool:
        """Whether a signal asked the run to stop (also one that was lost or changed on its way)."""
        return bool(self.received)

    def check(self) -> None:
        """Hands a recorded signal to the handler it replaced, which raises here (a stop point)."""
        while self._pending and not self._finishing:
            self._call(self._pending.pop(0))

    def raise_stop(self) -> None:
        """Raises the first signal's exception again (after the code it interrupted turned it into an
        error); returns only when that handler does not raise."""
        self._call(self.received[0])

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
        if len(self.received) == 1 or self._finishing:
            self._pending.append(signum)
        else:
            self._call(signum)

    def _call(self, signum: int) -> None:
        handler = self._replaced.get(signum, signal.getsignal(signum))
        if callable(handler):
            handler(signum, None)
