"""Reading and writing the published ELMo weight files (options JSON + HDF5), as bilm-tf and AllenNLP do.

The HDF5 layout is bilm-tf's `dump_weights` output: one float32 dataset per variable, at the paths
listed by `params.weight_shapes` (e.g. `CNN/W_cnn_0`, `RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0`).
Every dataset is checked against the options before anything is returned, and both files are written
to temporary names and renamed, so a crash never leaves a half-written model that looks complete.
"""

from __future__ import annotations

import json
import os
import re

import h5py
import jax.numpy as jnp
import numpy as np

from elmo_jax import storage
from elmo_jax.formats.hdf5_writing import hdf5_writer
from elmo_jax.model.config import BiLMConfig, read_options
from elmo_jax.model.params import BiLMParams, check_finite, from_flat, iter_flat, weight_shapes
from elmo_jax.storage import atomic


def load_hdf5(options_file: str | os.PathLike, weight_file: str | os.PathLike) -> BiLMParams:
    """Loads a biLM from an options JSON and an HDF5 weight file.

    Raises:
      FileNotFoundError: either file is missing.
      ValueError: the options are invalid, the weight file is not HDF5, or a dataset is missing, has the
        wrong shape or dtype, or is not described by the options; the message names the file and key.
    """
    with storage.local_copy(options_file) as options, storage.local_copy(weight_file) as weights:
        config = read_options(options)
        flat = read_weights(weights, config)
    return BiLMParams(weights=from_flat({k: jnp.asarray(v) for k, v in flat.items()}), config=config)


def read_weights(weight_file: str | os.PathLike, config: BiLMConfig) -> dict[str, np.ndarray]:
    """The weight file's datasets as float32 NumPy arrays keyed by path, checked against `config`."""
    path = os.fspath(weight_file)
    _check_weight_file(path)
    expected = weight_shapes(config)
    try:
        with h5py.File(path, "r") as f:
            out, unexpected = _read_datasets(f, path, expected)
    except OSError as e:  # truncated or otherwise unreadable HDF5
        truncated = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", str(e))
        if truncated:
            raise ValueError(
                f"{path}: truncated HDF5 weight file ({truncated.group(1)} of its "
                f"{truncated.group(2)} bytes; an interrupted copy or download?)"
            ) from None
        raise ValueError(f"{path}: cannot read the HDF5 weight file ({e})") from None
    if unexpected:
        raise ValueError(
            f"{path}: datasets {unexpected} are not described by the options (check n_highway, "
            "filters and lstm.n_layers)"
        )
    return out


def _check_weight_file(path: str) -> None:
    """Raises IsADirectoryError, FileNotFoundError or ValueError unless `path` is a non-empty HDF5 file."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: expected an HDF5 weight file, found a directory")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: weight file not found")
    if os.path.getsize(path) == 0:
        raise ValueError(
            f"{path}: empty file (expected an ELMo weights .hdf5 as written by bilm-tf; an "
            "interrupted copy or download?)"
        )
    if not h5py.is_hdf5(path):
        raise ValueError(f"{path}: not an HDF5 file (expected an ELMo weights .hdf5 as written by bilm-tf)")


def _read_datasets(
    f: h5py.File, path: str, expected: dict[str, tuple[int, ...]]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The datasets of the open weight file `f` at the `expected` keys ({key: shape}) as float32 NumPy
    arrays, each checked for shape, dtype and finite values (ValueError naming `path` and the key), and
    the sorted keys of the datasets there that are not expected."""
    found = {}

    def collect(name, obj):  # returns None: visititems stops at the first non-None return
        if isinstance(obj, h5py.Dataset):
            found[name] = obj

    f.visititems(collect)
    out = {}
    for key, shape in expected.items():
        if key not in found:
            raise ValueError(
                f"{path}: missing dataset {key!r} (expected shape {shape}); the options may not match these weights"
            )
        dataset = found[key]
        if tuple(dataset.shape) != shape:
            raise ValueError(
                f"{path}: dataset {key!r} has shape {tuple(dataset.shape)}, expected {shape} from the options"
            )
        if not np.issubdtype(dataset.dtype, np.floating):
            raise ValueError(f"{path}: dataset {key!r} has dtype {dataset.dtype}, expected float32")
        out[key] = np.asarray(dataset[...], dtype=np.float32)
        check_finite({key: out[key]}, path)
    return out, sorted(set(found) - set(expected))


def save_hdf5(params: BiLMParams, options_file: str | os.PathLike, weight_file: str | os.PathLike) -> None:
    """Writes the options JSON and HDF5 weights in the published layout (loadable by AllenNLP as is).

    Each file is written to a temporary file in its directory and renamed into place, so an existing
    file is replaced only by a complete one.
    """
    if not isinstance(params, BiLMParams):
        raise ValueError(f"params must be BiLMParams, found {type(params).__name__}")
    expected = weight_shapes(params.config)
    flat = dict(iter_flat(params.weights))
    if set(flat) != set(expected):
        raise ValueError(
            f"params do not match their config: missing {sorted(set(expected) - set(flat))}, "
            f"unexpected {sorted(set(flat) - set(expected))}"
        )
    for key, shape in expected.items():
        if tuple(flat[key].shape) != shape:
            raise ValueError(f"params: {key!r} has shape {tuple(flat[key].shape)}, expected {shape}")

    options_text = json.dumps(params.config.to_options(), indent=2, sort_keys=True) + "\n"

    def write_weights(f):
        with hdf5_writer(f) as h5:
            for key in expected:  # file order: char_embed, CNN, highway, projection, RNN_0, RNN_1
                h5.create_dataset(key, data=np.asarray(flat[key], dtype=np.float32))

    # Both files are complete on disk before either replaces an existing one, so a failure (a bad path,
    # a full disk) never pairs new options with old weights.
    staged = [(atomic.stage(weight_file, write_weights), weight_file)]
    try:
        staged.append((atomic.stage(options_file, lambda f: f.write(options_text.encode("utf-8"))), options_file))
    except BaseException:
        os.unlink(staged[0][0])
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
