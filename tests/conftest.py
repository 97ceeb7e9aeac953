"""Shared test setup: 8 forced CPU devices, strict rank promotion, the AllenNLP parity fixture, one
compilation cache for the commands the tests start, and the session's tiny corpus and trained run.

XLA reads `XLA_FLAGS` once, when the CPU backend starts, so the device count and the test compile
settings the running XLA accepts (`tests/support/xla_flags.py`) are set here, before anything imports
jax; sharding code then runs on 8 devices in every CI run. Helpers live in tests/support and the NumPy
references in tests/reference; test modules never import each other.
"""

from __future__ import annotations

import os

from tests.support.xla_flags import xla_flags  # imports nothing of jax

_FLAGS = xla_flags(8)  # 8 devices, and the compile settings of every process of a test session
if _FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAGS).strip()

import atexit  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Implicit broadcasting of a (N,) bias against (B, N) hides shape bugs; the library must be explicit.
jax.config.update("jax_numpy_rank_promotion", "raise")

# One persistent compilation cache for the whole session: this process, every pytest-xdist worker
# (they inherit the variable the controller sets here, before it starts them) and every process a test
# starts (`command_compilation_cache`). Many tests build the same tiny programs afresh (a new jit per
# run, per mesh equality check, per resumed run, per command), and XLA compiles dominate on CPU.
# No size limit: with one, JAX locks every entry and lists the whole directory on each write, which cost
# 29% more CPU on the compile-heavy modules than a cache per worker (docs/TESTING.md); without, 5% less.
# A reader racing a writer of the same entry gets a compressed stream cut short, which JAX reports as a
# warning and compiles instead. Set before anything compiles; removed by the process that made it.
_CACHE_VARIABLE = "ELMO_JAX_TEST_COMPILATION_CACHE"
if _CACHE_VARIABLE not in os.environ:
    os.environ[_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="elmo_jax_test_xla_cache_")
    atexit.register(shutil.rmtree, os.environ[_CACHE_VARIABLE], True)
_COMPILATION_CACHE = os.environ[_CACHE_VARIABLE]
# The package's own setting too (elmo_jax/storage/compile_cache.py), for a process that does not inherit
# JAX's variables below (a test that builds an environment of its own): the session's cache, never the
# user's ~/.cache/elmo_jax/compilation_cache.
os.environ["ELMO_JAX_COMPILATION_CACHE"] = _COMPILATION_CACHE
jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import elmo_jax  # noqa: E402
from tests.support.configs import TRAINED_STEPS, tiny_config  # noqa: E402
from tests.support.corpora import write_agreement_corpus  # noqa: E402
from tests.support.shared import once  # noqa: E402

pytest_plugins = ["tests.support.cpu_time"]

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


@pytest.fixture(scope="session", autouse=True)
def command_compilation_cache():
    """A persistent JAX compilation cache for every process the tests start (train.py, the commands, the
    notebooks' kernels): the same small programs are compiled once per session instead of once per
    process; the same cache as this process's own."""
    cache = _COMPILATION_CACHE
    names = {
        "JAX_COMPILATION_CACHE_DIR": cache,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    previous = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    yield cache
    for k, v in previous.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict:
    """The agreement-language corpus (tests/support/corpora.py): 300 training and 60 heldout sentences,
    written once per session (every worker reads the same files and prepared shards)."""
    return once(tmp_path_factory, "corpus", write_agreement_corpus)[1]


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """A finished training run of configs/tiny.py on `corpus`: N + M steps, checkpoints at N and N + M.

    Attributes:
      workdir: its workdir (checkpoints, metrics.jsonl, vocab.txt, export/); tests only read it.
      config: the config it ran with.
      final: the final heldout metrics `train_and_evaluate` returned.
    """

    workdir: str
    config: object
    final: dict


@pytest.fixture(scope="session")
def trained_run(corpus, tmp_path_factory) -> TrainedRun:
    """The session's one uninterrupted tiny training run, shared by every test that reads a trained
    workdir, a checkpoint or an export (train, evaluate, export, fine-tuning): trained once per session,
    by the first worker that needs it."""
    from elmo_jax.training.loop import train_and_evaluate

    n, m = TRAINED_STEPS
    config = tiny_config(corpus, num_train_steps=n + m, checkpoint_every_steps=n, export_extractor=True)
    workdir, final = once(tmp_path_factory, "trained_run", lambda directory: train_and_evaluate(config, str(directory)))
    return TrainedRun(str(workdir), config, final)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """URL of a Cloud Storage API on loopback (fake-gcs-server, tests/support/gcs.py) for the session,
    started by the first test that asks for it."""
    import gc

    from tests.support import gcs

    with gcs.emulator(str(tmp_path_factory.mktemp("gcs_emulator") / "server.log")) as url:
        yield url
        gc.collect()  # clients that upload when collected do it while the server still runs
