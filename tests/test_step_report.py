"""The training console line (`training/step_report.Progress`): time spent compiling and evaluating is left
out of tokens/s and steps/s, and the ETA adds the evaluations still due, each as long as the last one.
Figures worked by hand on a fake clock."""

from __future__ import annotations

import pytest

from elmo_jax.training import step_report


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(step_report.time, "perf_counter", lambda: now[0])
    return now


def test_compile_and_evaluation_time_are_out_of_the_rates_and_evaluations_in_the_eta(clock):
    progress = step_report.Progress(0, 60, sampled=True, eval_every=30)
    progress.exclude(15.0)  # compiling the step
    progress.tokens = 1000.0
    clock[0] += 20.0  # 10 steps in 20 s, 15 of them compiling: 2 steps/s, 200 tokens/s of training
    metrics = {"loss": 2.0}
    line = progress.line(10, metrics)
    assert metrics["steps_per_s"] == pytest.approx(2.0) and metrics["tokens_per_s"] == pytest.approx(200.0)
    assert "200 tokens/s  2.00 steps/s  ETA 25 s" in line  # 50 steps at 2/s; no evaluation timed yet
    progress.evaluated(12.0)  # the one after step 30: out of the window, and the cost of the one left
    clock[0] += 22.0  # steps 11-30 in 10 s of training
    line = progress.line(30, {"loss": 2.0})
    assert "2.00 steps/s  ETA 27 s" in line  # 30 steps at 2/s + the final evaluation's 12 s
    assert "ppl(sampled) 7.4" in line


def test_durations_are_short_and_readable():
    assert [step_report._duration(s) for s in (45, 750, 4 * 3600)] == ["45 s", "12.5 min", "4.0 h"]
