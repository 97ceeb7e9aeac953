"""Where training metrics go: `WORKDIR/metrics.jsonl` (one JSON object per logged step, for scripts)
and TensorBoard event files in `WORKDIR/tensorboard` (written with tensorboardX, no TensorFlow needed).
Only process 0 writes; the others get a disabled log.

metrics.jsonl is the record of a run, so losing it silently is not an option: if the file is deleted or
replaced while the run appends to it, the log says so and re-creates it; if it cannot be written (a
full disk, permissions), the log says so once, keeps training, retries on every record, and counts what
was lost.
"""

from __future__ import annotations

import json
import math
import os

from absl import logging
from tensorboardX import SummaryWriter


class MetricsLog:
    """Appends metrics; each `write` is flushed so a killed run keeps what it logged."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        self.lost = 0  # records that could not be written
        if not enabled:
            return
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        self._jsonl = None
        self._failing = False
        self._open()
        self._tensorboard = SummaryWriter(logdir=os.path.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: dict[str, float], kind: str = "train") -> None:
        """One line {"step", "kind", **metrics}; non-finite values are written as strings ("nan", "inf")."""
        if not self.enabled:
            return
        record = {"step": int(step), "kind": kind}
        for name, value in metrics.items():
            value = float(value)
            record[name] = value if math.isfinite(value) else str(value)
            if math.isfinite(value):
                self._tensorboard.add_scalar(f"{kind}/{name}", value, int(step))
        self._append(json.dumps(record) + "\n")
        self._tensorboard.flush()

    def close(self) -> None:
        if self.enabled:
            if self._jsonl is not None:
                self._jsonl.close()
            self._tensorboard.close()
            if self.lost:
                logging.error("%s: %d metrics records could not be written during this run", self.jsonl_path, self.lost)

    def _append(self, line: str) -> None:
        try:
            if self._jsonl is None or self._replaced():
                self._open()
            self._jsonl.write(line)
            self._jsonl.flush()
            if self._failing:
                logging.warning("%s is writable again (%d records were lost)", self.jsonl_path, self.lost)
                self._failing = False
        except OSError as e:
            self.lost += 1
            if not self._failing:
                logging.error(
                    "cannot write %s (%s): metrics records are lost until it can be written again; training goes on",
                    self.jsonl_path,
                    e.strerror or e,
                )
                self._failing = True
            self._jsonl = None  # reopen on the next record

    def _replaced(self) -> bool:
        """Whether the open file is no longer the one at the path (deleted, or another file put there);
        re-created then, saying so."""
        try:
            same = os.path.samestat(os.fstat(self._jsonl.fileno()), os.stat(self.jsonl_path))
        except FileNotFoundError:
            same = False
        if not same:
            logging.warning(
                "%s was deleted or replaced while this run was writing it; re-creating it (the records "
                "written before are gone with the old file)",
                self.jsonl_path,
            )
            self._jsonl.close()
        return not same

    def _open(self) -> None:
        self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
