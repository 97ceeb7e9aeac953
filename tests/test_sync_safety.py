"""The workdir copy (`storage.sync_directory`, made to a mounted Google Drive) only ever touches its own
(issue #50, item 1): a folder that is not a copy is refused untouched; symbolic links in the source and
the target are never followed; FIFOs and sockets are never opened; nesting the source and the target is
refused; staging names left by a killed copy are removed by the next; and on a target with coarser
timestamps than the source (ext2: 1 s, FAT: 2 s) a second sync of an unchanged workdir copies nothing,
also after a copy back to a new machine.

Each test failed on the code before the fix; what it failed with is said in its docstring."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading

import pytest

from elmo_jax import storage
from elmo_jax.storage import atomic, sync
from tests.support import file_trees
from tests.support.coarse_timestamps import SECOND_NS, loop_mounted_ext2, truncating_utime
from tests.support.embed_files import as_left_by, as_left_by_a_dead_process
from tests.support.file_trees import write

MARKER = ".elmo_jax_copy.json"  # the copy's marker, by the name its documentation gives users


def tree(root) -> dict[str, str]:
    return file_trees.tree(root, leave_out=MARKER)


def a_workdir(root) -> None:
    write(root / "metrics.jsonl", '{"step": 5}\n')
    write(root / "vocab.txt", "<S>\n</S>\n")
    write(root / "checkpoints" / "5" / "state", "five")


def test_a_folder_that_is_not_a_copy_is_refused_and_left_as_it_was(tmp_path):
    """Pointed at a folder of the user's (Drive's MyDrive, the notebook's WORK_ROOT), the copy refuses in
    one line naming it and what to do, and removes nothing; an empty or new folder becomes a copy (its
    marker names the source), and a copy made before copies were marked is adopted by an empty marker.
    Before: the sync deleted `notes.txt` and `photos/` (the test's refusal was never raised)."""
    source, mydrive = tmp_path / "local", tmp_path / "MyDrive"
    a_workdir(source)
    write(mydrive / "notes.txt", "mine")
    write(mydrive / "photos" / "cat.jpg", "meow")
    with pytest.raises(ValueError) as refused:
        storage.sync_directory(str(source), str(mydrive))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{mydrive}: ")
    assert "not a copy" in message and "empty" in message and MARKER in message, message
    assert tree(mydrive) == {"notes.txt": "mine", "photos/cat.jpg": "meow"}

    for fresh in (tmp_path / "new" / "copy", tmp_path / "empty"):
        os.makedirs(tmp_path / "empty", exist_ok=True)
        assert storage.sync_directory(str(source), str(fresh)).files == 3
        with open(fresh / MARKER, encoding="utf-8") as f:
            assert json.load(f)["copy_of"] == os.path.realpath(source)
        assert tree(fresh) == tree(source)

    assert sync.MARKER == MARKER
    write(mydrive / MARKER, "")  # the way out the message names: adopting an older copy
    storage.sync_directory(str(source), str(mydrive))
    assert tree(mydrive) == tree(source)


def test_a_symlink_in_the_target_is_replaced_never_followed(tmp_path, caplog):
    """A link in the copy (`checkpoints -> /bigdisk/...`, a file linked to the user's file, a link the
    source has nothing for) is replaced or removed as a link, a replaced one said in one line; what it
    points to is untouched.
    Before: the sync wrote step 5 into the linked folder and deleted the user's `keep` there, and wrote
    the workdir's metrics into the user's linked file."""
    source, copy, elsewhere = tmp_path / "local", tmp_path / "drive", tmp_path / "bigdisk"
    a_workdir(source)
    storage.sync_directory(str(source), str(copy))
    write(elsewhere / "keep", "the user's")
    write(tmp_path / "mine.txt", "the user's file")
    for name in ("checkpoints", "metrics.jsonl"):
        os.rename(copy / name, tmp_path / f"old_{name}")
    os.symlink(elsewhere, copy / "checkpoints")
    os.symlink(tmp_path / "mine.txt", copy / "metrics.jsonl")
    os.symlink(elsewhere, copy / "gone")
    write(source / "metrics.jsonl", '{"step": 5}\n{"step": 10}\n')
    with caplog.at_level(logging.WARNING):
        storage.sync_directory(str(source), str(copy))
    said = [r.getMessage() for r in caplog.records if "a symbolic link (to " in r.getMessage()]
    linked = os.path.join(os.path.realpath(copy), "checkpoints")  # the copy's path as resolved
    assert len(said) == 2 and f"{linked}: a symbolic link (to {elsewhere}) in the copy" in said[0], said
    assert tree(elsewhere) == {"keep": "the user's"}
    assert (tmp_path / "mine.txt").read_text() == "the user's file"
    assert not any(os.path.islink(copy / name) for name in os.listdir(copy)), os.listdir(copy)
    assert tree(copy) == tree(source)


def test_symlinks_in_the_source_are_skipped_never_followed(tmp_path):
    """Links in the workdir (to a file, to a folder outside, dangling, a loop, a link to its own folder)
    are not followed: skipped and counted, and the copy goes on.
    Before: the link to its own folder stopped the sync with `OSError: [Errno 40] Too many levels of
    symbolic links` (`checkpoints/5/itself/itself/...`; a dangling link alone: FileNotFoundError), and
    with it the training run."""
    source, copy = tmp_path / "local", tmp_path / "drive"
    a_workdir(source)
    write(tmp_path / "outside" / "big", "not the workdir's")
    os.symlink(tmp_path / "outside" / "big", source / "to_file")
    os.symlink(tmp_path / "outside", source / "checkpoints" / "to_folder")
    os.symlink(tmp_path / "nowhere", source / "dangling")
    os.symlink(source / "loop_b", source / "loop_a")
    os.symlink(source / "loop_a", source / "loop_b")
    os.symlink(".", source / "checkpoints" / "5" / "itself")
    stats = storage.sync_directory(str(source), str(copy))
    assert stats.links == 6 and stats.files == 3
    copied = {"metrics.jsonl": '{"step": 5}\n', "vocab.txt": "<S>\n</S>\n", "checkpoints/5/state": "five"}
    assert tree(copy) == tree(source) == copied
    assert sorted(os.listdir(copy)) == sorted(["checkpoints", "metrics.jsonl", "vocab.txt", MARKER])


class FifoWatch:
    """Notices whether someone opens a FIFO for reading (the open would block until a writer comes): it
    keeps trying a non-blocking open for writing, which succeeds only while a reader waits, and then
    closes it at once, so the reader reads nothing and goes on instead of blocking forever."""

    def __init__(self, path):
        self.path, self.opened, self._stop = str(path), False, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader
                continue
            self.opened = True
            os.close(fd)

    def stop(self) -> bool:
        self._stop.set()
        self._thread.join()
        return self.opened


def test_fifos_and_sockets_in_the_source_are_skipped_never_opened(tmp_path, monkeypatch):
    """A FIFO and a socket in the workdir are neither opened nor copied: skipped and counted.
    Before: the sync opened the FIFO for reading, which blocks until a writer comes (forever, but for
    the test's watch, which let it go on), then stopped with `OSError: [Errno 6] No such device or
    address` on the socket."""
    source, copy = tmp_path / "local", tmp_path / "drive"
    a_workdir(source)
    os.mkfifo(source / "pipe")
    monkeypatch.chdir(source)  # a socket's path must be short: bound by its relative name
    listening = socket.socket(socket.AF_UNIX)
    listening.bind("sock")
    watch = FifoWatch(source / "pipe")
    try:
        stats = storage.sync_directory(str(source), str(copy))
    finally:
        opened = watch.stop()
        listening.close()
    assert not opened, "the copy opened the FIFO (it would have waited forever for a writer)"
    assert stats.special == 2 and tree(copy) == tree(source)
    assert sorted(os.listdir(copy)) == sorted(["checkpoints", "metrics.jsonl", "vocab.txt", MARKER])


def test_nested_source_and_target_are_refused(tmp_path):
    """A source inside its copy (it would delete itself), a copy inside its source (it would grow
    `backup/backup/...`), the same folder, also named through a link: refused in one line, nothing
    changed.
    Before: the source inside the copy was deleted by its own sync (no refusal raised)."""
    source, copy = tmp_path / "local", tmp_path / "drive"
    a_workdir(source)
    storage.sync_directory(str(source), str(copy))
    a_workdir(copy / "inner")
    before_copy, before_source = tree(copy), tree(source)
    os.symlink(source / "backup", tmp_path / "link_into_source")
    os.symlink(copy, tmp_path / "link_to_copy")
    cases = {
        "inside": (copy / "inner", copy),
        "contains": (source, source / "backup"),
        "contains, through a link": (source, tmp_path / "link_into_source"),
        "the same": (copy, tmp_path / "link_to_copy"),
    }
    for what, (inner, outer) in cases.items():
        with pytest.raises(ValueError) as refused:
            storage.sync_directory(str(inner), str(outer))
        message = str(refused.value)
        assert "\n" not in message and str(outer) in message and ("inside" in message or "same" in message), what
    assert tree(copy) == before_copy and tree(source) == before_source
    assert not os.path.exists(source / "backup")


def test_staging_left_by_a_killed_copy_is_removed_by_the_next(tmp_path):
    """A copy killed mid-file leaves its hidden staging file (`.NAME.<host>.<pid>.<rnd>.tmp`), a copy
    killed mid-directory its staging directory; the next sync removes those of dead writers of this host
    and those of other hosts (a machine that went away), at any depth, and keeps a live writer's.
    Before: they stayed in the copy for good (`assert not True` for the dead writer's
    `.state.<host>.<pid>.<rnd>.tmp`)."""
    source, copy = tmp_path / "local", tmp_path / "drive"
    a_workdir(source)
    storage.sync_directory(str(source), str(copy))
    fd, staged_file = atomic.temporary_file(copy / "checkpoints" / "5" / "state")
    os.close(fd)
    dead_file = as_left_by_a_dead_process(staged_file)
    dead_directory = as_left_by_a_dead_process(atomic.temporary_directory(copy / "checkpoints" / "9"))
    other_host = copy / ".vocab.txt.gone-machine.4242.abc123.tmp"
    write(other_host, "a half-copied vocabulary")
    live = as_left_by(atomic.temporary_directory(copy / "export"), os.getppid())  # a running process
    storage.sync_directory(str(source), str(copy))
    for gone in (dead_file, dead_directory, other_host):
        assert not os.path.lexists(gone), gone
    assert os.path.isdir(live)


def coarse_round_trip(local, drive, new_machine) -> None:
    """A workdir copied to a coarse-timestamp `drive` and back to a new machine: every second sync of
    what did not change copies nothing; a change of size or of time beyond the resolution is copied."""
    a_workdir(local)
    for i, name in enumerate(("metrics.jsonl", "vocab.txt", "checkpoints/5/state")):
        when = 1_700_000_001_234_567_891 + i * 1_000_000_123  # odd seconds, with a fraction
        os.utime(local / name, ns=(when, when))
    assert storage.sync_directory(str(local), str(drive)).files == 3
    assert storage.sync_directory(str(local), str(drive)).files == 0, "an unchanged workdir copied again"

    with open(local / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 10}\n')  # appended: another size
    status = os.stat(local / "vocab.txt")
    write(local / "vocab.txt", "<X>\n</X>\n")  # the same size, written 5 s later
    os.utime(local / "vocab.txt", ns=(status.st_atime_ns, status.st_mtime_ns + 5 * SECOND_NS))
    assert storage.sync_directory(str(local), str(drive)).files == 2
    assert tree(drive) == tree(local)
    assert storage.sync_directory(str(local), str(drive)).files == 0

    assert storage.sync_directory(str(drive), str(new_machine)).files == 3  # the copy back
    assert tree(new_machine) == tree(local)
    assert storage.sync_directory(str(new_machine), str(drive)).files == 0
    assert storage.sync_directory(str(drive), str(new_machine)).files == 0


@pytest.mark.parametrize("seconds", [1, 2], ids=["ext2-like 1 s", "FAT-like 2 s"])
def test_coarse_timestamps_in_process_copy_nothing_unchanged(tmp_path, monkeypatch, seconds):
    """The target stores modification times truncated to 1 s or 2 s (simulated in-process by truncating
    what `os.utime` stores under it: tests/support/coarse_timestamps.py).
    Before: the second sync copied all 3 files again (`assert 3 == 0`), comparing nanoseconds."""
    drive = tmp_path / "drive"
    truncating_utime(monkeypatch, tmp_path / "drive", seconds * SECOND_NS)
    coarse_round_trip(tmp_path / "local", drive / "copy", tmp_path / "new_machine")
    with open(drive / "copy" / MARKER, encoding="utf-8") as f:
        assert json.load(f)["mtime_resolution_ns"] == seconds * SECOND_NS


def test_coarse_timestamps_on_a_loop_mounted_ext2_copy_nothing_unchanged(tmp_path):
    """The same on a real ext2 file system (whole seconds), loop-mounted; skipped where this machine
    does not allow mounting one.
    Before: the second sync copied all 3 files again (`assert 3 == 0`)."""
    with loop_mounted_ext2(tmp_path / "ext2") as mounted:
        coarse_round_trip(tmp_path / "local", tmp_path / "ext2" / "copy", tmp_path / "new_machine")
        with open(os.path.join(mounted, "copy", MARKER), encoding="utf-8") as f:
            assert json.load(f)["mtime_resolution_ns"] == SECOND_NS


def test_a_copy_that_keeps_nanoseconds_records_them(tmp_path):
    """The probe on this test's own disk (tmpfs or ext4: nanoseconds) finds a fine resolution, so a
    change of a millisecond, same size, is still copied (the coarse tolerance is the target's, not a
    fixed one). Before: no marker recorded anything (FileNotFoundError)."""
    source, copy = tmp_path / "local", tmp_path / "drive"
    a_workdir(source)
    storage.sync_directory(str(source), str(copy))
    with open(copy / MARKER, encoding="utf-8") as f:
        assert json.load(f)["mtime_resolution_ns"] < 1_000_000
    status = os.stat(source / "vocab.txt")
    write(source / "vocab.txt", "<X>\n</X>\n")
    os.utime(source / "vocab.txt", ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
    assert storage.sync_directory(str(source), str(copy)).files == 1
