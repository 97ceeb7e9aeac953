"""Places: a local path or a URL (`gs://bucket/path`), and what can be asked of one: whether it exists,
what it holds, its bytes, its identity; removal. Writing and publishing are `publish`; local copies of
remote places are `local`.

A local path goes through `os`, `glob` and `shutil`; a URL through `etils.epath` (the path type orbax
and TFDS use, backed by fsspec and gcsfs), and globs and listings through fsspec. Other fsspec schemes
would take the same route but are not tested. This package is the one place that tells a URL from a
local path (`is_remote`); nothing outside it branches on that (docs/CLOUD_STORAGE.md).
"""

from __future__ import annotations

import contextlib
import glob as glob_module
import io
import os
import posixpath
import re
import shutil
from collections.abc import Iterator, Sequence

from elmo_jax.storage import outage

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` is a URL (gs://bucket/object) rather than a local path."""
    return bool(_URL.match(os.fspath(path)))


def is_gcs(path: str | os.PathLike) -> bool:
    """Whether `path` is a Cloud Storage URL (gs:// or gcs://)."""
    return os.fspath(path).startswith(("gs://", "gcs://"))


def is_location(value: str | os.PathLike) -> bool:
    """Whether `value` names a place rather than something else (a published model's name): a URL, or a
    local path that exists (a dangling link counts)."""
    return is_remote(value) or os.path.lexists(value)


def real(path: str | os.PathLike) -> str:
    """What `path` finally names: a local path with its links resolved, a URL as it is. Two paths of the
    same file have the same `real`."""
    return os.fspath(path).rstrip("/") if is_remote(path) else os.path.realpath(path)


def expand_user(pattern: str | os.PathLike) -> str:
    """A local path or glob with a leading `~` expanded; a URL as it is."""
    return os.fspath(pattern) if is_remote(pattern) else os.path.expanduser(pattern)


def lexists(path: str | os.PathLike) -> bool:
    """Whether something is at `path` (locally a dangling link counts)."""
    return exists(path) if is_remote(path) else os.path.lexists(path)


def same_place(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` name the same file or directory (locally also through links and hard links)."""
    if is_remote(a) or is_remote(b):
        return real(a) == real(b)
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return real(a) == real(b)


def is_inside(path: str | os.PathLike, directory: str | os.PathLike) -> bool:
    """Whether `path` lies (at any depth) under `directory`, links resolved."""
    separator = "/" if is_remote(directory) else os.sep
    return real(path).startswith(real(directory).rstrip(separator) + separator)


def ancestors(path: str | os.PathLike) -> list[str]:
    """The directories above `path`, nearest first, links resolved: up to the root locally, up to (not
    including) the bucket under a URL."""
    path = real(path)
    found = []
    if is_remote(path):
        scheme, rest = path.split("://", 1)
        parts = rest.split("/")
        return [f"{scheme}://" + "/".join(parts[:n]) for n in range(len(parts) - 1, 1, -1)]
    directory = os.path.dirname(path)
    while True:
        found.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            return found
        directory = parent


def creation_problem(path: str | os.PathLike, parents: bool = False) -> OSError | ValueError | None:
    """Why nothing could be created at `path` (an exception to raise, its message without the path), or
    None: locally its directory must exist (with `parents`, its nearest existing ancestor: the others are
    created) and be writable; under a URL it must be inside a bucket that exists (its "directories" are
    prefixes, which need no creation)."""
    if not is_remote(path):
        parent = os.path.dirname(os.path.abspath(path))
        while parents and not os.path.lexists(parent) and os.path.dirname(parent) != parent:
            parent = os.path.dirname(parent)
        if os.path.lexists(parent) and not os.path.isdir(parent):
            return NotADirectoryError(f"{parent} is not a directory")
        if not os.path.isdir(parent):
            return FileNotFoundError(f"directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            return PermissionError(f"directory {parent} is not writable")
        return None
    target = absolute(path)
    scheme, rest = target.split("://", 1)
    bucket = f"{scheme}://{rest.split('/', 1)[0]}"
    if target == bucket:
        return ValueError(f"expected a path inside a bucket ({scheme}://BUCKET/NAME), not the bucket itself")
    if not exists(bucket):
        return FileNotFoundError(f"bucket {bucket} does not exist (or is not visible to these credentials)")
    return None


def epath(path: str | os.PathLike):
    """`etils.epath.Path` of a local path or URL (its operations on a URL belong inside `reaching`)."""
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
    if not is_remote(path):
        return os.path.exists(path)
    with reaching(path):
        return epath(path).exists()


def isdir(path: str | os.PathLike) -> bool:
    return _kind(path) == "directory" if is_remote(path) else os.path.isdir(path)


def isfile(path: str | os.PathLike) -> bool:
    return _kind(path) == "file" if is_remote(path) else os.path.isfile(path)


def _kind(url: str | os.PathLike) -> str | None:
    """ "file", "directory" (a prefix) or None (nothing there) of a URL. fsspec's `isdir` and `isfile`
    answer False when the service cannot be reached; this raises."""
    fs, name = _fs(url)
    with reaching(url):
        try:
            return fs.info(name)["type"]
        except FileNotFoundError:
            return None


def getsize(path: str | os.PathLike) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    fs, name = _fs(path)
    with reaching(path):
        return int(fs.size(name))


def version(path: str | os.PathLike) -> tuple[str, int, int | str]:
    """(`real` path, size, version): what identifies a file's content without reading it; it changes
    whenever the file is rewritten (see `stat_many`)."""
    size, changed, _ = stat_many([os.fspath(path)])[os.fspath(path)]
    return real(path), size, changed


def _generation(info: dict) -> str:
    return str(info.get("generation") or info.get("updated") or info.get("mtime") or "")


def stat_many(paths: Sequence[str]) -> dict[str, tuple[int, int | str, bool]]:
    """{path: (size, version, whether it is a directory)} of paths that exist: the version is what
    changes whenever the file is rewritten (a local file's modification time in ns, an int; an object's
    generation, a str). URLs come from one listing per directory they are in rather than a request per
    object (a corpus has hundreds of files).

    Raises FileNotFoundError naming a path that does not exist."""
    found = {}
    for path in paths:
        if not is_remote(path):
            info = os.stat(path)
            found[path] = (info.st_size, info.st_mtime_ns, os.path.isdir(path))
    return {**found, **_stat_remote([p for p in paths if is_remote(p)])}


def _stat_remote(urls: Sequence[str]) -> dict[str, tuple[int, str, bool]]:
    by_directory: dict[str, list[str]] = {}
    for url in urls:
        by_directory.setdefault(dirname(url), []).append(url)
    found = {}
    for directory, members in by_directory.items():
        fs, name = _fs(directory)
        with reaching(directory):
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
    with reaching(path):
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
    with contextlib.suppress(FileNotFoundError), reaching(path):
        epath(path).rmtree()


def remove(path: str | os.PathLike) -> None:
    """Removes one file; no error when it does not exist."""
    with contextlib.suppress(FileNotFoundError), reaching(path):
        epath(path).unlink() if is_remote(path) else os.unlink(path)


def rename(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Moves a file or directory (under a URL: copies every object, then deletes the source)."""
    if not is_remote(source):
        os.rename(source, target)
        return
    fs, name = _fs(source)
    with reaching(source):
        fs.mv(name, _fs(target)[1], recursive=True)


def open_file(path: str | os.PathLike, mode: str = "rb", **kwargs):
    """`open` for a local path or a URL. A URL's file is buffered like a local one (`readline(limit)`
    works); opened for writing it is uploaded when closed; each read, write and the close run in
    `reaching` (`kwargs`: of `io.TextIOWrapper` in a text mode)."""
    if not is_remote(path):
        return open(path, mode, **kwargs)
    binary = mode.replace("t", "").replace("b", "") + "b"
    with reaching(path):
        raw = _Reaching(epath(path).open(binary), os.fspath(path))
    buffered = io.BufferedReader(raw, buffer_size=1 << 20) if "r" in mode else io.BufferedWriter(raw)
    return buffered if "b" in mode else io.TextIOWrapper(buffered, **kwargs)


class _Reaching(io.RawIOBase):
    """A remote file (gcsfs's, through etils.epath) whose reads, writes and close each run in `reaching`."""

    def __init__(self, file, place: str):
        super().__init__()
        self._file, self._place = file, place

    def readable(self) -> bool:
        return self._file.readable()

    def writable(self) -> bool:
        return self._file.writable()

    def seekable(self) -> bool:
        return self._file.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)  # moves a position: the next read asks for the bytes

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        with reaching(self._place):
            return self._file.readinto(buffer)

    def write(self, data) -> int:
        with reaching(self._place):
            return self._file.write(data)

    def close(self) -> None:
        if not self.closed:
            try:
                with reaching(self._place):
                    self._file.close()  # a file opened for writing is uploaded here
            finally:
                super().close()


def read_bytes(path: str | os.PathLike) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


def listing(path: str) -> dict[str, tuple[int, str]]:
    """{name relative to `path` ("a/b"): (size, version)} of every file under the directory `path` ({}
    when there is none): what changes whenever any of them is rewritten, added or removed (under a URL
    one listing request per 1000 objects, the version an object's generation)."""
    if not is_remote(path):
        found = {}
        for root, _, files in os.walk(path):
            for name in files:
                info = os.stat(os.path.join(root, name))
                relative = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
                found[relative] = (info.st_size, str(info.st_mtime_ns))
        return dict(sorted(found.items()))
    fs, name = _fs(path)
    prefix = name.rstrip("/") + "/"
    with reaching(path):
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
    try:
        with reaching(pattern):
            found = fs.glob(name)
    except FileNotFoundError:  # gcsfs says only "b/BUCKET/o" when the bucket does not exist
        problem = creation_problem(pattern)
        raise FileNotFoundError(f"{pattern}: {problem or 'nothing there'}") from None
    return sorted(f"{scheme}://{path.rstrip('/')}" for path in found)


def has_magic(pattern: str) -> bool:
    return glob_module.has_magic(pattern)


def _fs(path: str | os.PathLike):
    """(fsspec file system, its name of `path`) for a URL."""
    import fsspec

    _check_client(path)
    return fsspec.core.url_to_fs(os.fspath(path))


def _check_client(path: str | os.PathLike) -> None:
    """Raises OSError, saying what to install, when `path` is gs:// and gcsfs is missing; bounds each try
    of gcsfs's requests (`outage.install`)."""
    if is_gcs(path):
        try:
            import gcsfs  # noqa: F401
        except ImportError:
            raise OSError(
                f"{os.fspath(path)}: gs:// paths need gcsfs: pip install gcsfs google-cloud-storage (the gcs extra)"
            ) from None
        outage.install()


@contextlib.contextmanager
def reaching(place: str | os.PathLike, refuse: bool = True) -> Iterator[None]:
    """The block of one operation on `place`: for a Cloud Storage URL the outage guard (`outage.reaching`:
    refused at once while the service is known to be unreachable, a connection failure raised as
    `StorageUnreachable` naming `place`); for any other place nothing. Every operation of this package on
    a URL runs in one; a caller that hands a place to another library (orbax) runs that call in one.
    `refuse`: False for a block that waits for work started earlier (see `outage.reaching`)."""
    if not is_gcs(place):
        yield
        return
    _check_client(place)
    with outage.reaching(os.fspath(place), refuse=refuse):
        yield
