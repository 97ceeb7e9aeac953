"""Progress lines of long runs, one printer for all of them: training's step line, the file pipeline's
sentences, a download's bytes, a corpus's shards and its token counts.

    progress = Progress({"sentences": 5_000, "tokens": 120_000}, by="tokens")
    for batch in batches:
        progress.update(sentences=len(batch), tokens=n)  # the counted line, when one is due
    progress.close()                                     # the last one

A `Progress` owns the clock, when a line is due (every 0.5 s, rewritten in place, on a terminal; every
30 s into a log or a redirected standard error; or every so many units), the rates, an honest ETA, the
durations' wording and where lines go (standard error, or absl's log). Its caller says what a line says:
the counted line (`line`), or one of its own built from `rate`, `eta` and `duration`, given to `write`.

Honest rates and ETA: time that is not the work (compiling a step, evaluating) is `exclude`d from the
rates; what is still due beyond the counted units (evaluations to come) is added to the ETA
(`eta(still_due_s)`); with `window=True` the rates are those since the last line (the speed now), else
since the start; units done before this process started (`start`, a resumed run's) are in no rate.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping

from absl import logging


class Progress:
    """Counts the units of a run's work against their totals, and writes its progress lines.

    Args:
      totals: counter name -> its total (None: not known), in the order the counted line shows them,
        e.g. {"steps": 10_000, "tokens": None}; `add` may count other names too.
      by: the counter the share done and the ETA are measured in (default: the first).
      start: counter -> units done before this run started: counted as done, never in a rate.
      every_s: the least seconds between two lines (default 0.5 on a terminal, else 30; 0: every call).
      every: instead of `every_s`, a line each time another `every` units of `by` are done; given with
        `every_s`, a line once both are past (the rarer of the two: a run that goes fast writes few lines).
      log: lines go to absl's log (INFO) instead of standard error.
      window: rates over the time since the last line instead of since the start.
      enabled: False writes nothing (the counts, rates and ETA still work).
      clock: seconds, increasing (default `time.perf_counter`, read at each call; tests pass their own).
    """

    def __init__(
        self,
        totals: Mapping[str, float | None],
        *,
        by: str | None = None,
        start: Mapping[str, float] | None = None,
        every_s: float | None = None,
        every: float | None = None,
        log: bool = False,
        window: bool = False,
        enabled: bool = True,
        clock: Callable[[], float] | None = None,
    ):
        self.totals = dict(totals)
        self.by = by if by is not None else next(iter(self.totals))
        self.done = {name: 0.0 for name in self.totals} | dict(start or {})
        self.log, self.window, self.enabled, self._clock = log, window, enabled, clock
        # In place on a terminal only: a log file, a CI log or a notebook cell would keep every redraw.
        self.tty = not log and sys.stderr.isatty()
        self.every = every
        self._both = every is not None and every_s is not None
        self.every_s = (0.5 if self.tty else 30.0) if every_s is None else every_s
        self._mark = self.done.get(self.by, 0.0) + every if every else math.inf
        self._since = self._last_line = self._now()
        self._base, self._excluded, self._width = dict(self.done), 0.0, 0

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.perf_counter()

    def add(self, **amounts: float) -> None:
        """Counts `amounts` (counter -> units) as done."""
        for name, amount in amounts.items():
            self.done[name] = self.done.get(name, 0.0) + amount

    def exclude(self, seconds: float) -> None:
        """`seconds` of the rates' window were not the work (a compile, an evaluation): out of the rates."""
        self._excluded += seconds

    def seconds(self) -> float:
        """The seconds of work in the rates' window: since the start (`window`: the last line), less what
        was excluded."""
        return max(self._now() - self._since - self._excluded, 1e-9)

    def rate(self, name: str | None = None) -> float:
        """Units of `name` (default `by`) per second of work in the window, those of `start` left out."""
        name = self.by if name is None else name
        return (self.done.get(name, 0.0) - self._base.get(name, 0.0)) / self.seconds()

    def fraction(self) -> float | None:
        """The share of `by` done (None without a total)."""
        total = self.totals.get(self.by)
        return None if total is None else self.done.get(self.by, 0.0) / max(total, 1)

    def eta(self, still_due_s: float = 0.0) -> float:
        """Seconds until the end: the units of `by` left at the current rate, plus `still_due_s` (work the
        units do not count, e.g. the evaluations still due); NaN without a total or a rate."""
        total = self.totals.get(self.by)
        if total is None:
            return math.nan
        left = max(total - self.done.get(self.by, 0.0), 0.0)
        if left == 0:
            return still_due_s
        rate = self.rate()
        return left / rate + still_due_s if rate > 0 else math.nan

    def due(self) -> bool:
        """Whether a line is due: `every_s` since the last one, or the next `every` units passed (both,
        when both were given)."""
        timely = self._now() - self._last_line >= self.every_s
        if self.every:
            return self.done.get(self.by, 0.0) >= self._mark and (timely or not self._both)
        return timely

    def write(self, text: str, *, final: bool = False) -> None:
        """Writes `text` as the progress line (a `final` one is never overwritten) and starts the next
        interval (and, with `window`, the next window of the rates)."""
        now = self._now()
        self._last_line = now
        while self._mark <= self.done.get(self.by, 0.0):
            self._mark += self.every
        if self.window:
            self._since, self._base, self._excluded = now, dict(self.done), 0.0
        if not self.enabled:
            return
        if self.log:
            logging.info("%s", text)
            return
        end = "\r" if self.tty and not final else "\n"
        print(text.ljust(self._width), end=end, file=sys.stderr, flush=True)  # blanks clear a longer last one
        self._width = len(text) if end == "\r" else 0

    def line(self) -> str:
        """The counted line: the first counter done (of its total), each counter's rate, the share done
        and the ETA, e.g. `1,000/5,000 sentences  8.3 sentences/s  201 tokens/s   20.0%  ETA 6.5 min`."""
        first, total = next(iter(self.totals.items()))
        parts = [f"{self.done[first]:,.0f}" + (f"/{total:,.0f}" if total is not None else "") + f" {first}"]
        parts += [f"{_amount(self.rate(name))} {name}/s" for name in self.totals]
        fraction = self.fraction()
        if fraction is not None:
            parts.append(f"{100 * fraction:5.1f}%")
        return "  ".join(parts + [f"ETA {duration(self.eta())}"])

    def update(self, **amounts: float) -> None:
        """Counts `amounts` as done (`add`), and writes the counted line when one is due."""
        self.add(**amounts)
        if self.due():
            self.write(self.line())

    def close(self) -> None:
        """Writes the last counted line."""
        self.write(self.line(), final=True)


def _amount(rate: float) -> str:
    """A rate as a line shows it: one decimal below 100 (8.3 sentences/s), none above (1,234 tokens/s)."""
    return f"{rate:,.1f}" if rate < 100 else f"{rate:,.0f}"


def duration(seconds: float) -> str:
    """A short human duration: 45 s, 12.5 min, 3.2 h ("--" when it is not known)."""
    if not math.isfinite(seconds):
        return "--"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
