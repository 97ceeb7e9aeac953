"""Paths that may be local or in Cloud Storage (`gs://bucket/path`): the few file operations the project
needs, in one place.

A local path goes through `os`, `glob` and `shutil` exactly as before; a URL (`gs://...`) goes through
`etils.epath` (the path type orbax and TFDS use, backed by fsspec and gcsfs), and globs through fsspec.
Other fsspec schemes would take the same route but are not tested, and the workdir lock needs gs://.
docs/CLOUD_STORAGE.md describes what each guarantee becomes in a bucket:

- a single object is written by one upload, which Cloud Storage makes visible complete or not at all, so
  `write_bytes` needs no temporary name there;
- a directory is published by uploading its files, the one a reader checks (a manifest) last
  (`upload_tree`): a reader that finds the manifest finds every file it lists;
- there is no rename: `rename` copies, then deletes the source.

Writers that need a local file (h5py, array_record, np.savez) write into a local temporary file or
directory and upload it (`write_file`, `upload_file`, `upload_tree`).
"""

from __future__ import annotations

import contextlib
import glob as glob_module
import io
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` is a URL (gs://bucket/object) rather than a local path."""
    return bool(_URL.match(os.fspath(path)))


def is_gcs(path: str | os.PathLike) -> bool:
    return os.fspath(path).startswith(("gs://", "gcs://"))


def epath(path: str | os.PathLike):
    """`etils.epath.Path` of a local path or URL."""
    from etils import epath as epath_module

    _check_client(path)
    return epath_module.Path(os.fspath(path))


def absolute(path: str | os.PathLike) -> str:
    """A local path made absolute; a URL as given, without a trailing slash."""
    path = os.fspath(path)
    return path.rstrip("/") if is_remote(path) else os.path.abspath(path)


def join(path: str | os.PathLike, *parts: str) -> str:
    path = os.fspath(path)
    return posixpath.join(path, *parts) if is_remote(path) else os.path.join(path, *parts)


def dirname(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    if not is_remote(path):
        return os.path.dirname(path)
    return posixpath.dirname(path.rstrip("/"))


def basename(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    return posixpath.basename(path.rstrip("/")) if is_remote(path) else os.path.basename(path)


def exists(path: str | os.PathLike) -> bool:
    return epath(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str | os.PathLike) -> bool:
    return epath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def isfile(path: str | os.PathLike) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    p = epath(path)
    return p.exists() and not p.is_dir()


def getsize(path: str | os.PathLike) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    fs, name = _fs(path)
    return int(fs.size(name))


def generation(path: str | os.PathLike) -> str:
    """What changes whenever the object at a URL is rewritten (its generation, else its update time)."""
    fs, name = _fs(path)
    return _generation(fs.info(name))


def _generation(info: dict) -> str:
    return str(info.get("generation") or info.get("updated") or info.get("mtime") or "")


def stat_many(urls: Sequence[str]) -> dict[str, tuple[int, str, bool]]:
    """{url: (size, `generation`, whether it is a directory)} of URLs that exist, from one listing per
    directory they are in rather than a request per object (a corpus has hundreds of files).

    Raises FileNotFoundError naming a URL that does not exist."""
    by_directory: dict[str, list[str]] = {}
    for url in urls:
        by_directory.setdefault(dirname(url), []).append(url)
    found = {}
    for directory, members in by_directory.items():
        fs, name = _fs(directory)
        try:
            entries = {posixpath.basename(e["name"].rstrip("/")): e for e in fs.ls(name, detail=True)}
        except FileNotFoundError:
            entries = {}
        for url in members:
            info = entries.get(basename(url)) or fs.info(_fs(url)[1])  # not listed: ask for it alone
            found[url] = (int(info.get("size") or 0), _generation(info), info.get("type") == "directory")
    return found


def listdir(path: str | os.PathLike) -> list[str]:
    """The names in a directory (a URL: the names under its prefix, one level)."""
    if not is_remote(path):
        return os.listdir(path)
    return sorted(p.name for p in epath(path).iterdir())


def makedirs(path: str | os.PathLike) -> None:
    """Creates a local directory and its parents; nothing to do under a URL (prefixes need no creation)."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def rmtree(path: str | os.PathLike) -> None:
    """Removes a directory and everything under it; no error when it does not exist."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError):
        epath(path).rmtree()


def remove(path: str | os.PathLike) -> None:
    """Removes one file; no error when it does not exist."""
    with contextlib.suppress(FileNotFoundError):
        epath(path).unlink() if is_remote(path) else os.unlink(path)


def rename(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Moves a file or directory (under a URL: copies every object, then deletes the source)."""
    if not is_remote(source):
        os.rename(source, target)
        return
    fs, name = _fs(source)
    fs.mv(name, _fs(target)[1], recursive=True)


def open_file(path: str | os.PathLike, mode: str = "rb", **kwargs):
    """`open` for a local path or a URL (a URL opened for writing is uploaded when closed; one opened "rb"
    is buffered like a local file: `readline(limit)` works)."""
    if not is_remote(path):
        return open(path, mode, **kwargs)
    f = epath(path).open(mode, **kwargs)
    return io.BufferedReader(f, buffer_size=1 << 20) if mode == "rb" else f


def read_bytes(path: str | os.PathLike) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` so that a reader sees the old content or all of the new: locally through a staged file
    renamed when complete (`atomic_write`), under a URL as one upload (an object appears whole or not)."""
    if not is_remote(path):
        from elmo_jax.formats import atomic_write

        atomic_write.write(path, lambda f: f.write(data))
        return
    epath(path).write_bytes(data)


def write_file(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Calls `write(file)` and publishes what it wrote at `path`, so that a reader sees the old content or
    all of the new: locally through a staged file renamed when complete (`atomic_write.write`); under a
    URL through a local temporary file (seekable, as `np.savez` and h5py need) uploaded in one piece once
    `write` has returned (an object appears whole or not). A `write` that raises leaves `path` untouched."""
    if not is_remote(path):
        from elmo_jax.formats import atomic_write

        atomic_write.write(path, write)
        return
    _check_client(path)
    with tempfile.TemporaryDirectory(prefix="elmo_jax_upload_") as tmp:
        local = os.path.join(tmp, basename(path))
        with open(local, "w+b") as f:
            write(f)
        upload_file(local, path)


def upload_file(local: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copies a local file to `target` (a URL: one upload, streamed, visible only once complete; a local
    path: a staged copy)."""
    if is_remote(target):
        fs, name = _fs(target)
        fs.put_file(os.fspath(local), name)
        return
    with open(local, "rb") as f:
        data = f.read()
    write_bytes(target, data)


def upload_tree(local: str | os.PathLike, target: str, last: str | None = None) -> None:
    """Copies the files of a local directory (recursively) under the URL `target`, the file `last` (a
    name relative to `local`) after all the others, so a reader that checks `last` sees the others."""
    local = os.fspath(local)
    names = []
    for root, _, files in os.walk(local):
        names += [os.path.relpath(os.path.join(root, name), local) for name in files]
    for name in sorted(names, key=lambda n: (n == last, n)):
        upload_file(os.path.join(local, name), join(target, *name.split(os.sep)))


def download_tree(source: str, local: str | os.PathLike) -> None:
    """Copies every object under the URL `source` into the local directory `local` (created)."""
    fs, name = _fs(source)
    os.makedirs(local, exist_ok=True)
    prefix = name.rstrip("/") + "/"
    for found in fs.find(name):
        relative = found[len(prefix) :] if found.startswith(prefix) else posixpath.basename(found)
        destination = os.path.join(os.fspath(local), *relative.split("/"))
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        fs.get_file(found, destination)


def download_tree_whole(source: str, local: str | os.PathLike) -> None:
    """`download_tree` into a staging directory renamed to `local` when complete, so that `local` holds all
    of `source` or does not exist. When another process of this machine puts its copy there first, that
    copy is kept; any other failure removes the staging directory and raises."""
    from elmo_jax.formats import atomic_write

    os.makedirs(os.path.dirname(os.fspath(local)), exist_ok=True)
    staging = atomic_write.temporary_directory(local)
    try:
        download_tree(source, staging)
        os.rename(staging, local)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not os.path.isdir(local):
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def listing(url: str) -> dict[str, tuple[int, str]]:
    """{name relative to `url`: (size, generation)} of every object under the URL `url`: what changes
    whenever any of them is rewritten, added or removed (one listing request per 1000 objects)."""
    fs, name = _fs(url)
    prefix = name.rstrip("/") + "/"
    found = fs.find(name, detail=True)
    return {
        path[len(prefix) :]: (int(info.get("size") or 0), str(info.get("generation") or info.get("updated") or ""))
        for path, info in sorted(found.items())
        if path.startswith(prefix)
    }


def glob(pattern: str | os.PathLike) -> list[str]:
    """The paths a glob matches, files and directories, sorted (`**` matches any depth, also under a URL)."""
    pattern = os.fspath(pattern)
    if not is_remote(pattern):
        return sorted(glob_module.glob(pattern, recursive=True))
    fs, name = _fs(pattern)
    scheme = pattern.split("://", 1)[0]
    return sorted(f"{scheme}://{found.rstrip('/')}" for found in fs.glob(name))


def has_magic(pattern: str) -> bool:
    return glob_module.has_magic(pattern)


@contextlib.contextmanager
def local_copy(path: str | os.PathLike) -> Iterator[str]:
    """A local file with the content of `path` (itself when local), for readers that need one (h5py)."""
    if not is_remote(path):
        yield os.fspath(path)
        return
    with tempfile.TemporaryDirectory(prefix="elmo_jax_download_") as tmp:
        local = os.path.join(tmp, basename(path))
        fs, name = _fs(path)
        fs.get_file(name, local)
        yield local


def _fs(path: str | os.PathLike):
    """(fsspec file system, its name of `path`) for a URL."""
    import fsspec

    _check_client(path)
    return fsspec.core.url_to_fs(os.fspath(path))


def _check_client(path: str | os.PathLike) -> None:
    """Raises OSError, saying what to install, when `path` is gs:// and gcsfs is missing."""
    if is_gcs(path):
        try:
            import gcsfs  # noqa: F401
        except ImportError:
            raise OSError(f"{os.fspath(path)}: gs:// paths need gcsfs: pip install 'elmo-jax[gcs]'") from None
