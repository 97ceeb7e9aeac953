"""Running the commands as a person does: a subprocess from the repository root, checked for the one
`error:` line a refused command must end with."""

from __future__ import annotations

import contextlib
import importlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from absl import flags

from tests.support.xla_flags import xla_flags

REPO = Path(__file__).resolve().parents[2]

# Runs argv[2:] with every file it writes limited to argv[1] bytes: the limit is set in a small Python
# that then execs the command (no preexec_fn: forking the multithreaded test process to run Python is
# unsafe). SIGXFSZ is ignored, so a write past the limit fails with EFBIG ("File too large").
LIMIT_FILE_SIZE = (
    "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[2:])"
)


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Every file this process writes is limited to `limit` bytes (a full disk: EFBIG, "File too large"),
    in-process: the limit of `LIMIT_FILE_SIZE`, SIGXFSZ ignored, both restored on leaving."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def command_env(devices: int = 1, **extra: str) -> dict[str, str]:
    """The environment of a command under test: this checkout importable, JAX on `devices` CPU devices
    (the session's compilation cache is inherited, see conftest); `extra` variables last."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(devices)}
    env.update(extra)
    return env


def command_argv(command: str, *args) -> list[str]:
    """argv of `python train.py ...` (command "train.py") or `python -m command ...` (a module name)."""
    head = [command] if command.endswith(".py") else ["-m", command]
    return [sys.executable, *head, *(str(a) for a in args)]


def run_command(
    command: str,
    *args,
    timeout: float = 300,
    env: dict | None = None,
    input: str | None = None,
    file_size_limit: int | None = None,
) -> subprocess.CompletedProcess:
    """Runs a command to completion (text output captured).

    Args:
      command: "train.py" or a module such as "elmo_jax.embed_file".
      args: its arguments (paths are converted to str).
      timeout: seconds before the test fails.
      env: the environment (default `command_env()`).
      input: standard input.
      file_size_limit: bytes every file it writes is limited to (a full disk, as RLIMIT_FSIZE).
    """
    argv = command_argv(command, *args)
    if file_size_limit is not None:
        argv = [sys.executable, "-c", LIMIT_FILE_SIZE, str(file_size_limit), *argv[1:]]
    return subprocess.run(
        argv, cwd=REPO, env=env or command_env(), capture_output=True, text=True, timeout=timeout, input=input
    )


def error_line(result: subprocess.CompletedProcess, *expected: str) -> str:
    """Checks a refused command — exit 1, no traceback, exactly one `error:` line and it ends the
    output, its text said nowhere before it (no log line of the same error), containing each of
    `expected` — and returns that line."""
    assert result.returncode == 1, f"exit code {result.returncode}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert result.stderr.rstrip().splitlines()[-1] == errors[0], "the error line must end the output"
    # Said once: not also as a log line before it (issue #51: train.py logged each error, then printed it).
    before = " ".join(result.stderr.rstrip().rsplit("\n", 1)[0].split()) if "\n" in result.stderr.strip() else ""
    assert errors[0][len("error: ") :] not in before, f"the error is said twice:\n{result.stderr[-3000:]}"
    for part in expected:
        assert part in errors[0], (part, errors[0])
    return errors[0]


def command_module(command: str):
    """The module of a command named as `elmo_jax.NAME` or as a script (`train.py`: the module of the `main`
    it imports, elmo_jax.train, which defines the flags and holds the usage)."""
    module = importlib.import_module(command[: -len(".py")] if command.endswith(".py") else command)
    return importlib.import_module(module.main.__module__) if hasattr(module, "main") else module


def defined_flags(command: str) -> set[str]:
    """The flags the command's `define_flags` defines (its own and the shared ones of cli), removed again."""
    module = command_module(command)
    if not hasattr(module, "define_flags"):
        return set()
    before = set(flags.FLAGS)
    try:
        module.define_flags()
        return set(flags.FLAGS) - before
    finally:
        for name in set(flags.FLAGS) - before:
            delattr(flags.FLAGS, name)
