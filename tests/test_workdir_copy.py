"""A workdir's copy on a slow mounted file system (Google Drive): `storage.sync_directory` copies what
changed, a new directory appears whole, what the source removed goes; `workdir_copy.copy_workdir`
leaves out the lock and checkpoints being written. (The copy made from the training loop's
`after_checkpoint` is checked in tests/test_train.py.)"""

from __future__ import annotations

import logging
import os

import pytest

from elmo_jax import storage
from elmo_jax.storage import atomic
from elmo_jax.training import workdir_copy
from tests.support import file_trees
from tests.support.file_trees import write


def tree(root) -> dict[str, str]:
    return file_trees.tree(root, leave_out=storage.sync.MARKER)


def test_sync_copies_what_changed_and_removes_what_is_gone(tmp_path):
    source, target = tmp_path / "local", tmp_path / "drive"
    write(source / "metrics.jsonl", "1\n")
    write(source / "checkpoints" / "5" / "state", "five")
    write(source / "checkpoints" / "5" / "meta", "m5")
    first = storage.sync_directory(str(source), str(target))
    assert tree(target) == tree(source) and (first.files, first.removed) == (3, 0)
    assert first.bytes == len("1\nfivem5")

    again = storage.sync_directory(str(source), str(target))  # nothing changed: nothing copied
    assert (again.files, again.removed) == (0, 0)

    write(source / "metrics.jsonl", "1\n2\n")  # appended
    write(source / "checkpoints" / "10" / "state", "ten")  # a new step ...
    os.rename(source / "checkpoints" / "5", tmp_path / "gone")  # ... and the old one removed
    write(target / "checkpoints" / "5" / "extra", "only in the copy")
    third = storage.sync_directory(str(source), str(target))
    assert tree(target) == tree(source) == {"metrics.jsonl": "1\n2\n", "checkpoints/10/state": "ten"}
    assert (third.files, third.removed) == (2, 1)


def test_a_new_directory_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """A copy that dies halfway through a new step directory leaves no part of it under its name (a new
    machine reading the copy then resumes from the previous step, never from half a checkpoint)."""
    source, target = tmp_path / "local", tmp_path / "drive"
    write(source / "checkpoints" / "3" / "a", "three")
    storage.sync_directory(str(source), str(target))
    for name in ("a", "b", "c"):
        write(source / "checkpoints" / "7" / name, name)
    copied = []
    real_write = atomic.write

    def failing_write(path, fill):
        if len(copied) == 2:
            raise OSError(28, "No space left on device")
        copied.append(path)
        real_write(path, fill)

    monkeypatch.setattr(atomic, "write", failing_write)
    with pytest.raises(OSError, match="No space left"):
        storage.sync_directory(str(source), str(target))
    assert os.listdir(target / "checkpoints") == ["3"], "no part of step 7, not even a staging directory"
    monkeypatch.setattr(atomic, "write", real_write)
    storage.sync_directory(str(source), str(target))
    assert tree(target) == tree(source)


def test_copy_workdir_leaves_out_the_lock_and_checkpoints_being_written(tmp_path):
    source, target = tmp_path / "local", tmp_path / "drive"
    write(source / ".elmo_jax.lock", "pid 1")
    write(source / "vocab.txt", "<S>\n")
    write(source / "checkpoints" / "3" / "state", "three")
    write(source / "checkpoints" / "6.orbax-checkpoint-tmp-123" / "state", "being written")
    write(source / "checkpoints" / ".deleting" / "0" / "state", "being removed")
    write(source / "export" / "options.json", "{}")
    write(source / ".export.host.42.abc.tmp" / "options.json", "an export being built")
    workdir_copy.copy_workdir(str(source), str(target))
    write(target / ".elmo_jax.lock", "the copy's own")  # (a copy is made in an empty or marked folder only)
    workdir_copy.copy_workdir(str(source), str(target))
    assert tree(target) == {
        ".elmo_jax.lock": "the copy's own",  # neither copied nor removed
        "vocab.txt": "<S>\n",
        "checkpoints/3/state": "three",
        "export/options.json": "{}",
    }


def test_sync_refuses_urls_and_a_missing_source(tmp_path):
    with pytest.raises(ValueError, match="gs://b/w: sync_directory copies between local directories"):
        storage.sync_directory(str(tmp_path), "gs://b/w")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        storage.sync_directory(str(tmp_path / "none"), str(tmp_path / "copy"))


def test_workdir_copy_flushes_at_most_every_interval_and_restores_on_a_new_machine(tmp_path):
    """The notebook's copy to Drive: copied at every checkpoint, flushed when `flush_every_s` has passed
    and at the end; a new machine (an empty local workdir) starts from the copy, an existing one does not."""
    local, drive = tmp_path / "local", tmp_path / "drive"
    now, flushes = [0.0], []
    copy = workdir_copy.WorkdirCopy(
        str(local), str(drive), flush=lambda: flushes.append(now[0]), flush_every_s=600, clock=lambda: now[0]
    )
    assert not copy.restore()  # nothing anywhere yet
    for step, minutes in ((5, 4), (10, 9), (15, 11), (20, 19), (25, 22)):
        write(local / "checkpoints" / str(step) / "state", f"step {step}")
        now[0] = minutes * 60.0
        copy(step)
        assert tree(drive)[f"checkpoints/{step}/state"] == f"step {step}"
    assert flushes == [660.0, 1320.0]  # 11 and 22 minutes: the first checkpoints 10 minutes after a flush
    write(local / "metrics.jsonl", "the last records\n")
    copy.finish()
    assert flushes[-1] == 1320.0 and len(flushes) == 3 and tree(drive) == tree(local)

    new_machine = tmp_path / "new_machine"
    again = workdir_copy.WorkdirCopy(str(new_machine), str(drive))
    assert again.restore() and tree(new_machine) == tree(drive)
    assert not again.restore()  # a local workdir with checkpoints is newer than (or equal to) the copy


def test_workdir_copy_refuses_a_folder_that_is_not_a_copy_before_training(tmp_path):
    """The notebook calls `restore()` before training: a Drive folder that is not a copy (MyDrive, the
    notebook's WORK_ROOT under an empty RUN_NAME) is refused there, in one line, before anything is
    created or trained, rather than at the first checkpoint.
    Before: `restore()` returned False (no checkpoints there) and training would have started; the first
    checkpoint's copy then deleted the folder's files."""
    local, work_root = tmp_path / "local" / "run", tmp_path / "MyDrive" / "elmo_runs"
    write(work_root / "pretrained" / "small" / "weights.hdf5", "a downloaded model")
    write(work_root / "other_run" / "checkpoints" / "9" / "state", "another run")
    copy = workdir_copy.WorkdirCopy(str(local), str(work_root))
    with pytest.raises(ValueError, match=f"^{work_root}: not a copy made by elmo_jax .* other_run, pretrained"):
        copy.restore()
    assert not os.path.exists(local) and sorted(tree(work_root)) == [
        "other_run/checkpoints/9/state",
        "pretrained/small/weights.hdf5",
    ]


def test_workdir_copy_goes_on_past_links_and_says_so(tmp_path, caplog):
    """A dangling link and a link loop in the workdir neither stop the copy (nor, through
    `after_checkpoint`, training) nor are copied; the step's line says how many were left out (FIFOs
    and sockets: tests/test_sync_safety.py).
    Before: the copy stopped with FileNotFoundError on the dangling link."""
    local, drive = tmp_path / "local", tmp_path / "drive"
    write(local / "checkpoints" / "5" / "state", "five")
    os.symlink(tmp_path / "nowhere", local / "dangling")
    os.symlink(local / "loop", local / "loop")
    copy = workdir_copy.WorkdirCopy(str(local), str(drive))
    with caplog.at_level(logging.INFO):
        copy(5)
    assert tree(drive) == {"checkpoints/5/state": "five"}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 5: copied 1 files")]
    assert len(lines) == 1 and "not copied: 2 symbolic link(s) (e.g. dangling, loop)" in lines[0], lines
