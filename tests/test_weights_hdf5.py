"""HDF5 weight IO (bilm-tf / AllenNLP layout), parameter counts, and bilm-tf's initialisers.

The fixture's weights.hdf5 is a file AllenNLP loads, so matching its layout exactly (paths, shapes,
float32) is what makes our saved files loadable by AllenNLP. Parameter counts are the published ones.
"""

from __future__ import annotations

import functools
import json
import os

import h5py
import jax
import numpy as np
import pytest

import elmo_jax
from elmo_jax.model.params import iter_flat

PUBLISHED_COUNTS = {"small": 13_593_296, "medium": 28_027_728, "original": 93_600_848}


def hdf5_datasets(path) -> dict[str, tuple]:
    """{path: (shape, dtype, values)} of every dataset in an HDF5 file."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                out.__setitem__(name, (obj.shape, obj.dtype, obj[...])) if isinstance(obj, h5py.Dataset) else None
            )
        )
    return out


def flat_weights(params) -> dict[str, np.ndarray]:
    return {path: np.asarray(leaf) for path, leaf in iter_flat(params.weights)}


# ----------------------------------------------------------------------------- round trip and layout


def test_save_load_round_trip_is_bit_exact(tiny_params, tmp_path):
    """load -> save_hdf5 -> load gives the same config and bit-identical float32 leaves."""
    elmo_jax.save_hdf5(tiny_params, tmp_path / "options.json", tmp_path / "weights.hdf5")
    reloaded = elmo_jax.load_hdf5(tmp_path / "options.json", tmp_path / "weights.hdf5")
    assert reloaded.config == tiny_params.config
    before, after = flat_weights(tiny_params), flat_weights(reloaded)
    assert set(after) == set(before)
    for path in before:
        assert after[path].dtype == np.float32, path
        assert np.array_equal(after[path], before[path]), path


def test_saved_hdf5_has_the_published_layout(tiny_params, fixture_dir, tmp_path):
    """Same dataset paths, shapes and dtype (float32) as the AllenNLP-loadable fixture, same values."""
    elmo_jax.save_hdf5(tiny_params, tmp_path / "options.json", tmp_path / "weights.hdf5")
    saved = hdf5_datasets(tmp_path / "weights.hdf5")
    reference = hdf5_datasets(fixture_dir / "weights.hdf5")
    assert sorted(saved) == sorted(reference)
    for key, (shape, dtype, values) in reference.items():
        assert saved[key][0] == shape, key
        assert saved[key][1] == np.float32 == dtype, key
        assert np.array_equal(saved[key][2], values), key


def test_saved_options_match_the_published_format(tiny_params, fixture_dir, tmp_path):
    """The saved options are JSON in the inference format (n_characters 262) with the fixture's values."""
    elmo_jax.save_hdf5(tiny_params, tmp_path / "options.json", tmp_path / "weights.hdf5")
    saved = json.loads((tmp_path / "options.json").read_text(encoding="utf-8"))
    reference = json.loads((fixture_dir / "options.json").read_text(encoding="utf-8"))
    assert saved["char_cnn"]["n_characters"] == 262
    assert saved["lstm"] == reference["lstm"]
    assert saved["char_cnn"] == reference["char_cnn"]


def test_training_keys_survive_a_round_trip(fixture_dir, tmp_path):
    """Options keys elmo-jax does not use (bilm-tf training settings) are written back unchanged."""
    options = json.loads((fixture_dir / "options.json").read_text(encoding="utf-8"))
    options.update({"dropout": 0.1, "n_tokens_vocab": 793471, "all_clip_norm_val": 10.0, "unroll_steps": 20})
    (tmp_path / "in.json").write_text(json.dumps(options), encoding="utf-8")
    params = elmo_jax.load_hdf5(tmp_path / "in.json", fixture_dir / "weights.hdf5")
    elmo_jax.save_hdf5(params, tmp_path / "out.json", tmp_path / "out.hdf5")
    saved = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    for key in ("dropout", "n_tokens_vocab", "all_clip_norm_val", "unroll_steps"):
        assert saved[key] == options[key], key


def test_training_options_with_261_characters_load_identically(tiny_params, fixture_dir, tmp_path):
    """n_characters 261 (training options) and 262 (inference options) describe the same weights."""
    options = json.loads((fixture_dir / "options.json").read_text(encoding="utf-8"))
    options["char_cnn"]["n_characters"] = 261
    (tmp_path / "options.json").write_text(json.dumps(options), encoding="utf-8")
    params = elmo_jax.load_hdf5(tmp_path / "options.json", fixture_dir / "weights.hdf5")
    assert params.config == tiny_params.config
    expected = flat_weights(tiny_params)
    for path, value in flat_weights(params).items():
        assert np.array_equal(value, expected[path]), path
    assert params.weights["char_embed"].shape == (261, 4)


# ----------------------------------------------------------------------------- atomic writes


def test_save_replaces_an_existing_file_atomically(tiny_params, tmp_path):
    """Saving over existing files replaces them with the new content and leaves no temporary files."""
    options, weights = tmp_path / "options.json", tmp_path / "weights.hdf5"
    elmo_jax.save_hdf5(tiny_params, options, weights)
    changed = tiny_params.replace(weights={**tiny_params.weights, "char_embed": tiny_params.weights["char_embed"] * 2})
    elmo_jax.save_hdf5(changed, options, weights)
    assert sorted(os.listdir(tmp_path)) == ["options.json", "weights.hdf5"]
    reloaded = elmo_jax.load_hdf5(options, weights)
    np.testing.assert_array_equal(
        np.asarray(reloaded.weights["char_embed"]), 2 * np.asarray(tiny_params.weights["char_embed"])
    )


def test_failed_save_keeps_the_old_file(tiny_params, tmp_path, monkeypatch):
    """A crash half-way through writing the weights leaves the previous weight file intact and no
    temporary file behind."""
    options, weights = tmp_path / "options.json", tmp_path / "weights.hdf5"
    elmo_jax.save_hdf5(tiny_params, options, weights)
    old_bytes = weights.read_bytes()

    real_create = h5py.Group.create_dataset
    calls = []

    def failing_create(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 5:
            raise RuntimeError("simulated crash while writing")
        return real_create(self, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", failing_create)
    changed = tiny_params.replace(weights={**tiny_params.weights, "char_embed": tiny_params.weights["char_embed"] + 1})
    with pytest.raises(RuntimeError, match="simulated crash"):
        elmo_jax.save_hdf5(changed, options, weights)
    assert weights.read_bytes() == old_bytes
    assert sorted(os.listdir(tmp_path)) == ["options.json", "weights.hdf5"]


def test_save_into_missing_directory_fails_cleanly(tiny_params, tmp_path):
    """A nonexistent target directory raises FileNotFoundError naming it, and creates nothing."""
    missing = tmp_path / "no_such_dir"
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        elmo_jax.save_hdf5(tiny_params, missing / "options.json", missing / "weights.hdf5")
    assert not missing.exists()
    assert os.listdir(tmp_path) == []


def test_save_with_weights_into_missing_directory_writes_no_options(tiny_params, tmp_path):
    """If the weight file cannot be written (its directory is missing), the options file must not be
    written either: an options file without its weights (or new options next to old weights) is a
    half-written model."""
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        elmo_jax.save_hdf5(tiny_params, tmp_path / "options.json", tmp_path / "no_such_dir" / "weights.hdf5")
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("name", sorted(PUBLISHED_COUNTS))
def test_published_parameter_counts(name):
    """`count_parameters` and the shapes `init_params` produces (traced, never materialised) give the
    published counts (docs/ELMO.md; no softmax)."""
    config = elmo_jax.BiLMConfig.preset(name)
    assert elmo_jax.count_parameters(config) == PUBLISHED_COUNTS[name]
    shapes = jax.eval_shape(functools.partial(elmo_jax.init_params, config), jax.random.key(0))
    assert shapes.config == config
    assert sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes)) == PUBLISHED_COUNTS[name]


@pytest.mark.parametrize(
    "name,dims", [("small", (1024, 128, 1)), ("medium", (2048, 256, 1)), ("original", (4096, 512, 2))]
)
def test_presets_match_the_published_sizes(name, dims):
    """Each preset has the published H, P, n_highway and the shared filter bank."""
    config = elmo_jax.BiLMConfig.preset(name)
    assert (config.lstm_dim, config.projection_dim, config.n_highway) == dims
    assert config.filters == ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
    assert (config.char_embed_dim, config.n_layers, config.cell_clip, config.proj_clip) == (16, 2, 3.0, 3.0)
    assert config.use_skip_connections and config.activation == "relu"


# ----------------------------------------------------------------------------- initialisation


MODERATE = dict(
    char_embed_dim=16,
    filters=((1, 32), (2, 32), (3, 64), (4, 128)),
    n_highway=1,
    lstm_dim=512,
    projection_dim=128,
    n_layers=2,
)


@pytest.fixture(scope="module")
def init_relu():
    config = elmo_jax.BiLMConfig(activation="relu", **MODERATE)
    return {path: np.asarray(v) for path, v in iter_flat(elmo_jax.init_params(config, jax.random.key(0)).weights)}


def _assert_std(values, expected, rel=0.05, what=""):
    std = float(np.std(values))
    assert abs(std - expected) <= rel * expected, f"{what}: std {std:.5f}, expected {expected:.5f}"


def _assert_normal_tails(values, what=""):
    """About 4.55% of a normal sample lies beyond 2 std (a uniform one has none)."""
    frac = float(np.mean(np.abs(values - values.mean()) > 2 * values.std()))
    assert 0.03 < frac < 0.065, f"{what}: {frac:.3%} beyond 2 std, not normal"


def test_init_char_embed_and_relu_convolutions(init_relu):
    """bilm-tf: char_embed U(-1, 1); relu convolutions U(-0.05, 0.05); conv biases 0."""
    emb = init_relu["char_embed"]
    assert emb.shape == (261, 16)
    assert emb.min() >= -1.0 and emb.max() <= 1.0 and np.abs(emb).max() > 0.95
    _assert_std(emb, 1 / np.sqrt(3), what="char_embed")
    kernels = np.concatenate([init_relu[f"CNN/W_cnn_{i}"].ravel() for i in range(4)])
    assert np.abs(kernels).max() <= np.float32(0.05) and np.abs(kernels).max() > 0.049
    _assert_std(kernels, 0.05 / np.sqrt(3), what="W_cnn")
    for i in range(4):
        assert np.all(init_relu[f"CNN/b_cnn_{i}"] == 0.0)


def test_init_tanh_convolutions():
    """bilm-tf: tanh convolutions N(0, 1/(width * E)), one std per filter width."""
    config = elmo_jax.BiLMConfig(activation="tanh", **MODERATE)
    weights = elmo_jax.init_params(config, jax.random.key(1)).weights
    for i, (width, _) in enumerate(config.filters):
        kernel = np.asarray(weights["CNN"][f"W_cnn_{i}"])
        _assert_std(kernel, 1 / np.sqrt(width * 16), rel=0.1, what=f"W_cnn_{i}")
        assert abs(kernel.mean()) < 0.1 / np.sqrt(width * 16)
    _assert_normal_tails(np.asarray(weights["CNN"]["W_cnn_3"]).ravel(), "W_cnn_3")


def test_init_highway_and_projection(init_relu):
    """bilm-tf: highway and CNN projection weights N(0, 1/F); b_carry -2 (the relu branch starts mostly
    closed), b_transform 0, b_proj 0."""
    F = 256
    for name in ("CNN_high_0/W_carry", "CNN_high_0/W_transform", "CNN_proj/W_proj"):
        _assert_std(init_relu[name], np.sqrt(1 / F), rel=0.03, what=name)
        _assert_normal_tails(init_relu[name].ravel(), name)
    assert np.all(init_relu["CNN_high_0/b_carry"] == -2.0)
    assert np.all(init_relu["CNN_high_0/b_transform"] == 0.0)
    assert np.all(init_relu["CNN_proj/b_proj"] == 0.0)


def test_init_lstm_glorot_uniform(init_relu):
    """TF's default for LSTMCell kernels and projections: Glorot-uniform, limit sqrt(6/(fan_in+fan_out));
    gate biases 0 (the forget bias +1 is added at run time, never stored)."""
    for d in range(2):
        for layer in range(2):
            cell = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            for name, shape in (("W_0", (256, 2048)), ("W_P_0", (512, 128))):
                w = init_relu[f"{cell}/{name}"]
                assert w.shape == shape
                limit = np.sqrt(6.0 / sum(shape))
                assert np.abs(w).max() <= np.float32(limit) and np.abs(w).max() > 0.99 * limit, f"{cell}/{name}"
                _assert_std(w, limit / np.sqrt(3), rel=0.02, what=f"{cell}/{name}")
            assert np.all(init_relu[f"{cell}/B"] == 0.0)


def test_init_uses_independent_keys(init_relu):
    """Different tensors of the same shape get different random values (no key reuse)."""
    assert not np.array_equal(init_relu["CNN_high_0/W_carry"], init_relu["CNN_high_0/W_transform"])
    fw, bw = "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0", "RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"
    assert not np.array_equal(init_relu[fw], init_relu[bw])
