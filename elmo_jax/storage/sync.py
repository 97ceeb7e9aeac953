"""Keeping one local directory a copy of another, copying only what changed: a training workdir on the
machine's own disk copied to a mounted Google Drive (or any other slow, mounted file system) after each
checkpoint, and back into a new machine's disk before training resumes.

The copy only ever touches its own:

- the target must be empty (or new) or a copy made here: the first sync leaves a marker in it
  (`MARKER`, naming the source and the target's timestamp resolution), and a folder that holds anything
  without one is refused untouched, in one line naming it and what to do (a copy made before copies
  were marked is adopted by creating an empty `MARKER` file in it). A sync removes what the target holds
  that the source does not, so a user's folder (Drive's MyDrive) must never be taken for a copy;
- a source inside its target (which the sync would delete) and a target inside its source (which each
  sync would copy into itself) are refused; so is the same directory under two names;
- the two directories named are resolved (links in their own paths followed); below them no symbolic
  link is ever followed: a link in the source is skipped (counted in `SyncStats.links`: a workdir's link
  to a folder elsewhere would dangle on a new machine, and may be a loop), a link in the target is
  replaced or removed as a link, never written through;
- only regular files and directories are copied: FIFOs, sockets and devices are skipped, never opened
  (`SyncStats.special`; opening a FIFO would wait forever for a writer);
- staging names left in the target by a copy that was killed (`.NAME.<host>.<pid>.<rnd>.tmp`,
  `atomic`'s) are removed by the next sync, unless their writer still runs on this host: one machine
  copies into a copy at a time, so another host's are a machine that went away.

And a reader of the target, including a new machine after this one died mid-copy, never sees half of
anything:

- a file new or changed in the source is copied under a staging name and renamed over the target's,
  keeping the source's modification time. "Changed" is another size, or modification times further
  apart than the coarser of the two file systems' timestamp resolutions: ext2 keeps whole seconds, FAT
  2 s, Drive milliseconds, so comparing nanoseconds would copy every file again on every sync. The
  target's resolution is probed once (`probe_mtime_resolution`) and recorded in its marker; the
  source's is its own marker's when it has one (a copy being copied back), else finer than any;
- a directory new to the target (a checkpoint's step directory) is built under a staging name and
  renamed into place whole (`atomic.publish_directory`);
- what the source no longer has (an old checkpoint it removed) is removed from the target last, after
  everything new is in place.

`skip(relative path)` names what is neither copied nor removed (a lock file, a directory still being
written); the marker is one of those. Both directories are local paths; a workdir in a bucket needs no
copy (orbax writes there).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import stat
from collections.abc import Callable

from absl import logging

from elmo_jax.storage import atomic, places
from elmo_jax.storage.lock import NO_LINK_NO_WAIT_BYTES

MARKER = ".elmo_jax_copy.json"  # in a copy's top directory: what it is a copy of, its timestamp resolution
# Modification times the probe sets: an odd second with a fraction (tells ns, us, ms and s apart) and an
# odd whole second (tells 1 s from FAT's 2 s, truncated or rounded).
PROBE_MTIMES_NS = (1_500_000_001_987_654_321, 1_500_000_001_000_000_000)
RESOLUTIONS_NS = (1, 1_000, 1_000_000, 10_000_000, 1_000_000_000, 2_000_000_000)
_EXAMPLES = 3  # skipped names a log line shows


@dataclasses.dataclass
class SyncStats:
    """What one `sync_directory` did: files copied (bytes), entries removed from the target, entries of
    the source skipped (symbolic links; FIFOs, sockets and devices), with a few of their relative paths."""

    files: int = 0
    bytes: int = 0
    removed: int = 0
    links: int = 0
    special: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)

    def skipped_note(self) -> str:
        """'' or '; not copied: 2 symbolic link(s), 1 FIFO(s), socket(s) or device(s) (e.g. a, b, c)', for
        a log line."""
        if not (self.links or self.special):
            return ""
        kinds = [f"{self.links} symbolic link(s)"] * bool(self.links)
        kinds += [f"{self.special} FIFO(s), socket(s) or device(s)"] * bool(self.special)
        return f"; not copied: {', '.join(kinds)} (e.g. {', '.join(self.skipped[:_EXAMPLES])})"


@dataclasses.dataclass
class _Walk:
    """What every directory of one sync shares: the caller's `skip`, the tolerance of "unchanged", the stats."""

    skip: Callable[[str], bool]
    resolution_ns: int
    stats: SyncStats


def sync_directory(source: str, target: str, skip: Callable[[str], bool] | None = None) -> SyncStats:
    """Makes the local directory `target` (created) a copy of the local directory `source` (see the
    module docstring); `skip` takes a path relative to `source` ('checkpoints/12', '/'-separated).

    Raises:
      ValueError: a URL; a target that is not a directory, not empty and not a copy, or nested with the
        source (`check_copy_target`); nothing is written then.
      FileNotFoundError: no source directory.
    """
    check_copy_target(source, target)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{source}: no such directory to copy")
    source, target = places.real(source), places.real(target)
    resolution_ns = max(_claim(source, target), _recorded_resolution(source))
    user_skip = skip or (lambda relative: False)
    walk = _Walk(lambda relative: relative == MARKER or user_skip(relative), resolution_ns, SyncStats())
    _sync(source, target, "", walk)
    if walk.stats.links or walk.stats.special:
        logging.info("copying %s to %s%s", source, target, walk.stats.skipped_note())
    return walk.stats


def check_copy_target(source: str, target: str) -> None:
    """Raises ValueError, in one line naming `target` and what to do, where `sync_directory(source,
    target)` would be refused (see the module docstring); writes nothing. `source` need not exist yet."""
    for path in (source, target):
        if places.is_remote(path):
            raise ValueError(f"{path}: sync_directory copies between local directories (a URL needs no copy)")
    if places.same_place(source, target):
        raise ValueError(f"{target}: the same directory as {source}, the one to copy; name another one for the copy")
    if places.is_inside(target, source):
        raise ValueError(
            f"{target}: inside {source}, the directory to copy (each sync would copy the copy into itself); "
            "name a directory outside it"
        )
    if places.is_inside(source, target):
        raise ValueError(
            f"{target}: {source}, the directory to copy, is inside it, and the copy would delete it; name a "
            "directory of its own for the copy"
        )
    if os.path.lexists(target) and not os.path.isdir(target):
        raise ValueError(f"{target}: not a directory; name a new or empty directory for the copy")
    if os.path.isdir(target) and _read_marker(target) is None:
        held = sorted(name for name in os.listdir(target) if not atomic.is_staging_name(name))
        if held:
            raise ValueError(
                f"{target}: not a copy made by elmo_jax (no {MARKER}) but holds "
                f"{', '.join(held[:_EXAMPLES])}{f' and {len(held) - _EXAMPLES} more' * (len(held) > _EXAMPLES)}, "
                f"which a copy of {source} would delete; name an empty or new directory for the copy (e.g. a "
                f"folder of its own in this one), or, if this is a copy made before copies were marked, create an "
                f"empty {MARKER} in it"
            )


def _claim(source: str, target: str) -> int:
    """Creates `target` if needed and makes its marker name `source` and the target's timestamp
    resolution (probed once, when no marker records it); returns that resolution in ns."""
    os.makedirs(target, exist_ok=True)
    marker = _read_marker(target) or {}
    resolution_ns = marker.get("mtime_resolution_ns")
    if not (isinstance(resolution_ns, int) and resolution_ns >= 1):
        resolution_ns = probe_mtime_resolution(target)
    if marker.get("copy_of") not in (None, source):
        logging.info("%s was a copy of %s; from now on of %s", target, marker["copy_of"], source)
    wanted = {"copy_of": source, "mtime_resolution_ns": resolution_ns, "made_by": "elmo_jax.storage.sync_directory"}
    if marker != wanted:
        atomic.write_text(os.path.join(target, MARKER), json.dumps(wanted, indent=1) + "\n")
    return resolution_ns


def _read_marker(directory: str) -> dict | None:
    """The marker of `directory`: None without one (or where a link, a FIFO or a directory has its name),
    {} for an empty or unreadable one (a copy adopted by hand)."""
    try:
        fd = os.open(os.path.join(directory, MARKER), os.O_RDONLY | NO_LINK_NO_WAIT_BYTES)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            marker = json.loads(f.read().decode("utf-8"))
        except ValueError:
            return {}
    return marker if isinstance(marker, dict) else {}


def _recorded_resolution(directory: str) -> int:
    """The timestamp resolution the marker of `directory` records (a copy being copied back), else 1 ns."""
    recorded = (_read_marker(directory) or {}).get("mtime_resolution_ns")
    return recorded if isinstance(recorded, int) and recorded >= 1 else 1


def probe_mtime_resolution(directory: str) -> int:
    """The resolution, in ns, of the modification times the file system of `directory` keeps: a staged
    file there is given `PROBE_MTIMES_NS` and read back; the finest of `RESOLUTIONS_NS` within which
    every one came back (truncated or rounded) is it. A file system that keeps none of them (times not
    settable) gets the coarsest, with a warning: changed files are then copied again, as before."""
    staged = atomic.stage(os.path.join(directory, MARKER), lambda f: None)
    try:
        errors = []
        for when in PROBE_MTIMES_NS:
            os.utime(staged, ns=(when, when))
            errors.append(abs(os.stat(staged).st_mtime_ns - when))
    finally:
        os.unlink(staged)
    for resolution_ns in RESOLUTIONS_NS:
        if max(errors) < resolution_ns:
            return resolution_ns
    logging.warning("%s does not keep the modification times set on its files (off by %d ns)", directory, max(errors))
    return RESOLUTIONS_NS[-1]


def _sync(source: str, target: str, relative: str, walk: _Walk) -> None:
    """`sync_directory` below `relative`: staging of killed copies removed, what is new or changed
    copied, then what is gone removed."""
    _remove_dead_staging(target)
    wanted = _entries(source, relative, walk)
    for name, is_directory in wanted.items():
        src, dst, rel = os.path.join(source, name), os.path.join(target, name), _join(relative, name)
        existing = _kind(dst)
        if is_directory and existing == "directory":
            _sync(src, dst, rel, walk)
            continue
        if is_directory or existing not in (None, "file"):
            _remove(dst, replaced_by=src)  # a file, a link or a FIFO where the source has a directory (or a file)
        if is_directory:
            atomic.publish_directory(dst, lambda staging, src=src, rel=rel: _copy_tree(src, staging, rel, walk))
        elif not _same(src, dst, walk.resolution_ns):
            _copy_file(src, dst, walk.stats)
    for name in sorted(set(os.listdir(target)) - set(wanted)):
        if not walk.skip(_join(relative, name)) and not atomic.is_staging_name(name):
            _remove(os.path.join(target, name))
            walk.stats.removed += 1


def _entries(source: str, relative: str, walk: _Walk) -> dict[str, bool]:
    """name -> whether it is a directory, for what `source` holds that is copied (sorted by name): no
    staging name (what the source is writing right now), nothing `skip`ped; symbolic links and special
    files counted in the stats and left out."""
    wanted = {}
    for entry in sorted(os.scandir(source), key=lambda entry: entry.name):
        rel = _join(relative, entry.name)
        if atomic.is_staging_name(entry.name) or walk.skip(rel):
            continue
        kind = _kind(entry.path)
        if kind in ("file", "directory"):
            wanted[entry.name] = kind == "directory"
        elif kind is not None:  # gone since listed: nothing to copy
            _count_skipped(walk.stats, kind, rel)
    return wanted


def _kind(path: str) -> str | None:
    """'file', 'directory', 'link' or 'special' (FIFO, socket, device) for what is at `path`, links not
    followed; None for nothing."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    return "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "special"


def _count_skipped(stats: SyncStats, kind: str, relative: str) -> None:
    if kind == "link":
        stats.links += 1
    else:
        stats.special += 1
    stats.skipped.append(relative)


def _copy_tree(source: str, target: str, relative: str, walk: _Walk) -> None:
    """Copies what `source` holds into the existing directory `target` (a staging directory)."""
    for name, is_directory in _entries(source, relative, walk).items():
        src, dst = os.path.join(source, name), os.path.join(target, name)
        if is_directory:
            os.mkdir(dst)
            _copy_tree(src, dst, _join(relative, name), walk)
        else:
            _copy_file(src, dst, walk.stats)


def _copy_file(source: str, target: str, stats: SyncStats) -> None:
    """A staged copy of the regular file `source` renamed over `target`, with `source`'s times.

    Opened without following a link and without waiting (a FIFO put there since it was listed opens at
    once and is skipped, where a plain open would wait for a writer forever); a file gone since is skipped
    (the next sync removes its copy)."""
    try:
        fd = os.open(source, os.O_RDONLY | NO_LINK_NO_WAIT_BYTES)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
            return
        raise
    with os.fdopen(fd, "rb") as f:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return
        atomic.write(target, lambda out: shutil.copyfileobj(f, out, 1 << 20))
    os.utime(target, ns=(status.st_atime_ns, status.st_mtime_ns))  # unchanged from now on: not copied again
    stats.files += 1
    stats.bytes += status.st_size


def _same(source: str, target: str, resolution_ns: int) -> bool:
    """Whether `target` is a regular file that is already `source`'s copy: the same size, modification
    times less than `resolution_ns` apart (one of them kept at that resolution, truncated or rounded)."""
    try:
        a, b = os.lstat(source), os.lstat(target)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(b.st_mode) and a.st_size == b.st_size and abs(a.st_mtime_ns - b.st_mtime_ns) < resolution_ns


def _remove_dead_staging(directory: str) -> None:
    """Removes the staging names in `directory` whose writer is not a live process of this host
    (`atomic.live_staging`): left by a copy that was killed, here or on a machine that went away."""
    for name in os.listdir(directory):
        if not atomic.is_staging_name(name):
            continue
        # `.<target>.<host>.<pid>.<random>.tmp`, the target's name possibly dotted (atomic._staging_prefix)
        owner = ".".join(name[1 : -len(atomic.STAGING_SUFFIX)].split(".")[:-3])
        path = os.path.join(directory, name)
        if path not in {live for live, _ in atomic.live_staging(os.path.join(directory, owner))}:
            _remove(path)
            logging.warning("removed %s: left behind by a copy that was stopped while writing it", path)


def _remove(path: str, replaced_by: str | None = None) -> None:
    """Removes what is at `path`: a directory with what it holds, anything else (a link: the link, not
    what it points to) unlinked; `replaced_by` names what takes the place of a link, for the log."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        if replaced_by is not None and os.path.islink(path):
            logging.warning(
                "%s: a symbolic link (to %s) in the copy, replaced by a copy of %s; what it points to is untouched",
                path,
                os.readlink(path),
                replaced_by,
            )
        os.unlink(path)


def _join(relative: str, name: str) -> str:
    return f"{relative}/{name}" if relative else name
