"""Where training metrics go: `WORKDIR/metrics.jsonl` (one JSON object per logged step, for scripts)
and TensorBoard event files in `WORKDIR/tensorboard` (written with tensorboardX, no TensorFlow needed).
Only process 0 writes; the others get a disabled log.
"""

from __future__ import annotations

import json
import math
import os

from tensorboardX import SummaryWriter


class MetricsLog:
    """Appends metrics; each `write` is flushed so a killed run keeps what it logged."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
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
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        self._tensorboard.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tensorboard.close()
