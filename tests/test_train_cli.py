"""`python train.py` as a person runs it: mistakes end with exit code 1 and one `error:` line on stderr
that names the key, value or file at fault, never a Python traceback; and a refused run leaves an
existing workdir's checkpoints untouched.

The trained workdir is made by a real `python train.py` process; the refusals run train.py's `main`
in this process (tests/support/inprocess.py), on configs/tiny.py and the session's corpus.
"""

from __future__ import annotations

import os
import shutil

import pytest

import elmo_jax
from tests.support.commands import error_line, run_command
from tests.support.compare import tree_digest
from tests.support.configs import tiny_flags
from tests.support.inprocess import run_in_process

LSTM_DIM = 16  # configs/tiny.py's


def run_train(*args):
    return run_in_process("train.py", *args)


def tiny_args(corpus, workdir, **overrides) -> list[str]:
    """configs/tiny.py for 2 steps, a checkpoint after each."""
    return tiny_flags(corpus, workdir, **{"num_train_steps": 2, "checkpoint_every_steps": 1, **overrides})


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A workdir trained for 2 steps through the command line (LSTM_DIM cells)."""
    workdir = tmp_path_factory.mktemp("cli_trained")
    result = run_command("train.py", *tiny_args(corpus, workdir))
    assert result.returncode == 0, result.stderr[-5000:]
    return workdir


@pytest.mark.slow
def test_cli_trains_checkpoints_and_exports(trained):
    assert sorted(os.listdir(trained / "checkpoints")) == ["1", "2"]
    loaded = elmo_jax.load_hdf5(trained / "export" / "options.json", trained / "export" / "weights.hdf5")
    assert loaded.config.lstm_dim == LSTM_DIM


@pytest.mark.parametrize(
    "override,named",
    [
        ("--config.model.lstm_dimm=16", "lstm_dimm"),
        ("--config.batch_size=abc", "batch_size"),
    ],
    ids=["unknown_key", "bad_value"],
)
def test_config_mistakes_are_one_line_errors(corpus, tmp_path, override, named):
    line = error_line(run_train(*tiny_args(corpus, tmp_path / "w"), override))
    assert named in line
    assert not (tmp_path / "w").exists(), "nothing may be written before the config is valid"


def test_missing_corpus_is_a_one_line_error(corpus, tmp_path):
    pattern = str(tmp_path / "nowhere" / "*.txt")
    line = error_line(run_train(*tiny_args(corpus, tmp_path / "w", **{"data.train_files": pattern})))
    assert pattern in line


@pytest.mark.parametrize("source", ["workdir", "export"])
def test_init_from_a_different_model_is_a_one_line_error(corpus, trained, tmp_path, source):
    """init_from a checkpoint (a training workdir) or an exported model whose LSTM is LSTM_DIM wide,
    with a config asking for another width."""
    path = trained if source == "workdir" else trained / "export"
    args = tiny_args(corpus, tmp_path / "w", **{"model.lstm_dim": 24, "init_from": path})
    line = error_line(run_train(*args))
    assert "init_from" in line and str(path) in line
    assert not (tmp_path / "w" / "checkpoints").exists() or not os.listdir(tmp_path / "w" / "checkpoints")


def test_workdir_of_a_different_model_is_refused_and_left_untouched(corpus, trained):
    """Re-running a workdir with another lstm_dim names the mismatch (the option, both values) and
    changes no checkpoint file."""
    before = tree_digest(trained / "checkpoints")
    line = error_line(run_train(*tiny_args(corpus, trained, **{"model.lstm_dim": 24, "num_train_steps": 4})))
    assert "lstm.dim" in line and "16" in line and "24" in line, line
    assert str(trained) in line
    assert tree_digest(trained / "checkpoints") == before


def test_resuming_with_another_optimizer_is_refused_and_left_untouched(corpus, trained):
    """Adagrad's checkpoints cannot continue as Adam's (the state differs): one line naming both and the
    fine-tuning start that does work, before any checkpoint is read as corrupt or moved aside."""
    before = tree_digest(trained / "checkpoints")
    args = tiny_args(corpus, trained, optimizer="adam", learning_rate=0.001, num_train_steps=4)
    line = error_line(run_train(*args))
    assert "optimizer is 'adagrad' there but 'adam' in this config" in line, line
    assert f"--config.init_from={trained} --config.init_from_optimizer=False" in line, line
    assert tree_digest(trained / "checkpoints") == before


def test_init_from_a_workdir_of_another_optimizer_needs_a_fresh_optimizer_state(corpus, trained, tmp_path):
    """Fine-tuning a workdir trained with Adagrad with Adam cannot continue its accumulators (the default
    init_from_optimizer=True): one line saying so and which flag starts Adam afresh."""
    args = tiny_args(corpus, tmp_path / "w", optimizer="adam", learning_rate=0.001, init_from=trained)
    line = error_line(run_train(*args))
    assert f"--config.init_from={trained}: its run trained with --config.optimizer=adagrad" in line, line
    assert "--config.init_from_optimizer=False" in line


def test_resuming_with_another_vocabulary_of_the_same_size_is_refused(corpus, trained, tmp_path):
    """Issue #17 case 8: two lines of WORKDIR/vocab.txt swapped (the same size, other ids) were accepted
    on resume; now the resume names the vocabulary and changes no checkpoint."""
    workdir = tmp_path / "w"
    shutil.copytree(trained, workdir)
    words = (workdir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    words[3], words[4] = words[4], words[3]
    (workdir / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    before = tree_digest(workdir / "checkpoints")
    line = error_line(run_train(*tiny_args(corpus, workdir, num_train_steps=4)), "vocab_sha256", "other words")
    assert str(workdir) in line
    assert tree_digest(workdir / "checkpoints") == before
