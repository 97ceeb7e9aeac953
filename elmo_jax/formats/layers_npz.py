"""The .npz file `python -m elmo_jax.embed_text --output` writes: `layers` (B, L+1, T, 2P) float32 and
`mask` (B, T) bool, nothing else. Local or gs://; written complete or not at all (`storage.write_file`)."""

from __future__ import annotations

import numpy as np

from elmo_jax import storage
from elmo_jax.formats.output_paths import Artifact, check_output


def is_layers_npz(path: str) -> bool:
    """Whether `path` (local or gs://) is such a file: an .npz holding exactly `layers` and `mask`."""
    try:
        with storage.open_file(path, "rb") as f, np.load(f, allow_pickle=False) as archive:
            return sorted(archive.files) == ["layers", "mask"]
    except (OSError, ValueError, EOFError):
        return False


def check_target(path: str, overwrite: bool = False, *, inputs=()) -> str:
    """Raises (naming --output) unless such a file may be written at `path` (`output_paths.check_output`:
    an existing file only with `overwrite` and only if it is such an .npz, never one of `inputs`);
    returns the absolute path."""
    return check_output(path, LAYERS_NPZ, overwrite=overwrite, inputs=inputs)


def write_npz(path: str, layers: np.ndarray, mask: np.ndarray) -> None:
    """Writes the file (locally staged and renamed; to gs://, written locally and uploaded in one piece)."""
    storage.write_file(path, lambda f: np.savez(f, layers=layers, mask=mask))


LAYERS_NPZ = Artifact("an .npz of layers and mask", is_directory=False, recognizes=is_layers_npz)
