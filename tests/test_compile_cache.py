"""The persistent compilation cache (elmo_jax/storage/compile_cache.py, issue #51 item 1): where it is,
that a user's own JAX cache is kept, that an unusable one is one warning line and never an error, that
every command, the library and training turn it on, and the round trip: a second process reads what the
first compiled.

The settings are checked in-process on JAX's configuration, which each test puts back before anything
compiles (this process's own cache is the test session's, tests/conftest.py). The round trip is one pair
of real processes.
"""

from __future__ import annotations

import logging as std_logging
import os
import re
import warnings
from pathlib import Path

import jax
import pytest

from elmo_jax.storage import cache_home, compile_cache
from tests.support.commands import command_env, defined_flags, run_command
from tests.support.inprocess import run_in_process

FIXTURE = Path(__file__).parent / "fixtures" / "allennlp_tiny"
UNWRITABLE = "/sys/elmo_jax_compilation_cache"  # sysfs refuses new directories even to root


@pytest.fixture
def jax_cache_settings():
    """JAX's cache settings as the test found them, put back after it (nothing compiles in between)."""
    names = (
        "jax_compilation_cache_dir",
        "jax_enable_compilation_cache",
        "jax_persistent_cache_min_compile_time_secs",
    )
    before = {name: getattr(jax.config, name) for name in names}
    compile_cache._TRIED.clear()
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    compile_cache._TRIED.clear()


@pytest.fixture
def warnings_logged():
    """The absl warnings logged while the test runs (their messages)."""
    records = []

    class Keep(std_logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(std_logging.WARNING)
    std_logging.getLogger("absl").addHandler(handler)
    yield records
    std_logging.getLogger("absl").removeHandler(handler)


def test_the_setting_then_the_variable_then_the_package_cache(monkeypatch, tmp_path):
    """A setting (a flag, a config key) wins, then $ELMO_JAX_COMPILATION_CACHE, then compilation_cache in the
    package's cache ($ELMO_JAX_CACHE, else ~/.cache/elmo_jax); "none" is off, wherever it is said."""
    monkeypatch.delenv(compile_cache.VARIABLE, raising=False)
    monkeypatch.setenv(cache_home.CACHE_VARIABLE, str(tmp_path / "home"))
    assert compile_cache.directory() == str(tmp_path / "home" / "compilation_cache")
    monkeypatch.delenv(cache_home.CACHE_VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.directory("") == str(tmp_path / "xdg" / "elmo_jax" / "compilation_cache")
    monkeypatch.setenv(compile_cache.VARIABLE, "~/xla")
    assert compile_cache.directory() == os.path.join(os.path.expanduser("~"), "xla")
    assert compile_cache.directory("gs://bucket/xla/") == "gs://bucket/xla"
    assert compile_cache.directory("relative") == os.path.abspath("relative")
    assert compile_cache.directory("None") is None
    monkeypatch.setenv(compile_cache.VARIABLE, "none")
    assert compile_cache.directory() is None
    assert compile_cache.directory(str(tmp_path)) == str(tmp_path)


def test_a_users_own_jax_cache_is_kept_unless_a_setting_names_one(jax_cache_settings, tmp_path, monkeypatch):
    """The test session's cache stands for the user's (jax_compilation_cache_dir set before the library
    runs): used as it is, its threshold too; a setting given explicitly wins, "none" turns JAX's off."""
    monkeypatch.setenv(compile_cache.VARIABLE, str(tmp_path / "variable"))
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.5)
    assert compile_cache.use() == str(tmp_path / "users")
    assert compile_cache.use("") == str(tmp_path / "users")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5
    assert compile_cache.use(str(tmp_path / "flag")) == str(tmp_path / "flag")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "flag")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == compile_cache.MIN_COMPILE_TIME_S
    assert os.path.isdir(tmp_path / "flag") and os.listdir(tmp_path / "flag") == []  # the probe is removed
    assert compile_cache.use("none") is None and not jax.config.jax_enable_compilation_cache
    assert compile_cache.use() is None  # off stays off


def test_without_a_users_cache_the_default_is_turned_on(jax_cache_settings, tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.VARIABLE, str(tmp_path / "variable"))
    jax.config.update("jax_compilation_cache_dir", None)
    assert compile_cache.use() == str(tmp_path / "variable")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "variable")
    assert jax.config.jax_enable_compilation_cache


@pytest.mark.parametrize(
    "place, reason",
    [
        ("file", "it is a file, not a directory"),
        ("under_a_file", "Not a directory"),
        (UNWRITABLE, "Operation not permitted"),
    ],
)
def test_an_unusable_cache_is_one_warning_line_and_the_cache_is_off(
    jax_cache_settings, warnings_logged, tmp_path, place, reason
):
    """A file where the directory should be, a directory under a file, a place no one may write (as a
    read-only directory is to anyone but root): one warning line naming it, why, and how to move or turn
    it off; the cache is off, nothing fails; the same place is tried once per process."""
    (tmp_path / "file").write_text("mine", encoding="utf-8")
    path = {"file": str(tmp_path / "file"), "under_a_file": str(tmp_path / "file" / "xla")}.get(place, place)
    assert compile_cache.use(path) is None
    assert not jax.config.jax_enable_compilation_cache
    assert compile_cache.use(path) is None
    assert len(warnings_logged) == 1, warnings_logged
    line = warnings_logged[0]
    assert "\n" not in line and f"compilation cache {path} cannot be used ({reason}" in line, line
    assert "--compilation_cache" in line and "ELMO_JAX_COMPILATION_CACHE" in line and "'none'" in line
    assert (tmp_path / "file").read_text(encoding="utf-8") == "mine"


def test_entries_jax_cannot_read_or_write_are_said_once(jax_cache_settings, warnings_logged, tmp_path):
    """A disk that fills up while programs are written: JAX warns for every entry (two lines each); the
    first is said in one line of ours, the rest are dropped, other warnings pass."""
    compile_cache.use(str(tmp_path))
    with warnings.catch_warnings(record=True) as shown:
        compile_cache._say_entry_errors_once()  # catch_warnings copied the filters; present in the copy
        for name in ("jit_a", "jit_b", "jit_c"):
            warnings.warn(
                f"Error writing persistent compilation cache entry for '{name}': OSError: [Errno 28] full", stacklevel=1
            )
        warnings.warn("Error reading persistent compilation cache entry for 'jit_d': EOFError", stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in shown] == ["something else"]
    assert len(warnings_logged) <= 1  # one for the whole process: it may have been said before this test
    assert all("later errors of the cache are not shown" in line for line in warnings_logged)


def test_every_command_that_compiles_takes_the_flag_and_uses_it(monkeypatch):
    """--compilation_cache is defined by each command that compiles (those that read a model, evaluate,
    export), and the shared entry turns the cache on with it before the command's work."""
    compiling = ("evaluate", "export", "embed_text", "embed_file", "probe", "ablate", "serve")
    for command in compiling:
        assert "compilation_cache" in defined_flags(f"elmo_jax.{command}"), command
    for command in ("vocab", "prepare_lm1b"):  # these compile nothing and import no JAX
        assert "compilation_cache" not in defined_flags(f"elmo_jax.{command}"), command
    used = []
    monkeypatch.setattr(compile_cache, "use", lambda setting=None: used.append(setting))
    run_in_process("elmo_jax.evaluate", "--workdir=/nonexistent", "--compilation_cache=/tmp/elsewhere")
    run_in_process("elmo_jax.embed_text", "--model=/nonexistent", input="a b\n")
    assert used == ["/tmp/elsewhere", None]


def test_training_and_the_library_turn_it_on(monkeypatch, tiny_params, corpus, tmp_path):
    """train_and_evaluate with config.compilation_cache (configs/default.py declares it), embed_sentences
    and Embedder (through it) before they compile."""
    import elmo_jax
    from elmo_jax.training.loop import train_and_evaluate
    from tests.support.configs import tiny_config

    used = []

    class Used(Exception):
        pass

    def use(setting=None):
        used.append(setting)
        raise Used

    monkeypatch.setattr(compile_cache, "use", use)
    with pytest.raises(Used):
        elmo_jax.embed_sentences(tiny_params, [["a", "b"]])
    with pytest.raises(Used):
        elmo_jax.Embedder(options_file=FIXTURE / "options.json", weight_file=FIXTURE / "weights.hdf5")
    with pytest.raises(Used):
        train_and_evaluate(tiny_config(corpus, compilation_cache="none"), str(tmp_path / "run"))
    assert used == [None, None, "none"]
    assert not os.path.exists(tmp_path / "run")  # before the run writes anything


@pytest.mark.slow
def test_a_second_process_reads_what_the_first_compiled(tmp_path, fixture_dir):
    """The round trip in one pair of real processes: embed_text with --compilation_cache in tmp_path
    writes its programs there; run again, it compiles none of them: JAX logs a cache hit for each of them,
    the biLM's own program among them, and writes nothing new."""
    cache = tmp_path / "xla"
    args = (
        "elmo_jax.embed_text",
        f"--options={fixture_dir / 'options.json'}",
        f"--weights={fixture_dir / 'weights.hdf5'}",
        f"--compilation_cache={cache}",
        "the bank of the river .",
    )
    first = run_command(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    written = sorted(os.listdir(cache))
    assert any(name.startswith("jit__embed_jit-") for name in written), written
    second = run_command(*args, env=command_env(JAX_LOG_COMPILES="1"))
    assert second.returncode == 0, second.stderr[-3000:]
    hits = set(re.findall(r"Persistent compilation cache hit for '([^']+)'", second.stderr))
    assert "jit__embed_jit" in hits, second.stderr[-3000:]
    assert len(hits) == len({name.split("-")[0] for name in written}), (hits, written)
    assert sorted(os.listdir(cache)) == written
    assert second.stdout == first.stdout
