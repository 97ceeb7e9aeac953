"""How every command starts and ends (elmo_jax/cli.py): --help, the package face's lazy imports that keep
it fast, and `run_main`'s kinds of ending.

--help is checked in-process for what it prints; one loop of real processes checks what only a process
shows: its exit status and the import cost (`python -m elmo_jax.X` imports the package face first, and
--help must answer without JAX: under 1.5 s of wall time, ~0.2 CPU-s each).
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest
from absl import flags

import elmo_jax
from elmo_jax import cli
from tests.support.commands import REPO, command_env
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
)


def command_module(command: str):
    return importlib.import_module(command[: -len(".py")] if command.endswith(".py") else command)


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
    machine); the package face alone imports neither JAX nor Flax."""
    for command in COMMANDS:
        result = subprocess.run(
            [sys.executable, "-c", _HELP_IMPORTS, command], cwd=REPO, env=command_env(), capture_output=True, text=True
        )
        assert result.stderr.splitlines()[-1:] == ["[] 0"], (command, result.stderr[-2000:])
        assert result.stdout.rstrip("\n") == run_in_process(command, "--help").stdout.rstrip("\n"), command
    check = "import sys, elmo_jax, elmo_jax.cli; print(sorted({'jax', 'flax'} & set(sys.modules)))"
    imported = subprocess.run(
        [sys.executable, "-c", check], cwd=REPO, env=command_env(), capture_output=True, text=True
    )
    assert imported.stdout.strip() == "[]", imported.stdout + imported.stderr


def test_the_package_face_resolves_every_public_name_on_first_use():
    """`elmo_jax.X`, `from elmo_jax import X` and dir() as with eager imports; each name is the defining
    module's object, and the face re-exports only model, formats and features, and the pretrained and
    embedder facades (the layer rule of tests/test_layers.py, which cannot see imports made by name)."""
    names = set(elmo_jax.__all__)
    assert len(names) == len(elmo_jax.__all__) == 32
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
