"""`python train.py` as a person runs it: mistakes end with exit code 1 and one `error:` line on stderr
that names the key, value or file at fault, never a Python traceback; and a refused run leaves an
existing workdir's checkpoints untouched.

Each case is one subprocess (a JAX import each, so they are few). The model is configs/default.py
with command-line overrides for a tiny LSTM; `model.filters` is a list, which config flags cannot
override, so the published filter bank stays, without highway layers to keep it cheap.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import elmo_jax

REPO = Path(__file__).resolve().parents[1]
LSTM_DIM = 16


def run_train(*args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def error_line(result: subprocess.CompletedProcess) -> str:
    """Checks a refused run (exit 1, no traceback, exactly one `error:` line, last) and returns that line."""
    assert result.returncode == 1, f"exit code {result.returncode}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert result.stderr.rstrip().splitlines()[-1] == errors[0], "the error line must end the output"
    return errors[0]


def tree_digest(directory) -> str:
    """Hash of every file's relative path and bytes under `directory`."""
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(directory)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, directory).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_corpus")
    rng = np.random.default_rng(0)
    words = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log"]
    for split, n in (("train", 60), ("heldout", 10)):
        lines = [" ".join(rng.choice(words, int(rng.integers(2, 7)))) for _ in range(n)]
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def tiny_args(corpus, workdir, **overrides) -> list[str]:
    values = {"model.char_embed_dim": 4, "model.n_highway": 0, "model.lstm_dim": LSTM_DIM,
              "model.projection_dim": 8, "batch_size": 8, "unroll_steps": 5, "num_train_steps": 2,
              "n_negative_samples": 8, "checkpoint_every_steps": 1, "eval_max_batches": 2,
              "data.train_files": corpus / "train.txt", "data.heldout_files": corpus / "heldout.txt",
              "data.cache_dir": corpus / "prepared"}
    values.update(overrides)
    return ["--config=configs/default.py", f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in values.items()]


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A workdir trained for 2 steps through the command line (LSTM_DIM cells)."""
    workdir = tmp_path_factory.mktemp("cli_trained")
    result = run_train(*tiny_args(corpus, workdir))
    assert result.returncode == 0, result.stderr[-5000:]
    return workdir


def test_cli_trains_checkpoints_and_exports(trained):
    assert sorted(os.listdir(trained / "checkpoints")) == ["1", "2"]
    loaded = elmo_jax.load_hdf5(trained / "export" / "options.json", trained / "export" / "weights.hdf5")
    assert loaded.config.lstm_dim == LSTM_DIM and loaded.config.n_highway == 0


@pytest.mark.parametrize("override,named", [
    ("--config.model.lstm_dimm=16", "lstm_dimm"),
    ("--config.batch_size=abc", "batch_size"),
], ids=["unknown_key", "bad_value"])
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


def test_schedule_settings_below_one_are_refused_before_training(tmp_path):
    """checkpoint_every_steps=0 used to divide by zero after the first (compiled) step."""
    for key in ("checkpoint_every_steps", "log_every_steps", "num_train_steps"):
        result = subprocess.run([sys.executable, "train.py", "--config=configs/demo.py",
                                 f"--workdir={tmp_path / key}", f"--config.{key}=0"], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines()[-1] == f"error: --config.{key} must be at least 1, found 0"
        assert not (tmp_path / key).exists()
