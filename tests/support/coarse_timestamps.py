"""File systems whose modification times are coarser than the disk tests run on: a target like ext2
(whole seconds) or FAT (2 seconds) for the workdir copy (`storage.sync_directory`).

Two ways to get one:
- `truncating_utime(monkeypatch, root, resolution_ns)`: in-process, always available. `os.utime` on a
  path under `root` stores its times truncated to `resolution_ns`, as ext2 and FAT do when a copy sets
  a file's modification time; `os.stat` then reads back what was stored. (Times the kernel sets by
  itself when a file is written keep the disk's resolution; the copy sets every time it compares.)
- `loop_mounted_ext2(directory)`: a real ext2 file system (128-byte inodes: whole-second times) in an
  image file, loop-mounted at `directory`; it skips the test where that is not allowed (not root, no
  `mkfs.ext2`, no loop device, a container that refuses `mount`). FAT's driver (vfat) is often missing
  from containers' kernels, so 2 s is only simulated.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

SECOND_NS = 1_000_000_000


def truncating_utime(monkeypatch: pytest.MonkeyPatch, root: str | os.PathLike, resolution_ns: int) -> None:
    """Makes `os.utime` store times truncated to `resolution_ns` for every path under `root` (see above)."""
    real_utime = os.utime
    root = os.path.realpath(root)

    def utime(path, times=None, *, ns=None, **kwargs):
        under = isinstance(path, str | bytes | os.PathLike) and (
            os.path.realpath(os.fsdecode(path)) + os.sep
        ).startswith(root + os.sep)
        if under and times is not None:
            ns, times = tuple(int(t * SECOND_NS) for t in times), None
        if under and ns is not None:
            ns = tuple(t // resolution_ns * resolution_ns for t in ns)
        if ns is not None:
            return real_utime(path, ns=ns, **kwargs)
        return real_utime(path, times, **kwargs)

    monkeypatch.setattr(os, "utime", utime)


@contextlib.contextmanager
def loop_mounted_ext2(directory: str | os.PathLike, size_mb: int = 16) -> Iterator[str]:
    """A fresh ext2 file system with whole-second modification times mounted at `directory` (created)
    for the duration; skips the calling test where this machine does not allow it."""
    directory = os.fspath(directory)
    image = directory + ".img"
    if os.geteuid() != 0 or not shutil.which("mkfs.ext2") or not shutil.which("mount"):
        pytest.skip("a loop-mounted ext2 needs root, mkfs.ext2 and mount")
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    os.makedirs(directory)
    made = subprocess.run(["mkfs.ext2", "-q", "-F", "-I", "128", image], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"mkfs.ext2 failed: {made.stderr.strip()[:200]}")
    mounted = subprocess.run(["mount", "-o", "loop", image, directory], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot loop-mount an ext2 image here: {mounted.stderr.strip()[:200]}")
    try:
        yield directory
    finally:
        if subprocess.run(["umount", directory], capture_output=True).returncode:
            subprocess.run(["umount", "-l", directory], capture_output=True)  # still busy: detach it
        os.unlink(image)
