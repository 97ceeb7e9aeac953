"""Local files for places that may be in a bucket: for readers and writers that need a file system (h5py,
array_record, a spool of many small appends), and for work kept on this machine across runs.

For a local place each of these is the place itself, at no cost; for a URL:

- `local_copy` / `local_directory`: a temporary local copy to read (a file, a whole directory);
- `mirror`: a local copy of a directory kept across runs and downloaded again when the objects under
  it change (their listing is the key);
- `working_copy`: a local file of this machine to write instead of a URL, uploaded in one piece when the
  writer finishes, and kept where a stopped writer can continue it;
- `Workspace`: a local directory of this machine for everything a place holds (prepared corpora,
  extracted archives), whose subdirectories are fetched from the place and published to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator

from elmo_jax.storage import atomic, places
from elmo_jax.storage.publish import upload_file, upload_tree


@contextlib.contextmanager
def local_copy(path: str | os.PathLike) -> Iterator[str]:
    """A local file with the content of `path` (itself when local), for readers that need one (h5py).
    A URL with no object raises FileNotFoundError naming it."""
    if not places.is_remote(path):
        yield os.fspath(path)
        return
    if not places.isfile(path):
        raise FileNotFoundError(f"{os.fspath(path)}: no such file")
    with tempfile.TemporaryDirectory(prefix="elmo_jax_download_") as tmp:
        local = os.path.join(tmp, places.basename(path))
        fs, name = places._fs(path)
        with places.reaching(path):
            fs.get_file(name, local)
        yield local


@contextlib.contextmanager
def local_directory(path: str | os.PathLike) -> Iterator[str]:
    """A local directory with the content of `path` (itself when local), removed afterwards."""
    if not places.is_remote(path):
        yield os.fspath(path)
        return
    with tempfile.TemporaryDirectory(prefix="elmo_jax_download_") as tmp:
        download_tree(os.fspath(path), tmp)
        yield tmp


def download_tree(source: str, local: str | os.PathLike) -> None:
    """Copies every object under the URL `source` into the local directory `local` (created)."""
    fs, name = places._fs(source)
    os.makedirs(local, exist_ok=True)
    prefix = name.rstrip("/") + "/"
    with places.reaching(source):
        for found in fs.find(name):
            relative = found[len(prefix) :] if found.startswith(prefix) else posixpath.basename(found)
            destination = os.path.join(os.fspath(local), *relative.split("/"))
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            fs.get_file(found, destination)


def download_tree_whole(source: str, local: str | os.PathLike) -> None:
    """`download_tree` published at `local` (`atomic.publish_directory`): `local` holds all of `source` or
    does not exist. Another process's copy that got there first is kept."""
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(local))), exist_ok=True)
    atomic.publish_directory(local, lambda staging: download_tree(source, staging), existing="keep")


def mirror(path: str, purpose: str, under: str = "copy") -> str:
    """A local directory with the content of the directory `path`: `path` itself when local; for a URL a
    copy at $TMPDIR/elmo_jax_<purpose>/<hash of the URL>/<hash of its listing>/<under>, downloaded once
    and again whenever an object under it is added, removed or rewritten (the listing, every object's
    name, size and generation, is read at each call: one request per 1000 objects); older copies are
    removed. `under`: the copy's relative path ("a/b"), for readers that expect a layout above it."""
    if not places.is_remote(path):
        return path
    url = path.rstrip("/")
    found = places.listing(url)
    url_key = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    listing_key = hashlib.sha256(json.dumps(sorted(found.items())).encode("utf-8")).hexdigest()[:16]
    copies = os.path.join(tempfile.gettempdir(), f"elmo_jax_{purpose}", url_key)
    local = os.path.join(copies, listing_key, *under.split("/"))
    if not os.path.isdir(local):
        download_tree_whole(url, local)
        for older in set(os.listdir(copies)) - {listing_key}:  # copies of what the bucket held before
            shutil.rmtree(os.path.join(copies, older), ignore_errors=True)
    return local


def _machine_directory(place: str, purpose: str) -> str:
    """$TMPDIR/elmo_jax_<purpose>/<hash of the place>: this machine's directory for a URL."""
    key = hashlib.sha256(place.rstrip("/").encode("utf-8")).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"elmo_jax_{purpose}", key)


@contextlib.contextmanager
def working_copy(target: str | os.PathLike, purpose: str = "outputs") -> Iterator[str]:
    """A local path at which to write the file `target`: `target` itself when local; for a URL a file of
    this machine, $TMPDIR/elmo_jax_<purpose>/<hash of the URL>/<name> (kept across runs, so that a
    stopped writer continues it there), uploaded to `target` in one piece when the block ends without an
    error, then removed. The caller's own checks of `target` (the output rules) come first."""
    if not places.is_remote(target):
        yield os.fspath(target)
        return
    local = os.path.join(_machine_directory(os.fspath(target), purpose), places.basename(target))
    os.makedirs(os.path.dirname(local), exist_ok=True)
    yield local
    try:
        upload_file(local, target)
    except OSError as e:  # the service unreachable: say where the finished file is
        raise type(e)(f"{e}; the finished file is kept on this machine, {local}") from e
    os.unlink(local)


def is_working_copy(local: str, target: str | os.PathLike) -> bool:
    """Whether `local` (from `working_copy(target)`) is a copy on this machine rather than `target`
    itself: a file the writer owns (replacing a finished one not yet uploaded is its own business), and
    one other hosts cannot see."""
    return os.fspath(local) != os.fspath(target)


class Workspace:
    """A local directory of this machine for the work a place holds: the place itself when local; for a
    URL, $TMPDIR/elmo_jax_<purpose>/<hash of the URL>/, kept across runs. Subdirectories are published
    to the place (`publish`) and fetched from it (`fetch`); for a local place both are nothing to do.

    Attributes:
      place: the local path or URL.
      local: the local directory.
    """

    def __init__(self, place: str | os.PathLike, purpose: str):
        self.place = os.fspath(place)
        self.local = self.place if not places.is_remote(self.place) else _machine_directory(self.place, purpose)

    @property
    def shared(self) -> bool:
        """Whether the place is the local directory itself (nothing to fetch or publish)."""
        return self.local == self.place

    def local_path(self, *parts: str) -> str:
        return os.path.join(self.local, *parts)

    def place_path(self, *parts: str) -> str:
        return places.join(self.place, *parts)

    def published(self, relative: str, marker: str) -> bool:
        """Whether the subdirectory `relative` is complete at the place (its `marker` file is there)."""
        return places.exists(self.place_path(*relative.split("/"), marker))

    def fetch(self, relative: str) -> None:
        """Downloads the subdirectory `relative` from the place into the local directory, whole."""
        if not self.shared:
            download_tree_whole(self.place_path(*relative.split("/")), self.local_path(*relative.split("/")))

    def publish(self, relative: str, last: str) -> None:
        """Uploads the local subdirectory `relative` to the place, `last` after every other file."""
        if not self.shared:
            upload_tree(self.local_path(*relative.split("/")), self.place_path(*relative.split("/")), last=last)

    def publish_file(self, relative: str) -> None:
        """Uploads the local file `relative` to the place (one upload: complete or absent there)."""
        if not self.shared:
            upload_file(self.local_path(*relative.split("/")), self.place_path(*relative.split("/")))
