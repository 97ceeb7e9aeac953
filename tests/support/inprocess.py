"""Running a command's `main` inside the test process, as `python -m COMMAND ARGS` would run it.

A refused command costs a subprocess about 3 CPU-seconds, nearly all of it imports; here it costs what
the command itself does. `run_in_process` does what a command's `__main__` block does (`cli.start`):
defines the module's flags, parses the arguments with the module's parser and calls `main` with the
rest, with fresh absl flags each time (those the run defined are removed afterwards, and absl's own
flags and logging verbosity put back). Its standard output and error are captured, and its exit
(`SystemExit`, or `cli.exit_now`, which would end a real process at once) becomes the return code, so
`commands.error_line` checks the result as it checks a subprocess's; logged warnings and errors go to
the captured standard error, as absl's handler sends them to a process's.

What a subprocess shows and this cannot: the exit code the operating system reports, output written
by threads or C++ after the last line, and a crash in interpreter teardown. Each command keeps at least
one real subprocess in the suite for those (docs/TESTING.md lists them).
"""

from __future__ import annotations

import contextlib
import io
import logging as std_logging
import os
import subprocess
import sys
from collections.abc import Iterator

from absl import flags, logging

from elmo_jax import cli
from tests.support.commands import REPO, command_module


class _Exit(SystemExit):
    """`cli.exit_now` in-process: the code a real process would have ended with."""


def _exit_now(code: int) -> None:
    raise _Exit(code)


@contextlib.contextmanager
def _environment(extra: dict[str, str] | None) -> Iterator[None]:
    """`extra` environment variables while the command runs (a value None removes the variable)."""
    previous = {k: os.environ.get(k) for k in extra or {}}
    for k, v in (extra or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# Where the flags a command run defines come from: its module, the shared definitions in `cli`, and
# config_flags' `--config.KEY` overrides (defined by absl's Flag class as the config is parsed).
# Libraries a run imports for the first time (grain, array_record) define flags of their own, which
# they keep reading afterwards: those stay.
_RUN_FLAG_MODULES = ("elmo_jax.cli", "absl.flags._flag")


@contextlib.contextmanager
def _fresh_flags(module_name: str) -> Iterator[None]:
    """Flags the run defines are removed afterwards; absl's own flags and the logging verbosity are
    put back as they were."""
    FLAGS = flags.FLAGS
    before = set(FLAGS)
    level = logging.get_absl_logger().level  # its own level, NOTSET included (get_verbosity resolves it)
    try:
        yield
    finally:
        for name in set(FLAGS) - before:
            if name in FLAGS and FLAGS.find_module_defining_flag(name) in (module_name, *_RUN_FLAG_MODULES):
                delattr(FLAGS, name)
        FLAGS.unparse_flags()
        logging.get_absl_logger().setLevel(level)


def run_in_process(
    command: str, *args, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs `python COMMAND ARGS` (train.py, or a module such as "elmo_jax.vocab") in this process.

    Args:
      command: "train.py" or a command module's name.
      args: its arguments (paths are converted to str).
      input: standard input (e.g. embed_text's sentences).
      env: environment variables set while it runs (None values remove one).

    Returns:
      a CompletedProcess: returncode (0 when `main` returned), the captured stdout and stderr.
    """
    module = command_module(command)
    argv = [command, *(str(a) for a in args)]
    out, err = io.StringIO(), io.StringIO()
    parse = getattr(module, "parse_flags", cli.parse_flags)
    code = 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(_fresh_flags(module.__name__))
        stack.enter_context(_environment(env))
        stack.enter_context(contextlib.chdir(REPO))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(_logged_to(err))
        stack.enter_context(_patched(cli, "exit_now", _exit_now))
        stack.enter_context(_patched(sys, "argv", argv))  # config_flags reads its overrides from sys.argv
        if input is not None:
            stack.enter_context(_patched(sys, "stdin", io.StringIO(input)))
        try:
            if hasattr(module, "define_flags"):
                module.define_flags()
            module.main(parse(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _logged_to(stream: io.StringIO) -> Iterator[None]:
    """Warnings and errors logged while the command runs go to its captured standard error, as absl's
    handler sends them there in a real process (one line each, absl's level letter first)."""
    handler = std_logging.StreamHandler(stream)
    handler.setLevel(std_logging.WARNING)
    handler.setFormatter(std_logging.Formatter("%(levelname).1s %(name)s] %(message)s"))
    root = std_logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


@contextlib.contextmanager
def _patched(owner, name: str, value) -> Iterator[None]:
    previous = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, previous)
