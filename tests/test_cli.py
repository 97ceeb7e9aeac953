"""How every command starts and ends (elmo_jax/cli.py): --help, the package face's lazy imports that keep
it fast, and `run_main`'s kinds of ending.

--help is checked in-process for what it prints; one loop of real processes checks what only a process
shows: its exit status and the import cost (`python -m elmo_jax.X` imports the package face first, and
--help must answer without JAX: no heavy library imported before it answers, ~0.2 CPU-s each; no
wall-time bound, which failed on a loaded machine).
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

import elmo_jax
from elmo_jax import cli
from tests.support.commands import REPO, command_env, command_module, defined_flags, error_line
from tests.support.inprocess import run_in_process

COMMANDS = (
    "train.py",
    "elmo_jax.vocab",
    "elmo_jax.evaluate",
    "elmo_jax.export",
    "elmo_jax.embed_text",
    "elmo_jax.embed_file",
    "elmo_jax.default_corpus",
    "elmo_jax.probe",
    "elmo_jax.ablate",
    "elmo_jax.serve",
    "elmo_jax.prepare_lm1b",
    "elmo_jax.segment",
)


def listed_flags(help_text: str) -> set[str]:
    """The flags a help text lists (`  --name: ...` or `  --[no]name: ...`, indented by module in --helpfull)."""
    return set(re.findall(r"^ +--(?:\[no\])?([A-Za-z0-9_.]+):", help_text, flags=re.MULTILINE))


@pytest.mark.parametrize("command", COMMANDS)
def test_help_prints_the_usage_and_the_commands_own_flags_and_exits_0(command):
    result = run_in_process(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    usage = command_module(command).__doc__
    assert result.stdout.startswith(usage.rstrip("\n")), result.stdout[:300]
    own = defined_flags(command)
    assert listed_flags(result.stdout) == own, result.stdout  # the shared ones of cli too, absl's not
    if own:
        assert result.stdout.rstrip().endswith("Try --helpfull to get a list of all flags.")
    for form in ("-?", "--helpshort"):
        assert run_in_process(command, form).stdout == result.stdout
    assert run_in_process(command, "--config.x=1" if command == "train.py" else "--bogus", "--help").returncode == 0


@pytest.mark.parametrize("command", COMMANDS)
def test_a_boolean_negated_as_no_dash_x_is_refused_naming_absls_spelling(command):
    """Issue #51: `serve --no-warmup` got absl's "Unknown command line flag 'no-warmup'. Did you mean:
    warmup ?", which names the flag it refuses; and `--nowarmup=1` a traceback (absl's ValueError). Each
    command, for a boolean flag it lists (absl's --logtostderr where it has none of its own): `--no-X` and
    `--no_X` name `--noX`; `--noX=1` says it takes no value; a non-boolean keeps absl's line."""
    booleans = re.findall(r"^ +--\[no\]([A-Za-z0-9_]+):", run_in_process(command, "--help").stdout, re.MULTILINE)
    flag = (booleans or ["logtostderr"])[0]
    for spelt in (f"--no-{flag.replace('_', '-')}", f"--no_{flag}"):
        error_line(run_in_process(command, spelt), f"{spelt}: unknown flag", f"--no{flag} (or --{flag}=false)")
    error_line(run_in_process(command, f"--no{flag}=1"), f"--no{flag} takes no value", f"--{flag}=false")
    error_line(run_in_process(command, "--no-nonexistent_flag"), "Unknown command line flag", "no-nonexistent_flag")


def test_helpfull_lists_every_flag_and_an_argument_after_the_separator_is_no_help():
    full = run_in_process("elmo_jax.embed_file", "--helpfull")
    assert full.returncode == 0
    assert {"model", "layers", "distributed", "logtostderr", "stderrthreshold"} <= listed_flags(full.stdout)
    after = run_in_process("elmo_jax.embed_text", "--model=/nonexistent", "--", "--help")
    assert after.returncode == 1 and "no such model directory" in after.stderr


# Run as `python -c`: the command's `--help` in a fresh interpreter, then the heavy libraries it imported
# on the way (what makes `--help` slow: importing JAX alone takes seconds) on the last line of stderr.
_HELP_IMPORTS = """
import runpy, sys
command = sys.argv[1]
sys.argv = [command, "--help"]
try:
    if command.endswith(".py"):
        runpy.run_path(command, run_name="__main__")
    else:
        runpy.run_module(command, run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print(sorted({"jax", "flax", "orbax", "tensorflow", "h5py"} & set(sys.modules)), code, file=sys.stderr)
"""


def test_every_command_answers_help_at_once_in_its_own_process():
    """A real process per command: exit status 0, the in-process text, and no heavy library imported
    before the help is printed (what answering at once takes; a wall-time bound would fail on a loaded
    machine); the package face alone imports neither JAX nor Flax, nor do the modules a command checks its
    flags with before it imports its libraries (the shared model flags' rule, the compilation cache's
    settings: on the old code formats/model_source imported JAX)."""
    for command in COMMANDS:
        result = subprocess.run(
            [sys.executable, "-c", _HELP_IMPORTS, command], cwd=REPO, env=command_env(), capture_output=True, text=True
        )
        assert result.stderr.splitlines()[-1:] == ["[] 0"], (command, result.stderr[-2000:])
        assert result.stdout.rstrip("\n") == run_in_process(command, "--help").stdout.rstrip("\n"), command
    check = (
        "import sys, elmo_jax, elmo_jax.cli, elmo_jax.formats.model_source, elmo_jax.storage.compile_cache; "
        "print(sorted({'jax', 'flax', 'h5py'} & set(sys.modules)))"
    )
    imported = subprocess.run(
        [sys.executable, "-c", check], cwd=REPO, env=command_env(), capture_output=True, text=True
    )
    assert imported.stdout.strip() == "[]", imported.stdout + imported.stderr


def test_the_package_face_resolves_every_public_name_on_first_use():
    """`elmo_jax.X`, `from elmo_jax import X` and dir() as with eager imports; each name is the defining
    module's object, and the face re-exports only model, formats and features, and the pretrained and
    embedder facades (the layer rule of tests/test_layers.py, which cannot see imports made by name)."""
    names = set(elmo_jax.__all__)
    assert len(names) == len(elmo_jax.__all__) == 34
    assert names <= set(dir(elmo_jax))
    for name in elmo_jax.__all__:
        module = elmo_jax._LAZY[name]
        facade = module in ("elmo_jax.pretrained", "elmo_jax.embedder")
        assert module.split(".")[1] in ("model", "formats", "features") or facade, module
        defined = importlib.import_module(module)
        expected = defined if module == f"elmo_jax.{name}" else getattr(defined, name)
        assert getattr(elmo_jax, name) is expected
        namespace = {}
        exec(f"from elmo_jax import {name}", namespace)
        assert namespace[name] is expected
    with pytest.raises(AttributeError, match="module 'elmo_jax' has no attribute 'embedd'"):
        elmo_jax.embedd  # noqa: B018


class _Stop(Exception):
    pass


class _Fatal(OSError):
    pass


def _ending(monkeypatch, capsys, error: BaseException, **kwargs) -> tuple[object, str]:
    """(exit code or None when run_main returned, standard error) of a run that raises `error`."""

    def exit_now(code):
        raise SystemExit(("at once", code))

    def run():
        raise error

    monkeypatch.setattr(cli, "exit_now", exit_now)
    try:
        cli.run_main(run, ["program"], **kwargs)
        code = None
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_run_main_ends_each_kind_as_the_command_says(monkeypatch, capsys):
    kinds = dict(errors=(ValueError, OSError, RuntimeError), fatal=(_Fatal,), stops=(_Stop,), interrupted=" early")
    assert _ending(monkeypatch, capsys, ValueError("bad\n  value")) == (1, "error: bad value\n")
    assert _ending(monkeypatch, capsys, RuntimeError("x"), **kinds) == (1, "error: x\n")
    with pytest.raises(RuntimeError):  # not one the command named: a bug, with its traceback
        _ending(monkeypatch, capsys, RuntimeError("x"))
    assert _ending(monkeypatch, capsys, _Fatal("disk"), **kinds) == (("at once", 1), "error: disk\n")
    assert _ending(monkeypatch, capsys, _Stop("stopped at step 3"), **kinds) == (None, "stopped at step 3\n")
    interrupted = KeyboardInterrupt()
    interrupted.add_note("kept in /tmp/x")
    assert _ending(monkeypatch, capsys, interrupted, **kinds) == (
        ("at once", 130),
        "stopped by SIGINT early; kept in /tmp/x\n",
    )
    assert _ending(monkeypatch, capsys, cli.Terminated()) == (
        ("at once", 143),
        f"stopped by SIGTERM{cli.INTERRUPTED}\n",
    )


def test_library_chatter_is_left_out_unless_asked_for():
    """JAX's backend probe and orbax's INFO notes are dropped from a command's output at the default
    verbosity; their warnings, and every other INFO line, pass; --verbosity=1 lets everything through."""
    import logging as std_logging

    from absl import logging as absl_logging

    def record(name, level, pathname, message):
        return std_logging.LogRecord(name, level, pathname, 1, message, None, None)

    probe = record(
        "jax._src.xla_bridge", std_logging.INFO, "/x/jax/_src/xla_bridge.py", "Unable to initialize backend 'tpu'"
    )
    orbax_note = record("absl", std_logging.INFO, "/x/orbax/checkpoint/checkpointer.py", "Restoring checkpoint")
    orbax_warning = record("absl", std_logging.WARNING, "/x/orbax/checkpoint/checkpointer.py", "slow")
    ours = record("absl", std_logging.INFO, "/x/elmo_jax/training/loop.py", "heldout after step 4")
    level = absl_logging.get_absl_logger().level  # its own level (NOTSET included), as before the test
    installed = [
        (std_logging.getLogger(name), f) for name, f in cli._CHATTER if f in std_logging.getLogger(name).filters
    ]
    try:
        absl_logging.set_verbosity(absl_logging.INFO)
        cli.quiet_library_chatter()
        assert not std_logging.getLogger("jax._src.xla_bridge").filter(probe)
        absl = std_logging.getLogger("absl")
        assert not absl.filter(orbax_note)
        assert absl.filter(orbax_warning) and absl.filter(ours)
        absl_logging.set_verbosity(1)
        cli.quiet_library_chatter()
        assert absl.filter(orbax_note) and std_logging.getLogger("jax._src.xla_bridge").filter(probe)
    finally:  # as before the test: absl's logger level and the filters this process had
        absl_logging.get_absl_logger().setLevel(level)
        for name, chatter in cli._CHATTER:
            std_logging.getLogger(name).removeFilter(chatter)
        for logger, chatter in installed:
            logger.addFilter(chatter)


# ----------------------------------------------------------------------------- refused before the libraries

# What a command may import before its flags are checked: the package face, the shared entry (cli, with
# the shared flags' rules in formats/model_source and storage/compile_cache) and storage, which import no JAX
# (`test_every_command_answers_help_at_once_in_its_own_process` checks that in a fresh interpreter).
_CHECKS_IMPORT = (
    "elmo_jax",
    "elmo_jax.cli",
    "elmo_jax.formats.model_source",
    "elmo_jax.storage.compile_cache",
    "elmo_jax.storage",
)
_HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "h5py", "tensorflow")


class _LibraryImported(BaseException):
    """The command imported a library before it refused its flags (a BaseException: nothing catches it)."""


@pytest.fixture
def no_libraries(monkeypatch):
    """Every `import` of JAX (and the like) or of an elmo_jax library module raises `_LibraryImported`:
    the command's flags must be refused before it reaches for one (a real process would import JAX there,
    seconds before the error line)."""
    import builtins

    real_import = builtins.__import__

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.split(".")[0]
        allowed = name in _CHECKS_IMPORT or name.startswith("elmo_jax.storage.")
        if top in _HEAVY or (top == "elmo_jax" and not allowed):
            raise _LibraryImported(name)
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", guarded)


# (argv, standard input, parts of the error line): required flags and combinations of flags, which need
# no library to check. Each of these was refused only after the command imported JAX (1.5-3 s).
BEFORE_LIBRARIES = {
    "evaluate: no workdir": (["elmo_jax.evaluate"], None, ["--workdir is required"]),
    "export: no output": (["elmo_jax.export", "--workdir=w"], None, ["--output is required"]),
    "export: workdir and weights": (
        ["elmo_jax.export", "--output=o", "--workdir=w", "--options=x.json", "--weights=x.hdf5"],
        None,
        ["either --workdir", "or --options"],
    ),
    "export: options without weights": (
        ["elmo_jax.export", "--output=o", "--options=x.json"],
        None,
        ["--options and --weights go together"],
    ),
    "export: step with weights": (
        ["elmo_jax.export", "--output=o", "--options=x.json", "--weights=x.hdf5", "--step=3"],
        None,
        ["--step goes with --workdir"],
    ),
    "export: vocab with a workdir": (
        ["elmo_jax.export", "--output=o", "--workdir=w", "--vocab=v.txt"],
        None,
        ["--vocab goes with --options/--weights"],
    ),
    "embed_text: no model": (["elmo_jax.embed_text"], "a b\n", ["pass either --model"]),
    "embed_text: options without weights": (
        ["elmo_jax.embed_text", "--options=x.json"],
        "a b\n",
        ["--options and --weights go together"],
    ),
    "embed_file: no input, no output": (["elmo_jax.embed_file", "--model=m"], None, ["--input and --output"]),
    "embed_file: model and weights": (
        ["elmo_jax.embed_file", "--model=m", "--weights=x.hdf5", "--input=i", "--output=o"],
        None,
        ["pass either --model"],
    ),
    "embed_file: devices not numbers": (
        ["elmo_jax.embed_file", "--model=m", "--input=i", "--output=o", "--devices=0,x"],
        None,
        ["--devices", "0,x"],
    ),
    "embed_file: mix scalars not numbers": (
        ["elmo_jax.embed_file", "--model=m", "--input=i", "--output=o", "--layers=mix", "--mix_scalars=1,a"],
        None,
        ["--mix_scalars", "1,a"],
    ),
    "probe: no test": (["elmo_jax.probe", "--model=m", "--train=t"], None, ["--test is required"]),
    "probe: no model": (["elmo_jax.probe", "--train=t", "--test=t"], None, ["pass either --model"]),
    "ablate: no train, no test": (["elmo_jax.ablate", "--model=m"], None, ["--train and --test are required"]),
    "ablate: fractions not numbers": (
        ["elmo_jax.ablate", "--model=m", "--train=t", "--test=t", "--fractions=0.1,half"],
        None,
        ["--fractions", "0.1,half"],
    ),
}


@pytest.mark.parametrize("case", sorted(BEFORE_LIBRARIES))
def test_flag_mistakes_are_refused_before_any_library_is_imported(case, no_libraries):
    """Issue #51: `evaluate` without --workdir said so after 2-5 s of importing JAX and the training
    code; now every such mistake is the error line before the command imports a library. (On the old code
    each case raised _LibraryImported: the command imported jax or an elmo_jax library first.)"""
    argv, stdin, expected = BEFORE_LIBRARIES[case]
    error_line(run_in_process(*argv, input=stdin), *expected)


def test_the_import_guard_itself_can_fail(no_libraries):
    """The guard stops a command that reaches its libraries (a complete set of flags gets that far)."""
    with pytest.raises(_LibraryImported):
        run_in_process("elmo_jax.evaluate", "--workdir=/nonexistent")


# ----------------------------------------------------------------------------- a reader that goes away


def _closed_pipe():
    """A writable file whose reader has gone (`cmd | head` once head has exited): every write fails with
    EPIPE, as it does in a real pipeline (Python ignores SIGPIPE)."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    return open(write_end, "w", buffering=1, encoding="utf-8")  # noqa: SIM115


def test_help_into_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    """`--help | head`: the help's write fails with EPIPE once `head` has gone; the command ends at once
    with the status of a process SIGPIPE killed (141) and nothing on standard error. (Old code: the
    BrokenPipeError propagated with its traceback.)"""
    pipe = _closed_pipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    with pytest.raises(SystemExit) as ended:
        cli.parse_flags(["elmo_jax.embed_file", "--helpfull"])
    pipe.close()
    assert ended.value.code == 141
    assert capsys.readouterr().err == ""


def test_output_into_a_closed_pipe_ends_quietly_and_another_broken_pipe_is_an_error(monkeypatch, capsys):
    """A command's printed results into a closed pipe (`embed_text ... | head -1`): ends quietly with
    141, not `error: [Errno 32] Broken pipe` (the old code's line). A broken pipe that is not standard
    output's (a connection) stays an error line."""

    def run():
        print("x" * 100_000)

    pipe = _closed_pipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    with pytest.raises(SystemExit) as ended:
        cli.run_main(run, ["program"])
    pipe.close()
    assert ended.value.code == 141 and capsys.readouterr().err == ""
    monkeypatch.undo()

    def upload():
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(SystemExit) as ended:
        cli.run_main(upload, ["program"])
    assert ended.value.code == 1 and capsys.readouterr().err == "error: [Errno 32] Broken pipe\n"


def test_help_into_a_closed_pipe_in_a_real_process():
    """What only a process shows: no traceback and no 'Exception ignored' at interpreter exit (its last
    flush of standard output), exit status 141; --help imports no JAX, so this costs ~0.2 CPU-s."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "elmo_jax.embed_file", "--helpfull"],
            cwd=REPO,
            env=command_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")
