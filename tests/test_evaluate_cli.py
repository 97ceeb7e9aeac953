"""`python -m elmo_jax.evaluate`: the perplexity of a trained workdir's newest checkpoint, one JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_train import corpus, run_a  # noqa: F401  (module fixtures: the tiny corpus and a trained run)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def evaluate_cli(*args):
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "elmo_jax.evaluate", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_evaluate_matches_the_trainers_final_evaluation(run_a, corpus):  # noqa: F811
    """The same checkpoint, heldout files and batch size as the end of training: the same numbers."""
    workdir, config, final = run_a
    result = evaluate_cli(f"--workdir={workdir}", f"--files={corpus['heldout']}")
    assert result.returncode == 0, result.stderr[-2000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["step"] == config.num_train_steps
    for key in ("forward_perplexity", "backward_perplexity", "perplexity", "tokens"):
        assert line[key] == pytest.approx(final[key], rel=1e-5), key
    # Without --files it evaluates the run's own heldout data: the same files here.
    own = json.loads(evaluate_cli(f"--workdir={workdir}").stdout.strip().splitlines()[-1])
    assert own["perplexity"] == pytest.approx(final["perplexity"], rel=1e-5)


def test_evaluate_reports_bad_input_in_one_line(tmp_path, run_a):  # noqa: F811
    workdir, _, _ = run_a
    for args, expected in (([f"--workdir={tmp_path / 'missing'}"], "not a directory"),
                           ([f"--workdir={tmp_path}"], "no checkpoint"),
                           ([f"--workdir={workdir}", f"--files={tmp_path / 'none-*.txt'}"], "none-*.txt")):
        result = evaluate_cli(*args)
        assert result.returncode == 1, (args, result.stderr[-2000:])
        assert "Traceback" not in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error:") and expected in last, last
    assert not (tmp_path / "checkpoints").exists()  # evaluating never writes into a workdir
