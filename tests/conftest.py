"""Shared test setup: 8 forced CPU devices, strict rank promotion, and the AllenNLP parity fixture.

XLA reads `XLA_FLAGS` once, when the CPU backend starts, so the device count is set here, before
anything imports jax; sharding code then runs on 8 devices in every CI run.
"""

from __future__ import annotations

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICE_FLAG).strip()

import dataclasses  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Implicit broadcasting of a (N,) bias against (B, N) hides shape bugs; the library must be explicit.
jax.config.update("jax_numpy_rank_promotion", "raise")

import elmo_jax  # noqa: E402

FIXTURE_DIR = Path(__file__).parent / "fixtures" / "allennlp_tiny"
FIXTURE_BATCHES = ("main", "main_extra_pad", "edge")


@dataclasses.dataclass(frozen=True)
class FixtureBatch:
    """One batch of the AllenNLP fixture.

    Attributes:
      name: "main", "main_extra_pad" or "edge".
      sentences: the tokenized sentences fed to AllenNLP's `batch_to_ids`.
      extra_pad: all-zero time steps AllenNLP's char ids carry beyond the longest sentence.
      arrays: the `<name>.npz` arrays (see tests/fixtures/allennlp_tiny/README.md).
    """

    name: str
    sentences: list[list[str]]
    extra_pad: int
    arrays: dict[str, np.ndarray]


def load_fixture_batch(name: str) -> FixtureBatch:
    """Reads `<name>.npz` and its sentences from `sentences.json`."""
    entry = json.loads((FIXTURE_DIR / "sentences.json").read_text(encoding="utf-8"))[name]
    if isinstance(entry, dict):  # {"extra_pad": 3, "sentences": [...]}
        sentences, extra_pad = entry["sentences"], int(entry["extra_pad"])
    else:
        sentences, extra_pad = entry, 0
    with np.load(FIXTURE_DIR / f"{name}.npz") as data:
        arrays = {key: data[key] for key in data.files}
    return FixtureBatch(name=name, sentences=sentences, extra_pad=extra_pad, arrays=arrays)


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    """tests/fixtures/allennlp_tiny: options.json, weights.hdf5, sentences.json and <batch>.npz."""
    return FIXTURE_DIR


@pytest.fixture(scope="session")
def tiny_params(fixture_dir) -> elmo_jax.BiLMParams:
    """The fixture's tiny biLM, loaded through the public HDF5 loader."""
    return elmo_jax.load_hdf5(fixture_dir / "options.json", fixture_dir / "weights.hdf5")


@pytest.fixture(scope="session", params=FIXTURE_BATCHES)
def fixture_batch(request) -> FixtureBatch:
    """Each fixture batch in turn."""
    return load_fixture_batch(request.param)


@pytest.fixture(scope="session")
def load_batch():
    """The `load_fixture_batch(name)` helper, for tests that need one particular batch."""
    return load_fixture_batch
