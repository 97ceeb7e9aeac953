"""The HDF5 layout of AllenNLP's `elmo` command, written so that it appears complete or not at all.

One dataset per input line, named by its 0-based line index: float (L+1, n, 2P) with all layers,
(n, 2P) for one vector per token, (2P,) for one per sentence (`sentence_mean`, an elmo-jax addition);
plus "sentence_to_index", one string holding a JSON object from each
sentence (its tokens joined by one space) to its dataset name. elmo-jax also marks the file with a
root attribute `format` (`FORMAT`), which h5py readers of the layout never see as a dataset.
`embed_file` writes the file (`VectorsWriter`) inside its staging directory and renames it onto the
target when complete; an existing file at the target is only ever replaced by a complete one, and only
one of these (`VECTORS_FILE`).
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np

from elmo_jax.formats.output_paths import Artifact

FORMAT = "elmo-jax vectors: AllenNLP elmo-command layout"
INDEX = "sentence_to_index"


def is_vectors_file(path: str) -> bool:
    """Whether `path` is an HDF5 file in this layout: marked with `FORMAT`, or (written by AllenNLP's
    `elmo` command) holding only datasets named by line index and `sentence_to_index`."""
    from elmo_jax import storage

    try:
        with storage.local_copy(path) as local:
            return _is_vectors_file(local)
    except OSError:
        return False


def _is_vectors_file(path: str) -> bool:
    """`is_vectors_file` of a local file."""
    import h5py

    try:
        if not h5py.is_hdf5(path):
            return False
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") == FORMAT:
                return True
            names = list(f.keys())
            return bool(names) and all(
                (name.isdigit() or name == INDEX) and isinstance(f[name], h5py.Dataset) for name in names
            )
    except (OSError, ValueError):
        return False


VECTORS_FILE = Artifact("an elmo-command HDF5 vectors file", is_directory=False, recognizes=is_vectors_file)


class VectorsWriter:
    """Writes a new HDF5 file in the `elmo`-command layout, one line at a time (a context manager).

    The file is written where it is told (`embed_file` writes it inside its staging directory and
    renames it onto the output when `commit` has returned); an exception removes it. Datasets are
    made with h5py's low-level API: the high-level `create_dataset` and slice assignment spend several
    times as long in Python per line, which for short sentences was most of the time of writing the file
    (measured: bench/RESULTS.md, "Design figures").

    Args:
      path: the file to create.
      output: the name to give in error messages (--output).
      float16: store float16 instead of float32.
      sentence_index: write the sentence_to_index dataset.
    """

    def __init__(self, path: str, output: str, *, float16: bool = False, sentence_index: bool = True):
        self.path, self.output, self.sentence_index = path, output, sentence_index
        self.dtype = np.dtype(np.float16 if float16 else np.float32)
        self.index: dict[str, str] = {}
        self.datasets = 0
        self.h5 = None

    def __enter__(self):
        import h5py

        with self._writing():
            self.h5 = h5py.File(self.path, "w")
            self._type = h5py.h5t.py_create(self.dtype)
        return self

    def __exit__(self, kind, value, traceback):
        if self.h5 is not None:  # not committed: remove what was written, whatever closing says
            try:
                self.h5.close()
            except Exception:  # a full disk fails the close too; the file goes anyway
                pass
            finally:
                _unlink(self.path)

    @contextlib.contextmanager
    def _writing(self):
        """h5py reports a full disk or a locked file as RuntimeError/OSError naming the temporary file."""
        try:
            yield
        except (RuntimeError, OSError) as e:
            raise OSError(
                f"--output={self.output}: writing the HDF5 file failed ({e}); nothing was left under that name"
            ) from None

    def add(self, line: int, tokens: list[str], vectors: np.ndarray) -> None:
        """The dataset of `line` (named by its 0-based index) holding `vectors`."""
        from h5py import h5d, h5s

        vectors = np.ascontiguousarray(vectors, self.dtype)
        with self._writing():
            dataset = h5d.create(self.h5.id, str(line).encode(), self._type, h5s.create_simple(vectors.shape))
            if vectors.size:
                dataset.write(h5s.ALL, h5s.ALL, vectors)
        self.datasets += 1
        if self.sentence_index:
            self.index[" ".join(tokens)] = str(line)

    def commit(self) -> None:
        """Writes the index and the format mark, closes and syncs the file (still under `path`)."""
        import h5py

        with self._writing():
            if self.sentence_index:
                index = self.h5.create_dataset(INDEX, (1,), dtype=h5py.string_dtype())
                index[0] = json.dumps(self.index)
            self.h5.attrs["format"] = FORMAT
            self.h5.close()
            self.h5 = None
            with open(self.path, "rb") as f:
                os.fsync(f.fileno())


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
