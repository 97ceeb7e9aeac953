"""What training prints: the console line (`training/step_report.StepLine`), where time spent compiling and
evaluating is left out of tokens/s and steps/s and the ETA adds the evaluations still due, each as long as
the last one; and the unigram perplexity the heldout line is read against (`training/heldout.py`).
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
    progress = step_report.StepLine(0, 60, sampled=True, eval_every=30)
    progress.exclude(15.0)  # compiling the step
    progress.add_tokens(1000.0)
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
