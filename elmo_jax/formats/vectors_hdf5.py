"""The HDF5 layout of AllenNLP's `elmo` command, written so that it appears complete or not at all.

One dataset per input line, named by its 0-based line index: float (L+1, n, 2P) with all layers,
(n, 2P) for one vector per token, (2P,) for one per sentence (`sentence_mean`, an elmo-jax addition);
plus "sentence_to_index", one string holding a JSON object from each
sentence (its tokens joined by one space) to its dataset name. elmo-jax also marks the file with a
root attribute `format` (`FORMAT`), which h5py readers of the layout never see as a dataset.
`embed_file` writes the file (`VectorsWriter`) inside its staging directory and renames it onto the
target when complete; an existing file at the target is only ever replaced by a complete one, and only
one of these (`VECTORS_FILE`).

HDF5 does not survive a failed write: once a write has failed (a full disk), closing the file, or the
process exiting, crashes inside the library (a segmentation fault; h5py issue #914). So the writer is told
how large the file can get, refuses before HDF5 writes anything when that is over the process's file size
limit, and reserves the disk blocks first (`fallocate`, where the file system has it), so that a full
disk is an error line, not a crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
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
      size_bound: at most how many bytes the file will have (`size_bound`): refused at once, naming
        `output`, when over the file size limit or the disk's room; 0 to write without the check.
    """

    def __init__(
        self, path: str, output: str, *, float16: bool = False, sentence_index: bool = True, size_bound: int = 0
    ):
        self.path, self.output, self.sentence_index, self.size_bound = path, output, sentence_index, size_bound
        self.dtype = np.dtype(np.float16 if float16 else np.float32)
        self.index: dict[str, str] = {}
        self.datasets = 0
        self.h5 = None

    def __enter__(self):
        import h5py

        _check_file_size_limit(self.size_bound, self.output)
        with self._writing():
            self.h5 = h5py.File(self.path, "w")
            self._type = h5py.h5t.py_create(self.dtype)
        try:
            _reserve(self.path, self.size_bound, self.output)
        except BaseException:
            self.__exit__(None, None, None)
            raise
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
            with open(self.path, "r+b") as f:
                _release_reserve(f.fileno(), self.size_bound)
                os.fsync(f.fileno())


def size_bound(data_bytes: int, lines: int, text_bytes: int) -> int:
    """At most how many bytes a file of `lines` datasets holding `data_bytes` of vectors, whose sentences
    are `text_bytes` of UTF-8, has: HDF5 spends under 400 bytes per dataset (measured: 362-380 B, names
    of up to 6 digits), and the JSON of sentence_to_index at most 6 bytes per byte of text (\\uXXXX
    escapes) and 32 per line."""
    return data_bytes + lines * (1024 + 32) + 6 * text_bytes + 65536


def _check_file_size_limit(size: int, output: str) -> None:
    try:
        import resource  # POSIX only: imported here so that the package imports on Windows
    except ImportError:  # Windows: no per-process file size limit (RLIMIT_FSIZE), nothing to check
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY and size > soft:
        error = OSError(
            f"{output}: the file needs up to {size:,} bytes, over this process's file size limit of {soft:,} bytes "
            "(ulimit -f); nothing was left under that name"
        )
        error.errno = errno.EFBIG
        raise error


FALLOC_FL_KEEP_SIZE = 1


def _fallocate():
    """Linux's fallocate(2), or None."""
    try:
        call = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError, TypeError):  # TypeError: CDLL(None) on Windows (no fallocate there)
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return call


def _reserve(path: str, size: int, output: str) -> None:
    """Allocates `size` bytes of disk to the file at `path` without changing its length; a disk without
    room is an OSError naming `output`. Nothing happens without fallocate or its support."""
    fallocate = _fallocate() if size > 0 else None
    if fallocate is None:
        return
    fd = os.open(path, os.O_WRONLY)
    try:
        if fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, size) != 0:
            code = ctypes.get_errno()
            if code in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return
            error = OSError(
                f"{output}: the file needs up to {size:,} bytes and the disk has no room for them "
                f"({os.strerror(code)}); nothing was left under that name"
            )
            error.errno = code
            raise error
    finally:
        os.close(fd)


def _release_reserve(fd: int, size: int) -> None:
    """Gives back what `_reserve` allocated past the file's end (a truncation frees blocks past the end;
    ext4 punches no hole there)."""
    end = os.fstat(fd).st_size
    if size > end and _fallocate() is not None:
        try:
            os.ftruncate(fd, end + 1)
            os.ftruncate(fd, end)
        except OSError:  # at the file size limit: the blocks stay reserved, which is harmless
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
