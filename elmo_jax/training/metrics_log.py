"""Where training metrics go: `WORKDIR/metrics.jsonl` (one JSON object per logged step, for scripts)
and TensorBoard event files in `WORKDIR/tensorboard` (written with tensorboardX, no TensorFlow needed).
Only process 0 writes; the others get a disabled log.

metrics.jsonl is the record of a run, so losing it silently is not an option: it is a
`storage.AppendLog`, which says so and re-creates a file deleted or replaced while the run appends to it,
keeps training when it cannot be written and counts what was lost, and in a bucket (no appends) keeps
the lines in memory and uploads the object whole. Uploads happen after every evaluation, before every
checkpoint (`flush`, so a resumed run finds every record up to its checkpoint), at most every
`storage.append_log.UPLOAD_EVERY_S` seconds in between, and at the end; the TensorBoard event files go
with them (`storage.SyncedDirectory`).

The workdir itself moved or replaced is another matter: the log writes by its path, which may now name
another run's directory. `check_workdir` (the run's `WorkdirLock.check`) is asked before every record
and flush, and stops the run there (`WorkdirMovedError`) before anything is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from tensorboardX import SummaryWriter

from elmo_jax import storage


class MetricsLog:
    """Appends metrics; each `write` is flushed so a killed run keeps what it logged.

    Args:
      workdir: the run's workdir.
      enabled: False on every process but the first (nothing is written).
      check_workdir: called before each record and flush; raises when the workdir is no longer the
        run's (`WorkdirLock.check`), or None.
    """

    def __init__(self, workdir: str, enabled: bool = True, check_workdir: Callable[[], None] | None = None):
        self.enabled = enabled
        if not enabled:
            return
        self._check_workdir = check_workdir or (lambda: None)
        self.jsonl_path = storage.join(workdir, "metrics.jsonl")
        self._events = storage.SyncedDirectory(storage.join(workdir, "tensorboard"))
        self._jsonl = storage.AppendLog(self.jsonl_path, synced=self._events)
        self._tensorboard = SummaryWriter(logdir=self._events.local)

    @property
    def lost(self) -> int:
        """Records that could not be written."""
        return self._jsonl.lost if self.enabled else 0

    def write(self, step: int, metrics: dict[str, float], kind: str = "train") -> None:
        """One line {"step", "kind", **metrics}; non-finite values are written as strings ("nan", "inf")."""
        if not self.enabled:
            return
        self._check_workdir()  # before the TensorBoard event too
        record = {"step": int(step), "kind": kind}
        for name, value in metrics.items():
            value = float(value)
            record[name] = value if math.isfinite(value) else str(value)
            if math.isfinite(value):
                self._tensorboard.add_scalar(f"{kind}/{name}", value, int(step))
        self._tensorboard.flush()
        self._jsonl.write(json.dumps(record) + "\n", now=kind != "train")

    def flush(self) -> None:
        """Makes every record written so far durable (in a bucket: uploaded)."""
        if self.enabled:
            self._check_workdir()
            self._jsonl.flush()

    def close(self) -> None:
        if self.enabled:
            self._tensorboard.close()
            self._jsonl.close()
            self._events.close()
