"""`python -m elmo_jax.evaluate`: the perplexity of a trained workdir's newest checkpoint, one JSON line."""

from __future__ import annotations

import json

import pytest

from tests.support.commands import error_line, run_command
from tests.support.inprocess import run_in_process


def evaluate(*args):
    return run_in_process("elmo_jax.evaluate", *args)


@pytest.mark.slow
def test_evaluate_matches_the_trainers_final_evaluation(trained_run, corpus):
    """The same checkpoint, heldout files and batch size as the end of training: the same numbers (the
    first in a real process, the command's one end-to-end run in the suite, on one device)."""
    result = run_command("elmo_jax.evaluate", f"--workdir={trained_run.workdir}", f"--files={corpus['heldout']}")
    assert result.returncode == 0, result.stderr[-2000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["step"] == trained_run.config.num_train_steps
    for key in ("forward_perplexity", "backward_perplexity", "perplexity", "tokens"):
        assert line[key] == pytest.approx(trained_run.final[key], rel=1e-5), key
    # Without --files it evaluates the run's own heldout data: the same files here.
    own = json.loads(evaluate(f"--workdir={trained_run.workdir}").stdout.strip().splitlines()[-1])
    assert own["perplexity"] == pytest.approx(trained_run.final["perplexity"], rel=1e-5)


def test_evaluate_reports_bad_input_in_one_line(tmp_path, trained_run):
    for args, expected in (
        ([f"--workdir={tmp_path / 'missing'}"], "not a directory"),
        ([f"--workdir={tmp_path}"], "no checkpoint"),
        ([f"--workdir={trained_run.workdir}", f"--files={tmp_path / 'none-*.txt'}"], "none-*.txt"),
    ):
        error_line(evaluate(*args), expected)
    assert not (tmp_path / "checkpoints").exists()  # evaluating never writes into a workdir
