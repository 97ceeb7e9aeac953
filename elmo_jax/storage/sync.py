"""Keeping one local directory a copy of another, copying only what changed: a training workdir on the
machine's own disk copied to a mounted Google Drive (or any other slow, mounted file system) after each
checkpoint, and back into a new machine's disk before training resumes.

The copy is made so that a reader of the target, including a new machine after this one died mid-copy,
never sees half of anything:

- a file new or changed in the source (size or modification time differ) is copied under a staging name
  and renamed over the target's (`publish.upload_file`), keeping the source's modification time, so an
  unchanged file is not copied again;
- a directory new to the target (a checkpoint's step directory) is built under a staging name and
  renamed into place whole (`atomic.publish_directory`);
- what the source no longer has (an old checkpoint it removed) is removed from the target last, after
  everything new is in place.

`skip(relative path)` names what is neither copied nor removed (a lock file, a directory still being
written). Both directories are local paths; a workdir in a bucket needs no copy (orbax writes there).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable

from elmo_jax.storage import atomic, places, publish


@dataclasses.dataclass
class SyncStats:
    """What one `sync_directory` did: files copied (bytes), entries removed from the target."""

    files: int = 0
    bytes: int = 0
    removed: int = 0


def sync_directory(source: str, target: str, skip: Callable[[str], bool] | None = None) -> SyncStats:
    """Makes the local directory `target` (created) a copy of the local directory `source` (see the
    module docstring); `skip` takes a path relative to `source` ('checkpoints/12', '/'-separated)."""
    for path in (source, target):
        if places.is_remote(path):
            raise ValueError(f"{path}: sync_directory copies between local directories (a URL needs no copy)")
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{source}: no such directory to copy")
    os.makedirs(target, exist_ok=True)
    stats = SyncStats()
    _sync(os.fspath(source), os.fspath(target), "", skip or (lambda relative: False), stats)
    return stats


def _sync(source: str, target: str, relative: str, skip: Callable[[str], bool], stats: SyncStats) -> None:
    """`sync_directory` below `relative`: what is new or changed first, then what is gone."""
    # What the source is writing right now (a staged file, an export being built) is not copied yet.
    names = [name for name in os.listdir(source) if not atomic.is_staging_name(name)]
    wanted = {name for name in names if not skip(_join(relative, name))}
    for name in sorted(wanted):
        src, dst, rel = os.path.join(source, name), os.path.join(target, name), _join(relative, name)
        if os.path.isdir(src):
            if os.path.isdir(dst):
                _sync(src, dst, rel, skip, stats)
                continue
            _remove(dst)  # a file where the source has a directory
            atomic.publish_directory(dst, lambda staging, src=src, rel=rel: _copy_tree(src, staging, rel, skip, stats))
        elif not _same(src, dst):
            if os.path.isdir(dst):
                _remove(dst)
            _copy_file(src, dst, stats)
    for name in sorted(set(os.listdir(target)) - wanted):
        if not skip(_join(relative, name)) and not atomic.is_staging_name(name):
            _remove(os.path.join(target, name))
            stats.removed += 1


def _copy_tree(source: str, target: str, relative: str, skip: Callable[[str], bool], stats: SyncStats) -> None:
    """Copies what `source` holds into the existing directory `target` (a staging directory)."""
    for name in sorted(os.listdir(source)):
        src, dst, rel = os.path.join(source, name), os.path.join(target, name), _join(relative, name)
        if skip(rel) or atomic.is_staging_name(name):
            continue
        if os.path.isdir(src):
            os.mkdir(dst)
            _copy_tree(src, dst, rel, skip, stats)
        else:
            _copy_file(src, dst, stats)


def _copy_file(source: str, target: str, stats: SyncStats) -> None:
    publish.upload_file(source, target)  # locally: a staged copy renamed over the target
    status = os.stat(source)
    os.utime(target, ns=(status.st_atime_ns, status.st_mtime_ns))  # unchanged from now on: not copied again
    stats.files += 1
    stats.bytes += status.st_size


def _same(source: str, target: str) -> bool:
    """Whether the file `target` is already `source`'s copy (same size and modification time)."""
    try:
        a, b = os.stat(source), os.stat(target)
    except FileNotFoundError:
        return False
    return os.path.isfile(target) and a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _join(relative: str, name: str) -> str:
    return f"{relative}/{name}" if relative else name
