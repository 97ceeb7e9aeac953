"""How the command-line tools start and end: one line on standard error, never a traceback.

    def define_flags():
        cli.define_model_flags()          # flags several commands share are defined here, once
        flags.DEFINE_string(...)

    def main(argv):
        cli.run_main(run, argv)

    if __name__ == "__main__":
        cli.start(main, define_flags)

Before its work, `run_main` checks the flags that need no library (the shared ones' rules, then the
command's own `check`: a required flag, two flags that go together, --plot without matplotlib), so such a
mistake is refused before JAX is imported, and turns on the persistent compilation cache
(`storage.compile_cache`) for a command that defines --compilation_cache.

A person's mistake or a broken file (ValueError, OSError) prints `error: ...` and exits 1. SIGTERM
(`timeout`, Slurm, `docker stop`) is turned into an exception like Ctrl-C, so the tool's cleanup runs
(temporary outputs are removed) before it exits 143 (SIGTERM) or 130 (SIGINT) with a one-line note. A
command with more kinds of ending (train.py: a stop that saved a checkpoint, a failed checkpoint write)
says so in `run_main`'s arguments. `--help` prints the command's usage (its module docstring) and its
own flags, shared ones included, and exits 0. Output into a pipe whose reader has gone (`--help | head`)
ends the command quietly, with the status of a process SIGPIPE ended (141).

This module imports absl and the standard library alone (the modules of the checks and of the cache
inside the functions that use them): every command imports it before its flags are parsed, and `--help`
must answer without importing JAX.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging as std_logging
import os
import select
import signal
import sys
from collections.abc import Callable

from absl import app, flags, logging


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


# What `run_main` says after "stopped by SIGTERM" (or SIGINT) by default: a command that writes files
# removes its unfinished outputs before it exits.
INTERRUPTED = ": nothing was written under the output name (existing outputs are untouched)"


def run_main(
    run: Callable[[], object],
    argv: list[str] | None = None,
    hint: str = "",
    *,
    check: Callable[[], object] | None = None,
    errors: tuple[type[BaseException], ...] = (ValueError, OSError),
    fatal: tuple[type[BaseException], ...] | Callable[[], tuple[type[BaseException], ...]] = (),
    stops: tuple[type[BaseException], ...] = (),
    interrupted: str = INTERRUPTED,
) -> None:
    """Checks the flags, then calls `run()`, and turns its failures and interruptions into one line and an
    exit code.

    Args:
      run: the tool's work.
      argv: absl's remaining arguments, which must be only the program name; None when the tool takes
        positional arguments itself.
      hint: appended to the "unexpected arguments" error (e.g. which flag takes them).
      check: the command's checks of its flags that need no library (`require`, `check_installed`, flags
        that go together), raising ValueError or OSError; run before anything is imported, after those of
        the shared flags (`check_shared_flags`).
      errors: exceptions that are a person's mistake or a broken file: `error: MESSAGE`, exit 1.
      fatal: errors after which the process ends at once, skipping interpreter teardown (threads of the
        failed work could print after the error line or keep the process alive): `error: MESSAGE`, exit 1;
        or a function that returns them (classes of a module that imports JAX: called once `run` failed).
      stops: a clean stop the work reports itself (its message is the last line), exit 0.
      interrupted: what follows "stopped by SIGTERM" (or SIGINT) when a signal interrupts `run`; exit
        143 (130), at once.
    """
    if argv is not None and len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}{hint}", file=sys.stderr)
        sys.exit(1)
    try:
        check_shared_flags()
        if check is not None:
            check()
    except errors as e:
        _error_line(e)
        sys.exit(1)
    try:
        with sigterm_raises():
            _use_compilation_cache()
            quiet_library_chatter()
            run()
    except BaseException as e:
        _end(e, fatal() if callable(fatal) else fatal, stops, errors, interrupted)


def _end(error, fatal, stops, errors, interrupted: str) -> None:
    """How `run_main` ends once `run` raised `error` (the arguments are its); re-raised when it is none of
    the kinds the command named (a bug: its traceback is what helps)."""
    if isinstance(error, fatal):
        _error_line(error)
        exit_now(1)
    elif isinstance(error, stops):
        print(str(error), file=sys.stderr)
    elif isinstance(error, BrokenPipeError):  # an OSError: before `errors`
        end_if_output_closed()
        _error_line(error)  # not standard output's: a connection's
        sys.exit(1)
    elif isinstance(error, errors):
        _error_line(error)
        sys.exit(1)
    elif isinstance(error, (KeyboardInterrupt, Terminated)):
        notes = "".join(f"; {note}" for note in getattr(error, "__notes__", ()))  # e.g. where the progress is kept
        print(f"stopped by {signal_name(error)}{interrupted}{notes}", file=sys.stderr)
        # The cleanup has run; skip interpreter teardown, which can crash while XLA still runs the batch
        # that was in flight (observed: a segfault after the message).
        exit_now(interrupted_exit_code(error))
    else:
        raise error


def _error_line(error: BaseException) -> None:
    """The one line of a refused command (a log line of the same error would say it twice: absl's log
    goes to standard error too)."""
    print(f"error: {' '.join(str(error).split())}", file=sys.stderr)


def end_if_output_closed() -> None:
    """Ends the process quietly, with the status of a process SIGPIPE ended (141), when standard output
    is a pipe whose reader has gone (`cmd | head` once head has exited: Python ignores SIGPIPE, so each
    write fails with BrokenPipeError); returns otherwise."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture)
        return
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return  # its reader is still there: the broken pipe was another's
    # The interpreter's last flush of standard output would fail again ("Exception ignored ..."): what is
    # still buffered goes nowhere.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    sys.exit(141)


def check_shared_flags() -> None:
    """The rules of the flags this module defines, for a command that defined them: --model, or
    --options and --weights together (`formats.model_source.check_model_flags`); --compilation_cache
    (`storage.compile_cache.setting_problem`). Neither module imports JAX."""
    if "model" in flags.FLAGS:
        from elmo_jax.formats.model_source import check_model_flags

        check_model_flags(flags.FLAGS.model, flags.FLAGS.options, flags.FLAGS.weights)
    if "compilation_cache" in flags.FLAGS:
        from elmo_jax.storage.compile_cache import setting_problem

        if problem := setting_problem(flags.FLAGS.compilation_cache):
            raise ValueError(f"--compilation_cache={flags.FLAGS.compilation_cache}: expected {problem}")


def require(*names: str) -> None:
    """Raises ValueError naming those of the flags `names` that were not given ("--input and --output are
    required"), for a command's `check`."""
    missing = [f"--{name}" for name in names if flags.FLAGS[name].value in (None, "", [])]
    if missing:
        raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required")


def check_installed(flag: str, module: str, extra: str) -> None:
    """Raises ValueError when the flag `flag` was given and needs `module`, which is not installed,
    naming the package's extra that installs it (for a command's `check`: before any work is done). The
    line says `pip install MODULE` (the package is not on PyPI: `pip install 'elmo-jax[EXTRA]'` would find
    nothing, and the extra's spelling depends on where the package was installed from)."""
    if flags.FLAGS[flag].value and importlib.util.find_spec(module) is None:
        raise ValueError(f"--{flag} needs {module}, which is not installed: pip install {module} (the {extra} extra)")


def define_compilation_cache_flag() -> None:
    """--compilation_cache, of every command that compiles (`run_main` turns the cache on with it)."""
    flags.DEFINE_string(
        "compilation_cache",
        None,
        "Directory (or gs://BUCKET/PATH) of the persistent compilation cache, or 'none' (default: "
        "$ELMO_JAX_COMPILATION_CACHE, else compilation_cache in $ELMO_JAX_CACHE or ~/.cache/elmo_jax).",
    )


def _use_compilation_cache() -> None:
    """Turns the persistent compilation cache on, for a command that defines --compilation_cache (one that
    compiles; `storage.compile_cache`, which imports JAX: after the checks)."""
    if "compilation_cache" in flags.FLAGS:
        from elmo_jax.storage import compile_cache

        compile_cache.use(flags.FLAGS.compilation_cache)


def signal_name(interruption: BaseException) -> str:
    """ "SIGTERM" for `Terminated`, "SIGINT" for KeyboardInterrupt."""
    return "SIGTERM" if isinstance(interruption, Terminated) else "SIGINT"


def interrupted_exit_code(interruption: BaseException) -> int:
    """The shell's exit code for a process ended by that signal: 143 (SIGTERM) or 130 (SIGINT)."""
    return 143 if isinstance(interruption, Terminated) else 130


def define_distributed_flags() -> None:
    """The flags of a command that runs as one of several processes (train.py, embed_file), read by
    `cluster`."""
    flags.DEFINE_bool(
        "distributed",
        False,
        "Run as one of several processes: jax.distributed.initialize() with the flags below, the JAX_* "
        "variables, or the cluster JAX detects (TPU pod slices, SLURM).",
    )
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (implies --distributed).")
    flags.DEFINE_integer("num_processes", None, "How many processes take part (implies --distributed).")
    flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes) (implies --distributed).")


def cluster(local_device_ids: tuple[int, ...] | None = None):
    """The parsed flags of `define_distributed_flags` as a `runtime.processes.Cluster` (whose `start`
    begins `jax.distributed` when they ask for it)."""
    from elmo_jax.runtime.processes import Cluster  # imports JAX: after flag parsing, so --help is fast

    f = flags.FLAGS
    return Cluster(f.distributed, f.coordinator_address, f.num_processes, f.process_id, local_device_ids)


def define_model_flags() -> None:
    """--model, or --options and --weights: the biLM a command reads (`formats.model_source.ModelSource`);
    and --compilation_cache, where the programs of the model it compiles are kept."""
    flags.DEFINE_string(
        "model",
        None,
        "A model directory (python -m elmo_jax.export, or a training run's export/), or a published model by name "
        "(small, medium, original, original-5.5b, pubmed: downloaded once into $ELMO_JAX_CACHE); or --options "
        "and --weights instead.",
    )
    define_hdf5_flags()
    define_compilation_cache_flag()


def define_labelled_targets_flags() -> None:
    """The model flags and those of a command that learns from labelled targets (probe, ablate): --train,
    --test, --output (JSON), --overwrite (of --output and the command's own --plot) and --batch_tokens."""
    define_model_flags()
    flags.DEFINE_string("train", None, "Labelled training targets (.jsonl or CoNLL).")
    flags.DEFINE_string("test", None, "Labelled test targets (.jsonl or CoNLL).")
    flags.DEFINE_string("output", None, "Write the results as JSON here.")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --output or --plot, if it is what this command writes.")
    flags.DEFINE_integer("batch_tokens", 4096, "Padded tokens per embedding batch.")


def define_hdf5_flags() -> None:
    """--options and --weights: a biLM in the published two-file format (bilm-tf, AllenNLP)."""
    flags.DEFINE_string("options", None, "A published-format options JSON file; goes with --weights.")
    flags.DEFINE_string("weights", None, "A published-format HDF5 weight file; goes with --options.")


class _BackendProbe(std_logging.Filter):
    """Drops JAX's INFO line for each platform it tried and could not start ("Unable to initialize backend
    'tpu': ... libtpu.so ..." on every machine without a TPU): expected, and no news to a user."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        return not (
            record.levelno <= std_logging.INFO and record.getMessage().startswith("Unable to initialize backend")
        )


class _OrbaxNotes(std_logging.Filter):
    """Drops orbax-checkpoint's INFO lines (about 30 per restore: its managers, handlers, registries, read
    throughputs), which it logs through absl's logger; its warnings and errors pass."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        return not (record.levelno <= std_logging.INFO and f"{os.sep}orbax{os.sep}" in record.pathname)


# (logger, filter): libraries' INFO lines a command leaves out unless --verbosity is 1 or more.
_CHATTER = (("jax._src.xla_bridge", _BackendProbe()), ("absl", _OrbaxNotes()))


def quiet_library_chatter() -> None:
    """Leaves JAX's backend probe and orbax's INFO notes out of a command's output unless --verbosity asks
    for more (>= 1); the command's own lines and every library's warnings stay."""
    for name, chatter in _CHATTER:
        logger = std_logging.getLogger(name)
        if logging.get_verbosity() < 1:
            logger.addFilter(chatter)  # once: adding the same filter again does nothing
        else:
            logger.removeFilter(chatter)


def start(
    main: Callable[[list[str]], object],
    define_flags: Callable[[], object] | None = None,
    flags_parser: Callable[[list[str]], list[str]] | None = None,
) -> None:
    """A command's `__main__` block: defines its flags (only when run as a program, so importing the
    module adds no global flags), parses them (`flags_parser`, default `parse_flags`) and runs `main`
    with the remaining arguments under absl (logging set up as absl sets it up). The module that defines
    `main` is the command whose usage and flags --help prints: a console script (`elmo-vocab`) imports it
    under its own name, and the process's `__main__` is the script."""
    _started.append(sys.modules[main.__module__])
    if define_flags is not None:
        define_flags()
    app.run(main, flags_parser=flags_parser or parse_flags)


def parse_flags(
    argv: list[str],
    *,
    errors: tuple[type[BaseException], ...] = (flags.Error,),
    describe: Callable[[BaseException, list[str]], str] = lambda error, argv: str(error),
) -> list[str]:
    """absl's parsing, with a bad flag reported like any other input error: one line, exit code 1
    (`app.run(main, flags_parser=cli.parse_flags)`); a boolean's negation spelt `--no-X` names absl's
    `--noX` (`boolean_spelling`). --help (or --helpshort, -?) prints the command's
    usage and its flags (`command_help`), --helpfull every flag; both exit 0 (absl's exit 1).

    Args:
      argv: the program name and its arguments.
      errors: what a bad flag raises (a command whose flags load files, like train.py's --config, adds
        those files' errors).
      describe: the error line's text (after "error: ") for an error and argv.
    """
    arguments = argv[1 : argv.index("--") if "--" in argv else len(argv)]
    if any(a in HELP_ARGUMENTS or a in FULL_HELP_ARGUMENTS for a in arguments):
        try:
            print(command_help(argv[0], full=not any(a in HELP_ARGUMENTS for a in arguments)), flush=True)
        except BrokenPipeError:  # `--help | head`
            end_if_output_closed()
            raise
        sys.exit(0)
    try:
        return flags.FLAGS(argv)
    except (*errors, ValueError) as e:  # absl raises ValueError for `--noX=value`
        line = boolean_spelling(e)
        if line is None and not isinstance(e, errors):
            raise
        print(f"error: {line or describe(e, argv)}", file=sys.stderr)
        sys.exit(1)


def boolean_spelling(error: BaseException) -> str | None:
    """The error line of a boolean flag X spelt the way absl does not take it: `--no-X` or `--no_X`
    (absl's negation is `--noX`; it said "Unknown command line flag 'no-X'. Did you mean: X ?") and
    `--noX=value` (absl raised a bare ValueError: a traceback); None for any other error."""
    name = getattr(error, "flagname", None)
    if isinstance(error, flags.UnrecognizedFlagError) and name and name[:3] in ("no-", "no_"):
        flag = name[3:].replace("-", "_")
        if flag in flags.FLAGS and flags.FLAGS[flag].boolean:
            return f"--{name}: unknown flag; the boolean --{flag} is turned off with --no{flag} (or --{flag}=false)"
    text = str(error)
    if type(error) is ValueError and text.startswith("--no") and text.endswith(" does not take an argument"):
        given = text.split(" ", 1)[0]
        flag = given[len("--no") :].split("=", 1)[0]
        return f"{given}: --no{flag} takes no value; write --no{flag}, or --{flag}=true or --{flag}=false"
    return None


HELP_ARGUMENTS = ("--help", "-help", "--helpshort", "-helpshort", "-?")
FULL_HELP_ARGUMENTS = ("--helpfull", "-helpfull")


def command_help(program: str, *, full: bool = False) -> str:
    """The running command's usage (its module docstring) and its flags: those its module defines and
    the shared ones of this module that it defined (absl's --help lists only the former); with `full`,
    every flag the process knows (absl's and libraries' too)."""
    module = _command_module(program)
    usage = (module.__doc__ or f"usage: {program} [flags]\n").rstrip("\n")
    if full:
        listing = flags.FLAGS.get_help(prefix="  ", include_special_flags=False)
    else:
        own = flags.FlagValues()  # a listing of its own: absl renders one module's flags at a time
        for flag in flags.FLAGS.get_flags_for_module(module) + flags.FLAGS.get_flags_for_module(__name__):
            own[flag.name] = flag
        listing = own.get_help(prefix="  ", include_special_flags=False)
    if not listing:
        return usage
    more = "" if full else "\n\nTry --helpfull to get a list of all flags."
    return f"{usage}\n\nflags:\n{listing}{more}"


def _command_module(program: str):
    """The running command's module: the one `start` ran; where a test runs a command's `main` in-process
    (tests/support/inprocess.py), the module argv[0] names ("elmo_jax.vocab"; "train.py", the repository's
    entry point: the module of the `main` it imports, elmo_jax.train)."""
    if _started:
        return _started[-1]
    name = program[: -len(".py")].replace("/", ".") if program.endswith(".py") else program
    module = sys.modules.get(name) or sys.modules["__main__"]
    return sys.modules.get(getattr(getattr(module, "main", None), "__module__", None), module)


# The command module `start` ran (one per process; empty in a test that runs a command's `main` itself).
_started: list = []
