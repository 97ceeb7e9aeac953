"""Writing HDF5 into a file object (`storage.atomic`'s staged file), a failed write an OSError on every
Python.

h5py's file-object driver calls back into Python from C. When a write fails there (a full disk, a file
size limit), Python 3.13 turns closing the file into `SystemError: <method 'seekable' of
'_io.FileIO' objects> returned a result with an exception set`, caused by the OSError
(https://github.com/h5py/h5py/issues/2221); Python 3.11 and 3.12 raise the OSError. Callers report an
OSError in one line (`could not write the export to ... (File too large)`), so the writers here re-raise
the OSError that caused it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import BinaryIO

import h5py


@contextlib.contextmanager
def hdf5_writer(f: BinaryIO) -> Iterator[h5py.File]:
    """`h5py.File(f, "w")`, closed on leaving; an OSError in h5py's callbacks is raised as that OSError.

    Raises:
      OSError: a write or flush of `f` failed (errno and message as the file object raised them).
    """
    try:
        with h5py.File(f, "w") as h5:
            yield h5
    except SystemError as error:
        cause = _os_error(error)
        if cause is None:
            raise
        raise type(cause)(*cause.args) from error


def _os_error(error: BaseException) -> OSError | None:
    """The first OSError in `error`'s chain of causes and contexts, if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
