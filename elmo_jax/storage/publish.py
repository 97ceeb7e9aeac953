"""Writing a file or a directory at a place, local or in a bucket, so that a reader sees the old one or
all of the new one.

Locally that is `atomic` (a staged file or directory renamed into place, synced). A bucket has no rename:
there one object upload is visible complete or not at all, so a file is one upload (from a local
temporary file when its writer needs one: h5py, np.savez), and a directory is its files uploaded one by
one with the file its readers check (its manifest) last, after removing an earlier directory's manifest
first: a reader that finds the manifest finds every file it lists, and never a mix of two versions.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from elmo_jax.storage import atomic, places


def write_file(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Calls `write(file)` and publishes what it wrote at `path`: locally a staged file renamed when
    complete (`atomic.write`); under a URL a local temporary file (seekable, as `np.savez` and h5py need)
    uploaded in one piece once `write` has returned. A `write` that raises leaves `path` untouched."""
    if not places.is_remote(path):
        atomic.write(path, write)
        return
    places._check_client(path)
    with tempfile.TemporaryDirectory(prefix="elmo_jax_upload_") as tmp:
        local = os.path.join(tmp, places.basename(path))
        with open(local, "w+b") as f:
            write(f)
        upload_file(local, path)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """`data` written at `path` (old content or all of the new, see `write_file`)."""
    if not places.is_remote(path):
        atomic.write(path, lambda f: f.write(data))
        return
    with places.reaching(path):
        places.epath(path).write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    """UTF-8 `text` written at `path` (encoded first: an unencodable string fails before anything exists)."""
    write_bytes(path, text.encode("utf-8"))


def upload_file(local: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copies a local file to `target` (a URL: one upload, streamed, visible only once complete; a local
    path: a staged copy)."""
    if places.is_remote(target):
        fs, name = places._fs(target)
        with places.reaching(target):
            fs.put_file(os.fspath(local), name)
        return
    with open(local, "rb") as source:
        atomic.write(target, lambda f: shutil.copyfileobj(source, f, 1 << 20))


def upload_tree(local: str | os.PathLike, target: str, last: str | None = None) -> None:
    """Copies the files of a local directory (recursively) under the URL `target`, the file `last` (a
    name relative to `local`) after all the others, so a reader that checks `last` sees the others."""
    local = os.fspath(local)
    names = []
    for root, _, files in os.walk(local):
        names += [os.path.relpath(os.path.join(root, name), local) for name in files]
    for name in sorted(names, key=lambda n: (n == last, n)):
        upload_file(os.path.join(local, name), places.join(target, *name.split(os.sep)))


def publish_directory(
    target: str | os.PathLike,
    fill: Callable[[str], object],
    *,
    last: str,
    existing: str = "refuse",
    accept: Callable[[str], bool] | None = None,
) -> str:
    """Builds a directory with `fill(local directory)` and publishes it whole at `target` (local or a URL).

    Args:
      target: where it goes; locally its parent must exist.
      fill: writes the directory's content into the local directory it is given.
      last: the file its readers check (its manifest): in a bucket uploaded after every other file, and
        an earlier directory's removed before any other (locally the whole directory is one rename).
      existing, accept: what to do with an existing target (`atomic.EXISTING`; `atomic.publish_directory`).

    Returns:
      `target`.
    """
    if not places.is_remote(target):
        return atomic.publish_directory(target, fill, existing=existing, accept=accept)
    if existing not in atomic.EXISTING:
        raise ValueError(f"existing={existing!r}: expected one of {atomic.EXISTING}")
    target = os.fspath(target).rstrip("/")
    with tempfile.TemporaryDirectory(prefix="elmo_jax_publish_") as staging:
        fill(staging)
        if places.exists(target):
            if existing == "refuse":
                raise FileExistsError(errno.EEXIST, f"{target} already exists")
            if existing == "keep":
                if accept is not None and not accept(target):
                    raise FileExistsError(errno.EEXIST, f"{target} already exists and is not a complete copy")
                return target
            places.remove(places.join(target, last))  # readers stop trusting the old one first
            places.rmtree(target)
        upload_tree(staging, target, last=last)
    return target


def is_unfinished_publish(directory: str | os.PathLike, last: str) -> bool:
    """Whether `directory` is a `publish_directory` cut short: files but not `last`. Only a bucket can hold
    one (there a directory is uploaded file by file); a local publish is one rename, complete or absent."""
    if not places.is_remote(directory) or not places.exists(directory):
        return False
    names = set(places.listdir(directory))
    return bool(names) and last not in names
