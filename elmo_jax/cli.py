"""How the command-line tools start and end: one line on standard error, never a traceback.

    def main(argv):
        cli.run_main(run, argv)

    if __name__ == "__main__":
        cli.start(main, define_flags)

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

from absl import app, flags


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


def define_distributed_flags() -> None:
    """The flags of a command that runs as one of several processes (train.py, embed_file), read by
    `distributed_start_args`."""
    flags.DEFINE_bool(
        "distributed",
        False,
        "Run as one of several processes: jax.distributed.initialize() with the flags below, the JAX_* "
        "variables, or the cluster JAX detects (TPU pod slices, SLURM).",
    )
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (implies --distributed).")
    flags.DEFINE_integer("num_processes", None, "How many processes take part (implies --distributed).")
    flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes) (implies --distributed).")


def distributed_start_args() -> tuple[bool, str | None, int | None, int | None]:
    """(distributed, coordinator_address, num_processes, process_id) from the parsed flags of
    `define_distributed_flags`, as `training.multihost.start` takes them."""
    f = flags.FLAGS
    return f.distributed, f.coordinator_address, f.num_processes, f.process_id


def start(
    main: Callable[[list[str]], object],
    define_flags: Callable[[], object] | None = None,
    flags_parser: Callable[[list[str]], list[str]] | None = None,
) -> None:
    """A command's `__main__` block: defines its flags (only when run as a program, so importing the
    module adds no global flags), parses them (`flags_parser`, default `parse_flags`) and runs `main`
    with the remaining arguments under absl (logging set up as absl sets it up)."""
    if define_flags is not None:
        define_flags()
    app.run(main, flags_parser=flags_parser or parse_flags)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with a bad flag reported like any other input error: one line, exit code 1
    (`app.run(main, flags_parser=cli.parse_flags)`)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
