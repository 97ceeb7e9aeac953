"""Comparing what runs leave behind: pytrees bit for bit, directories by content, metrics records."""

from __future__ import annotations

import hashlib
import json
import os

import jax
import numpy as np

TIMING_KEYS = ("tokens_per_s", "steps_per_s")  # metrics that differ between otherwise identical runs
# What a training run's export (WORKDIR/export, a model directory with the run's vocabulary) holds, sorted;
# without extractor.jax when the run's export_extractor is False (the tests' default, tests/support/configs.py).
TRAINING_EXPORT_FILES = [
    "USAGE.md",
    "extractor.jax",
    "manifest.json",
    "options.json",
    "params.npz",
    "vocab.txt",
    "weights.hdf5",
]
TRAINING_EXPORT_FILES_WITHOUT_EXTRACTOR = [name for name in TRAINING_EXPORT_FILES if name != "extractor.jax"]


def assert_trees_equal(a, b) -> None:
    """Same structure and every leaf equal, bit for bit."""
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def tree_digest(directory) -> str:
    """Hash of every file's relative path and bytes under `directory`."""
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(directory)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, directory).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def read_metrics(workdir, kind: str | None = "train") -> list[dict]:
    """The records of `WORKDIR/metrics.jsonl` of one kind ("train", "eval", "resume"; None: all)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if kind is None or r.get("kind") == kind]


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING_KEYS}


def restored(workdir, step: int | None = None):
    """(TrainState on the host, data stream state) of a workdir's checkpoint (default: the newest)."""
    from elmo_jax.training.start import restore_checkpoint

    state, data_state, _ = restore_checkpoint(str(workdir), step)
    return jax.device_get(state), data_state
