"""The progress line of a long run (`embed_file`): sentences done, sentences/s, tokens/s and the ETA on
standard error, rewritten in place on a terminal and every 30 s into a log."""

from __future__ import annotations

import sys
import time

import numpy as np


class Progress:
    """A progress line on standard error: sentences, sentences/s, tokens/s, ETA (blank lines not counted)."""

    def __init__(self, total_lines: int, total_tokens: int, enabled: bool):
        self.total_lines, self.total_tokens, self.enabled = total_lines, max(total_tokens, 1), enabled
        self.lines = self.tokens = 0
        self.start = self.last = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def update(self, lines: int, tokens: int) -> None:
        self.lines, self.tokens = self.lines + lines, self.tokens + tokens
        now = time.perf_counter()
        if self.enabled and now - self.last >= (0.5 if self.tty else 30.0):
            self.last = now
            self._print(now, end="\r" if self.tty else "\n")

    def close(self) -> None:
        if self.enabled:
            self._print(time.perf_counter(), end="\n")

    def _print(self, now: float, end: str) -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = self.tokens / elapsed
        eta = (self.total_tokens - self.tokens) / rate if rate > 0 else float("nan")
        print(
            f"{self.lines:,}/{self.total_lines:,} sentences  {self.lines / elapsed:,.1f} sentences/s  "
            f"{rate:,.0f} tokens/s  "
            f"{100 * self.tokens / self.total_tokens:5.1f}%  ETA {_clock(eta)}",
            end=end,
            file=sys.stderr,
            flush=True,
        )


def _clock(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
