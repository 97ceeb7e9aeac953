"""What training prints: the console line (`training/step_report.StepLine`), where time spent compiling and
evaluating is left out of tokens/s and steps/s and the ETA counts what is still to come (compiles expected,
every evaluation still due, the final one included, the export); and the unigram perplexity the heldout
line is read against and the windows an evaluation reads (`training/heldout.py`).
Figures worked by hand (a fake clock, a five-word vocabulary)."""

from __future__ import annotations

import pytest

from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.runtime import progress as runtime_progress
from elmo_jax.training import heldout, step_report


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(runtime_progress.time, "perf_counter", lambda: now[0])
    return now


def test_compile_and_evaluation_time_are_out_of_the_rates_and_evaluations_in_the_eta(clock):
    progress = step_report.StepLine(0, 60, sampled=True, end=step_report.RunEnd(eval_every=30, eval_windows=1))
    progress.exclude(15.0)  # compiling the step
    progress.add_tokens(1000.0)
    clock[0] += 20.0  # 10 steps in 20 s, 15 of them compiling: 2 steps/s, 200 tokens/s of training
    metrics = {"loss": 2.0}
    line = progress.line(10, metrics)
    assert metrics["steps_per_s"] == pytest.approx(2.0) and metrics["tokens_per_s"] == pytest.approx(200.0)
    # 50 steps at 2/s; the evaluations after steps 30 and 60 not timed yet: a window at 0.66 of a 0.5 s step
    assert "200 tokens/s  2.00 steps/s  ETA 26 s" in line
    progress.evaluated(30, 12.0)  # the one after step 30: out of the window, and the cost of the one left
    clock[0] += 22.0  # steps 11-30 in 10 s of training
    line = progress.line(30, {"loss": 2.0})
    assert "2.00 steps/s  ETA 27 s" in line  # 30 steps at 2/s + the final evaluation's 12 s
    assert "ppl(sampled) 7.4" in line


def test_durations_are_short_and_readable():
    assert [runtime_progress.duration(s) for s in (45, 750, 4 * 3600)] == ["45 s", "12.5 min", "4.0 h"]


def test_unigram_perplexity_by_hand(tmp_path):
    """Vocabulary <S> </S> <UNK> a b; training "a b", "a": counts a 2, b 1, </S> 2 of 5, add-one over 5
    words: p(a) = 3/10, p(b) = 2/10, p(</S>) = 3/10, p(<UNK>) = 1/10. Heldout "b c": targets b, <UNK>, </S>,
    perplexity (0.2 * 0.1 * 0.3) ** (-1/3)."""
    (tmp_path / "vocab.txt").write_text("<S>\n</S>\n<UNK>\na\nb\n", encoding="utf-8")
    vocab = Vocab.load(str(tmp_path / "vocab.txt"))
    counts = heldout.unigram_counts(["a b", "a"], vocab)
    assert counts.tolist() == [0, 2, 0, 2, 1]
    assert heldout.unigram_perplexity(counts, ["b c"], vocab) == pytest.approx((0.2 * 0.1 * 0.3) ** (-1 / 3), rel=1e-12)
    # Capped at 3 targets: the first sentence only; a sample of every other training sentence.
    assert heldout.unigram_perplexity(counts, ["b c", "a a a"], vocab, max_tokens=3) == pytest.approx(
        (0.2 * 0.1 * 0.3) ** (-1 / 3), rel=1e-12
    )
    assert heldout.unigram_counts(["a b", "a", "b", "b"], vocab, max_sentences=2).tolist() == [0, 2, 0, 1, 2]


# The ETA counts what is still to come (issue #51 item 3). On the code before it, these failed: the
# README's demo read 1.4-4.5x short and ended at "ETA 0 s" before 46 s of evaluation and export.


def _steps(progress, clock, first: int, last: int, seconds: float, shape=(24, 640)) -> None:
    """Steps `first`..`last` of one shape, each `seconds` long on the fake clock."""
    for _ in range(first, last + 1):
        progress.next_shape(shape)
        progress.add_tokens(100.0)
        clock[0] += seconds


def test_the_eta_rate_is_the_runs_not_the_last_lines(clock):
    """Steps 1-10 at 1 step/s, 11-20 at 2 steps/s: the line shows the speed now (2.00 steps/s), the ETA
    the run's (20 steps in 15 s): 20 steps left take 15 s, not 10 s. Failed before: "ETA 10 s"."""
    progress = step_report.StepLine(0, 40, sampled=True)
    clock[0] += 10.0
    progress.line(10, {"loss": 2.0})
    clock[0] += 5.0
    line = progress.line(20, {"loss": 2.0})
    assert "2.00 steps/s  ETA 15 s" in line


def test_the_final_evaluation_is_due_with_eval_every_steps_0_and_estimated_before_any_ran(clock):
    """eval_every_steps 0: the final evaluation alone, estimated from training's figures before one ran:
    30 windows at 0.66 of a 0.5 s step (9.9 s), one compile for the one character width met (a fifth of
    the 10 s training compile: 2 s), 2 s beside the windows; then the export's 3 s. 80 steps at 2/s (40
    s) + 13.9 s + 3 s = 56.9 s. Failed before: there was no `RunEnd` (AttributeError), and the ETA counted
    no evaluation with eval_every_steps 0 and no export: "ETA 40 s"."""
    end = step_report.RunEnd(eval_every=0, eval_windows=30, eval_extra_s=2.0, export_s=3.0)
    progress = step_report.StepLine(0, 100, sampled=True, end=end)
    progress.compiled((24, None), 10.0)
    clock[0] += 10.0
    _steps(progress, clock, 1, 20, 0.5)
    assert "ETA 57 s" in progress.line(20, {"loss": 2.0})
    clock[0] += 40.0
    assert "ETA 17 s" in progress.line(100, {"loss": 2.0})  # 13.9 s + 3 s: the evaluation and the export


def test_evaluations_still_due_cost_what_the_last_one_took_less_its_compiles(clock):
    """eval_every_steps 25 of 60: evaluations after steps 25 and 50, and the final one. The one after
    step 25 took 8 s: windows of width 24 and 32 took 3.0 s and 2.5 s the first time (compiling) and 1.0 s
    after, so 2.0 + 1.5 s of it were compiles, and 1 s the unigram model's pass (as estimated), neither
    done again: each still due costs 3.5 s. At step 30: 30 steps at 2/s (15 s) + 2 x 3.5 s = 22 s. Failed
    before: the final one was not counted when 60 is not a multiple of 25, and each cost the whole 8 s
    ("ETA 23 s"; here an AttributeError first, for `RunEnd`)."""
    end = step_report.RunEnd(eval_every=25, eval_windows=4, eval_extra_s=1.0)
    progress = step_report.StepLine(0, 60, sampled=True, end=end)
    _steps(progress, clock, 1, 25, 0.5)
    progress.line(25, {"loss": 2.0})
    for width, seconds in ((24, 3.0), (24, 1.0), (32, 2.5), (32, 1.0)):
        progress.eval_window(width, seconds)
    progress.evaluated(25, 8.0)
    clock[0] += 8.0
    _steps(progress, clock, 26, 30, 0.5)
    assert "ETA 22 s" in progress.line(30, {"loss": 2.0})


def test_training_compiles_still_to_come_are_expected_from_the_shapes_met_once(clock):
    """20 steps: 19 of one shape, 1 of another (compiles of 10 s and 6 s: 8 s each on average). As
    Good-Turing estimates, a step meets a shape not met yet with the chance of the shapes met once among
    the steps, 1/20; the 20 steps left meet one with the chance 1 - 0.95^20 = 0.6415: 5.13 s expected.
    20 steps at 2/s (10 s) + 5.13 s = 15.1 s. Failed before: StepLine had no `count_shape`
    (AttributeError), and no compile to come was counted ("ETA 10 s")."""
    progress = step_report.StepLine(0, 40, sampled=True)
    progress.next_shape((24, 640))
    progress.next_shape((24, 640))
    progress.compiled((24, 640), 10.0)
    clock[0] += 10.0 + 0.5 * 2
    _steps(progress, clock, 3, 19, 0.5)
    progress.next_shape((50, 640))
    progress.compiled((50, 640), 6.0)
    clock[0] += 6.0 + 0.5
    assert progress.still_due(20) == pytest.approx(8.0 * (1 - 0.95**20), rel=1e-9)
    assert "ETA 15 s" in progress.line(20, {"loss": 2.0})


def test_an_evaluations_windows_are_estimated_from_the_heldout_size():
    """8 sentences of 3 words: 4 targets each (the words and </S>), 32 targets; 2 rows x 4 steps a window:
    4 windows (the heldout stream reads them so: each row 4 sentences, 16 targets, 4 windows); at most 3
    with max_batches=3. Failed before: heldout had no `heldout_windows` (AttributeError)."""
    sentences = ["a b c"] * 8
    assert heldout.heldout_windows(sentences, batch_size=2, unroll_steps=4) == 4
    assert heldout.heldout_windows(sentences, batch_size=2, unroll_steps=4, max_batches=3) == 3
    assert heldout.heldout_windows([], batch_size=2, unroll_steps=4) == 0


# A batch meeting a char CNN shape for the first time runs with a wider one already compiled, when one
# holds it (`batch_feed.step_shape`): the demo's one batch of short words at step 585 of 600 compiled the
# whole step (8-24 s, 8-20% of the run) that no ETA foresaw.


def test_a_shape_met_once_runs_with_the_cheapest_compiled_shape_that_holds_it():
    """(positions, distinct slots); None slots hold every token, so only None holds None. Cheapest: fewest
    positions, then fewest slots. Failed before: batch_feed had no step_shape (ImportError); the loop
    compiled every shape a batch needed."""
    from elmo_jax.training.batch_feed import step_shape

    compiled = {(24, 640), (32, 512), (50, None)}
    once = {(16, 500): 1, (16, 700): 1, (16, None): 1, (56, 100): 1}
    assert step_shape((16, 500), once, compiled) == (24, 640)
    assert step_shape((16, 700), once, compiled) == (50, None)  # more slots than (24, 640) and (32, 512) have
    assert step_shape((16, None), once, compiled) == (50, None)
    assert step_shape((56, 100), once, compiled) == (56, 100)  # wider than any: its own compile
    assert step_shape((16, 500), {(16, 500): 2}, compiled) == (16, 500)  # met again: its own program
    assert step_shape((24, 640), {(24, 640): 1}, compiled) == (24, 640)
    assert step_shape((16, 500), {(16, 500): 1}, set()) == (16, 500)  # the first step of a run


def test_the_shapes_met_are_kept_so_that_a_resumed_run_chooses_as_an_uninterrupted_one():
    """A run met (24, 640) twice and ran with it; a checkpoint keeps that (`StepReport.saved`). The run
    resumed from it runs a (16, 640) batch with (24, 640) as the uninterrupted run does, and compiles
    (24, 640) in its own process first. A resumed run that forgot would compile (16, 640): its step then
    sums in another order and its metrics differ from the uninterrupted run's. Failed before: StepReport
    had no `saved` (AttributeError)."""
    import json

    from ml_collections import ConfigDict

    config = ConfigDict(dict(num_train_steps=10, full_softmax=False, max_nonfinite_steps=0, log_every_steps=1))
    first = step_report.StepReport(config, None, 0)
    assert first.progress.next_shape((24, 640)) == ((24, 640), True)
    first.progress.compiled((24, 640), 1.0)
    assert first.progress.next_shape((24, 640)) == ((24, 640), False)
    kept = json.loads(json.dumps(first.saved()))  # as the checkpoint's metadata holds it
    resumed = step_report.StepReport(config, None, 2, saved=kept)
    assert resumed.progress.next_shape((16, 640)) == ((24, 640), True)
    assert first.progress.next_shape((16, 640)) == ((24, 640), False)
    assert step_report.StepReport(config, None, 2, saved={"nonfinite_skipped": 3}).skipped == 3  # an older one
