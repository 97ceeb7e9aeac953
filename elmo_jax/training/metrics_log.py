"""Where training metrics go: `WORKDIR/metrics.jsonl` (one JSON object per logged step, for scripts)
and TensorBoard event files in `WORKDIR/tensorboard` (written with tensorboardX, no TensorFlow needed).
Only process 0 writes; the others get a disabled log.

metrics.jsonl is the record of a run, so losing it silently is not an option: if the file is deleted or
replaced while the run appends to it, the log says so and re-creates it; if it cannot be written (a
full disk, permissions), the log says so once, keeps training, retries on every record, and counts what
was lost.

A workdir in Cloud Storage cannot be appended to: there metrics.jsonl is kept in memory and uploaded
whole (one upload, so the object is always complete lines), after every evaluation, before every
checkpoint (`flush`, so a resumed run finds every record up to its checkpoint), at most every
`UPLOAD_EVERY_S` seconds in between, and at the end. A failed upload is retried with the next one; no
record is lost unless the process dies first. TensorBoard events are written to a local temporary
directory and their files uploaded with metrics.jsonl, on the same schedule.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time

from absl import logging
from tensorboardX import SummaryWriter

from elmo_jax.formats import storage

UPLOAD_EVERY_S = 10.0


class MetricsLog:
    """Appends metrics; each `write` is flushed so a killed run keeps what it logged."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        self.lost = 0  # records that could not be written
        if not enabled:
            return
        self.jsonl_path = storage.join(workdir, "metrics.jsonl")
        self._jsonl = None
        self._failing = False
        self._remote = _RemoteLog(workdir) if storage.is_remote(workdir) else None
        if self._remote is None:
            self._open()
        events = storage.join(workdir, "tensorboard") if self._remote is None else self._remote.local_events
        self._tensorboard = SummaryWriter(logdir=events)

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
        self._tensorboard.flush()
        if self._remote is not None:
            self._remote.append(json.dumps(record) + "\n", now=kind != "train")
        else:
            self._append(json.dumps(record) + "\n")

    def flush(self) -> None:
        """Makes every record written so far durable (a no-op locally, where each write is)."""
        if self.enabled and self._remote is not None:
            self._remote.upload()

    def close(self) -> None:
        if self.enabled:
            if self._jsonl is not None:
                self._jsonl.close()
            self._tensorboard.close()
            if self._remote is not None:
                self._remote.upload()
                self.lost = self._remote.pending
                self._remote.close()
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


class _RemoteLog:
    """metrics.jsonl and the TensorBoard event files of a workdir in a bucket: the lines in memory, the
    events in a local directory, both uploaded whole (see the module docstring)."""

    def __init__(self, workdir: str):
        self.url = storage.join(workdir, "metrics.jsonl")
        self._events_url = storage.join(workdir, "tensorboard")
        self.local_events = tempfile.mkdtemp(prefix="elmo_jax_tensorboard_")
        self._data = storage.read_bytes(self.url) if storage.exists(self.url) else b""
        self._uploaded = len(self._data)
        self._last = 0.0
        self._failing = False

    @property
    def pending(self) -> int:
        """Lines not uploaded yet."""
        return self._data[self._uploaded :].count(b"\n")

    def append(self, line: str, now: bool = False) -> None:
        self._data += line.encode("utf-8")
        if now or time.monotonic() - self._last >= UPLOAD_EVERY_S:
            self.upload()

    def upload(self) -> None:
        try:
            if self._uploaded != len(self._data):
                storage.write_bytes(self.url, self._data)
            for name in sorted(os.listdir(self.local_events)):
                storage.upload_file(os.path.join(self.local_events, name), storage.join(self._events_url, name))
        except Exception as e:  # the network or the bucket: keep the lines and try again with the next one
            if not self._failing:
                logging.error("cannot upload %s (%s): the next upload retries; training goes on", self.url, e)
                self._failing = True
            return
        if self._failing:
            logging.warning("%s uploaded again", self.url)
            self._failing = False
        self._uploaded, self._last = len(self._data), time.monotonic()

    def close(self) -> None:
        shutil.rmtree(self.local_events, ignore_errors=True)
