"""The HDF5 layout of AllenNLP's `elmo` command, written so that it appears complete or not at all.

One dataset per input line, named by its 0-based line index: float (L+1, n, 2P) with all layers,
(n, 2P) for one vector per token; plus "sentence_to_index", one string holding a JSON object from each
sentence (its tokens joined by one space) to its dataset name. elmo-jax also marks the file with a
root attribute `format` (`FORMAT`), which h5py readers of the layout never see as a dataset. The file is
written under a temporary name next to the target and renamed by `commit`; an existing file at the
target is only ever replaced by a complete one, and only one of these (`VECTORS_FILE`).
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np

from elmo_jax.formats import atomic_write
from elmo_jax.formats.output_paths import Artifact
from elmo_jax.model.config import BiLMConfig

FORMAT = "elmo-jax vectors: AllenNLP elmo-command layout"
INDEX = "sentence_to_index"


def is_vectors_file(path: str) -> bool:
    """Whether `path` is an HDF5 file in this layout: marked with `FORMAT`, or (written by AllenNLP's
    `elmo` command) holding only datasets named by line index and `sentence_to_index`."""
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


class VectorsFile:
    """An `elmo`-command HDF5 file being written (a context manager; `commit` renames it into place).

    Args:
      path: the target file name (--output).
      config: the biLM (layer count and width).
      layers: "all" ((L+1, n, 2P) per line) or any single-vector mode ((n, 2P) per line).
      float16: store float16 instead of float32.
      sentence_index: write the sentence_to_index dataset.
    """

    def __init__(
        self, path: str, config: BiLMConfig, *, layers: str = "all", float16: bool = False, sentence_index: bool = True
    ):
        self.path, self.all_layers, self.sentence_index = path, layers == "all", sentence_index
        self.layers, self.dim = config.n_output_layers, config.output_dim
        self.dtype = np.float16 if float16 else np.float32
        self.index: dict[str, str] = {}
        self.datasets = self.lines_read = 0
        self._remaining: dict[int, int] = {}  # line -> tokens still to write
        self.tmp = None

    def __enter__(self):
        import h5py

        fd, self.tmp = atomic_write.temporary_file(self.path)
        os.close(fd)
        try:
            with self._writing():
                self.h5 = h5py.File(self.tmp, "w")
        except BaseException:
            os.unlink(self.tmp)
            raise
        return self

    def __exit__(self, kind, value, traceback):
        if self.tmp is not None:  # not committed: remove what was written, whatever closing says
            try:
                self.h5.close()
            except Exception:  # a full disk fails the close too; the file goes anyway
                pass
            finally:
                os.unlink(self.tmp)

    @contextlib.contextmanager
    def _writing(self):
        """h5py reports a full disk or a locked file as RuntimeError/OSError naming the temporary file."""
        try:
            yield
        except (RuntimeError, OSError) as e:
            raise OSError(
                f"--output={self.path}: writing the HDF5 file failed ({e}); nothing was left under that name"
            ) from None

    def create(self, line: int, tokens: list[str]) -> None:
        n = len(tokens)
        shape = (self.layers, n, self.dim) if self.all_layers else (n, self.dim)
        with self._writing():
            self.h5.create_dataset(str(line), shape=shape, dtype=self.dtype)
        self.datasets += 1
        if n:
            self._remaining[line] = n
        if self.sentence_index:
            self.index[" ".join(tokens)] = str(line)

    def write_batch(self, batch, result) -> tuple[int, int]:
        """Writes each row's vectors into its line's dataset; returns (lines completed, tokens written)."""
        vectors = np.asarray(result)  # waits for the device
        done = tokens = 0
        for row, piece in enumerate(batch.pieces):
            n = piece.n_tokens
            with self._writing():
                dataset = self.h5[str(piece.line)]
                if self.all_layers:
                    dataset[:, piece.offset : piece.offset + n] = vectors[row, :, :n]
                else:
                    dataset[piece.offset : piece.offset + n] = vectors[row, :n]
            self._remaining[piece.line] -= n
            if self._remaining[piece.line] == 0:
                del self._remaining[piece.line]
                done += 1
            tokens += n
        return done, tokens

    def commit(self) -> None:
        import h5py

        if self._remaining:  # cannot happen unless the batching loses a piece: never commit such a file
            raise RuntimeError(f"internal error: lines never embedded: {sorted(self._remaining)[:5]}")
        with self._writing():
            if self.sentence_index:
                index = self.h5.create_dataset(INDEX, (1,), dtype=h5py.string_dtype())
                index[0] = json.dumps(self.index)
            self.h5.attrs["format"] = FORMAT
            self.h5.close()
            with open(self.tmp, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(self.tmp, atomic_write.new_file_mode())
        os.replace(self.tmp, self.path)
        self.tmp = None
