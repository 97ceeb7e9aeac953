"""The one progress printer (`runtime/progress.Progress`) on a fake clock, figures worked by hand: the
counted line; rates that leave out excluded time and a resumed run's units, over the run or since the
last line; the ETA with the time still due; lines at an interval of seconds or of units, rewritten in
place on a terminal, whole in a log; and a download's lines (`formats/download.Report`) on it."""

from __future__ import annotations

import io
import sys

import pytest

from elmo_jax.formats import download
from elmo_jax.runtime import progress
from elmo_jax.runtime.progress import Progress


class Stderr(io.StringIO):
    """A standard error that is a terminal or not."""

    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    return now


@pytest.fixture
def stderr(monkeypatch):
    def make(tty: bool) -> Stderr:
        stream = Stderr(tty)
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    return make


def test_the_counted_line_at_its_interval_in_a_log(clock, stderr):
    err = stderr(tty=False)
    line = Progress({"sentences": 5000, "tokens": 120_000}, by="tokens")
    clock[0] += 10.0
    line.update(sentences=100, tokens=2000)  # 10 s < 30 s: no line yet
    assert err.getvalue() == ""
    clock[0] += 110.0
    line.update(sentences=900, tokens=22_000)
    # 1,000 sentences and 24,000 tokens in 120 s: 8.3 sentences/s, 200 tokens/s; 20% of the tokens, and
    # 96,000 left at 200/s: 480 s.
    assert err.getvalue() == "1,000/5,000 sentences  8.3 sentences/s  200 tokens/s   20.0%  ETA 8.0 min\n"


@pytest.mark.parametrize("window, rate", [(False, 12 / 8), (True, 4 / 4)])
def test_rates_leave_out_excluded_time_and_earlier_units_and_the_eta_adds_what_is_due(clock, window, rate):
    steps = Progress({"steps": 100}, start={"steps": 40}, every_s=0, window=window, enabled=False)
    steps.exclude(6.0)  # a compile
    clock[0] += 10.0
    steps.add(steps=8)  # 8 steps in 10 s, 6 of them not steps: 2 steps/s; the 40 before are in no rate
    assert steps.rate() == pytest.approx(2.0)
    assert steps.eta(still_due_s=5.0) == pytest.approx(52 / 2 + 5)  # 52 left, plus 5 s still due
    assert steps.fraction() == pytest.approx(0.48)
    steps.write("a line")  # with `window`, the next rates start here
    clock[0] += 4.0
    steps.add(steps=4)  # over the run: 12 steps in 14 - 6 s; since the line: 4 in 4 s
    assert steps.rate() == pytest.approx(rate)
    assert steps.eta() == pytest.approx(48 / rate)


def test_on_a_terminal_the_line_is_rewritten_in_place_and_the_last_one_kept(clock, stderr):
    err = stderr(tty=True)
    items = Progress({"items": 10})
    clock[0] += 0.4
    items.update(items=1)  # under 0.5 s: nothing
    clock[0] += 0.1
    items.update(items=1)  # 2 in 0.5 s: 4/s, 8 left: 2 s
    first = "2/10 items  4.0 items/s   20.0%  ETA 2 s"
    assert err.getvalue() == first + "\r"
    items.write("done", final=True)  # blanks clear what is left of the longer line
    assert err.getvalue() == first + "\r" + "done" + " " * (len(first) - 4) + "\n"


def test_in_a_log_a_line_at_each_mark_of_units(clock, monkeypatch):
    lines = []
    monkeypatch.setattr(progress.logging, "info", lambda fmt, *args: lines.append(fmt % args))
    written = Progress({"bytes": None}, every=100, log=True)
    for amount in (60, 60, 250, 10):
        written.add(bytes=amount)
        if written.due():
            written.write(f"{written.done['bytes']:.0f} bytes")
    assert lines == ["120 bytes", "370 bytes"]  # marks 100, then 200 and 300 at once; the next is 400


def test_a_download_counts_the_bytes_of_this_run_and_says_when_the_server_is_silent(clock, stderr):
    err = stderr(tty=False)
    report = download.Report("small: weights.hdf5")
    report(4_000_000, 10_000_000)  # the connection resumes a part of 4 MB
    clock[0] += 1.0
    report(5_000_000, 10_000_000)  # 1 s < 2 s: no line
    clock[0] += 1.0
    report(6_000_000, 10_000_000)  # 2 MB in 2 s; 4 MB left at 1 MB/s
    report.waiting(10.0, 60.0)
    clock[0] += 2.0
    report(10_000_000, 10_000_000)  # the end has its line: 6 MB in 4 s
    assert err.getvalue().splitlines() == [
        "downloading small: weights.hdf5: 6.0 of 10.0 MB (60%), 1.0 MB/s, ETA 4 s",
        "downloading small: weights.hdf5: no answer for 10 s, waiting (gives up after 60 s)",
        "downloading small: weights.hdf5: 10.0 of 10.0 MB (100%), 1.5 MB/s",
    ]


def test_durations_not_known_are_said_so():
    assert [progress.duration(s) for s in (89.4, 5399, float("nan"))] == ["89 s", "90.0 min", "--"]


def test_with_both_intervals_a_line_once_both_are_past(clock, monkeypatch):
    """`every` units and `every_s` seconds together (the service's warm-up: every 10% and 15 s): a line
    only once both have passed since the last, so a fast run writes few lines and a slow one no more
    than one per `every` units."""
    lines = []
    monkeypatch.setattr(progress.logging, "info", lambda fmt, *args: lines.append(fmt % args))
    programs = Progress({"programs": 100}, every=10, every_s=15, log=True)
    for seconds, amount in ((1, 30), (15, 1), (1, 10), (20, 0), (20, 5)):
        clock[0] += seconds
        programs.add(programs=amount)
        if programs.due():
            programs.write(f"{programs.done['programs']:.0f}")
    # 30 in 1 s: not 15 s yet; 31 at 16 s: both past (the next mark 40); 41 at 17 s: the mark passed,
    # 1 s after the last line; at 37 s, both; 46 at 57 s: 20 s since, under the next mark (50).
    assert lines == ["31", "41"]
    assert not programs.due()
