"""How the command-line tools end: one line on standard error, never a traceback.

    def main(argv):
        cli.run_main(run, argv)

A person's mistake or a broken file (ValueError, OSError) prints `error: ...` and exits 1. SIGTERM
(`timeout`, Slurm, `docker stop`) is turned into an exception like Ctrl-C, so the tool's cleanup runs
(temporary outputs are removed) before it exits 143 (SIGTERM) or 130 (SIGINT) with a one-line note.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, like KeyboardInterrupt, so `except Exception` does not hide it)."""


def _raise_terminated(signum, frame):
    raise Terminated()


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
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        run()
    except (ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    except (KeyboardInterrupt, Terminated) as e:
        name = "SIGTERM" if isinstance(e, Terminated) else "SIGINT"
        print(
            f"stopped by {name}: nothing was written under the output name (existing outputs are untouched)",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        # The cleanup has run; skip interpreter teardown, which can crash while XLA still runs the batch
        # that was in flight (observed: a segfault after the message).
        os._exit(143 if name == "SIGTERM" else 130)
    finally:
        signal.signal(signal.SIGTERM, previous)
