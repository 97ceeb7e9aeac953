"""How the command-line tools end: one line on standard error, never a traceback.

    def main(argv):
        cli.run_main(run, argv)

A person's mistake or a broken file (ValueError, OSError) prints `error: ...` and exits 1. SIGTERM
(`timeout`, Slurm, `docker stop`) is turned into an exception like Ctrl-C, so the tool's cleanup runs
(temporary outputs are removed) before it exits 143 (SIGTERM) or 130 (SIGINT) with a one-line note.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable

from absl import flags


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, like KeyboardInterrupt, so `except Exception` does not hide it)."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises():
    """While active, SIGTERM raises `Terminated` in the main thread (so cleanup code runs) instead of
    killing the process."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_now(code: int) -> None:
    """Flushes the standard streams and ends the process at once, skipping interpreter teardown: for
    after the one error line, when background threads (XLA, orbax) could still print or hang on exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_main(run: Callable[[], object], argv: list[str] | None = None, hint: str = "") -> None:
    """Calls `run()` and turns its failures and interruptions into one line and an exit code.

    Args:
      run: the tool's work.
      argv: absl's remaining arguments, which must be only the program name; None when the tool takes
        positional arguments itself.
      hint: appended to the "unexpected arguments" error (e.g. which flag takes them).
    """
    if argv is not None and len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}{hint}", file=sys.stderr)
        sys.exit(1)
    try:
        with sigterm_raises():
            run()
    except (ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    except (KeyboardInterrupt, Terminated) as e:
        notes = "".join(f"; {note}" for note in getattr(e, "__notes__", ()))  # e.g. where the progress is kept
        print(
            f"stopped by {signal_name(e)}: nothing was written under the output name (existing outputs are "
            f"untouched){notes}",
            file=sys.stderr,
        )
        # The cleanup has run; skip interpreter teardown, which can crash while XLA still runs the batch
        # that was in flight (observed: a segfault after the message).
        exit_now(interrupted_exit_code(e))


def signal_name(interruption: BaseException) -> str:
    """ "SIGTERM" for `Terminated`, "SIGINT" for KeyboardInterrupt."""
    return "SIGTERM" if isinstance(interruption, Terminated) else "SIGINT"


def interrupted_exit_code(interruption: BaseException) -> int:
    """The shell's exit code for a process ended by that signal: 143 (SIGTERM) or 130 (SIGINT)."""
    return 143 if isinstance(interruption, Terminated) else 130


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with a bad flag reported like any other input error: one line, exit code 1
    (`app.run(main, flags_parser=cli.parse_flags)`)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
