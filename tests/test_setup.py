"""The test environment itself: conftest must have forced 8 CPU devices and strict rank promotion."""

import jax


def test_eight_devices():
    """Sharding code needs several devices; conftest forces 8 host devices so it runs everywhere."""
    assert len(jax.devices()) == 8


def test_rank_promotion_raises():
    """Implicit rank promotion is an error in tests, so library code must broadcast explicitly."""
    assert jax.config.jax_numpy_rank_promotion == "raise"


def test_runtime_dependencies_cover_what_training_and_export_import():
    """A plain `pip install .` (no test extra) must be able to train and export: jax.export serialization
    imports flatbuffers only when called, so nothing else would catch its absence before a user's run."""
    import pathlib
    import tomllib

    pyproject = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())
    names = {
        dep.split(">")[0].split("=")[0].split("[")[0].strip().lower() for dep in pyproject["project"]["dependencies"]
    }
    for needed in (
        "jax",
        "flax",
        "optax",
        "orbax-checkpoint",
        "tensorflow-datasets",
        "h5py",
        "flatbuffers",
        "ml_collections",
        "absl-py",
        "grain",
        "tensorboardx",
    ):
        assert needed in names, needed
