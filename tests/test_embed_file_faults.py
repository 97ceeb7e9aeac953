"""`embed_file` stopped at every phase, a signal lost or changed by the code it lands in, two runs writing
one output, a full or read-only disk (docs/FAULTS.md).

Whatever stops a run, and wherever, the run is finished (the output complete under its name, nothing
staged) or resumable (the output untouched, the staging directory kept, and the same command writes the
uninterrupted run's file), never neither. The stops are made in-process at an exact moment: a patched
function that the phase calls sends SIGINT or SIGTERM to this process (`signal.raise_signal`; SIGTERM
under the commands' handler, `cli.sigterm_raises`) or raises the stop's exception itself (what a
handler that raises wherever the signal lands did before). Real processes killed by a signal are in
test_embed_file_resume.py, a multi-process run with a process killed in test_embed_file_scale.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import subprocess

import pytest

from elmo_jax import cli
from elmo_jax.features.batch_runner import BatchRunner
from elmo_jax.files import file_embedding as ef
from elmo_jax.formats import vector_spool, vectors_hdf5
from elmo_jax.formats.vectors_hdf5 import VectorsWriter
from elmo_jax.runtime import processes
from elmo_jax.storage import atomic
from tests.support.commands import error_line, file_size_limit
from tests.support.embed_files import (
    FLAGS,
    OPTIONS,
    as_left_by,
    as_left_by_a_dead_process,
    assert_same_file,
    read_all,
    staging_dirs,
    write_input,
    write_previous_vectors,
)
from tests.support.inprocess import run_in_process

OVERWRITE = ef.Options(**{**OPTIONS.__dict__, "overwrite": True})


@pytest.fixture(scope="module")
def uninterrupted(tiny_params, tmp_path_factory):
    """(`read_all` of the uninterrupted run's file, its size in bytes, the bytes of its vectors)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    path = write_input(root / "in.txt")
    ef.embed_file(tiny_params, str(path), str(root / "out.hdf5"), OPTIONS)
    reference = read_all(root / "out.hdf5")
    vectors = sum(array.nbytes for name, array in reference[0].items() if name != "sentence_to_index")
    return reference, os.path.getsize(root / "out.hdf5"), vectors


# ----------------------------------------------------------------------------- a stop at every phase


def remove_partly(directory: str) -> None:
    """The start of removing a staging directory: its journal goes first."""
    os.unlink(os.path.join(directory, vector_spool.JOURNAL))


# (phase, the object whose attribute the phase calls, the attribute, on which call, when the stop comes:
# before the call, after it, or during it: `remove_partly` first).
PHASES = [
    ("startup, before the spool exists", vector_spool, "adopt", 1, "before"),
    ("startup, the spool created", atomic, "remove_stale_staging", 1, "before"),
    ("spooling, after 3 batches", vector_spool.Spool, "append", 4, "before"),
    ("assembly, writing the file", VectorsWriter, "add", 50, "before"),
    ("assembly, the file written, before the rename", atomic, "publish_file", 1, "before"),
    ("assembly, renamed, before the staging is removed", atomic, "publish_file", 1, "after"),
    ("cleanup, removing the staging directory", vector_spool, "remove", 1, "during"),
]


def raise_terminated() -> None:
    raise cli.Terminated()  # what the commands' handler did wherever SIGTERM landed


STOPS = {
    "SIGINT": lambda: signal.raise_signal(signal.SIGINT),
    "SIGTERM": lambda: signal.raise_signal(signal.SIGTERM),
    "raised": raise_terminated,
}


def stop_at(monkeypatch, owner, attribute: str, call: int, when: str, stop) -> None:
    """Makes the `call`-th call of `owner.attribute` stop the run (`stop()`) before, after or during it."""
    original, calls = getattr(owner, attribute), []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) != call:
            return original(*args, **kwargs)
        if when == "during":
            remove_partly(*args)
        if when in ("before", "during"):
            stop()
            return original(*args, **kwargs)
        result = original(*args, **kwargs)
        stop()
        return result

    monkeypatch.setattr(owner, attribute, stopping)


def outcome(tiny_params, tmp_path, path, previous: bytes, reference, phase: str) -> str:
    """Checks what a stopped run left and returns it: "finished" (the output is the uninterrupted run's
    file, nothing staged) or "resumable" (the earlier output untouched, one staging directory holding a
    spool, and the same command, its writer dead, continues from it and writes the uninterrupted run's
    file); stopped before the spool existed, "not started" (nothing staged; the same command writes the
    file)."""
    target = tmp_path / "out.hdf5"
    left = staging_dirs(tmp_path)
    if target.read_bytes() != previous:
        assert_same_file(target, reference)
        assert left == [], f"finished, but {left} is left"
        return "finished"
    started = not phase.endswith("before the spool exists")
    if started:
        assert len(left) == 1, f"neither finished nor resumable: the output untouched and {left} staged"
        (staging,) = left
        assert {vector_spool.RUN, vector_spool.JOURNAL, vector_spool.VECTORS} <= set(os.listdir(staging))
        as_left_by_a_dead_process(staging)
    else:
        assert left == []
    counts = ef.embed_file(tiny_params, str(path), str(target), OVERWRITE)
    assert_same_file(target, reference)
    assert staging_dirs(tmp_path) == []
    assert (counts["resumed_lines"] > 0) == (started and not phase.startswith("startup"))
    return "resumable" if started else "not started"


@pytest.mark.parametrize("stop", sorted(STOPS))
@pytest.mark.parametrize("phase", PHASES, ids=[p[0] for p in PHASES])
def test_a_run_stopped_at_any_phase_is_finished_or_resumable(
    tiny_params, uninterrupted, tmp_path, monkeypatch, phase, stop
):
    name, owner, attribute, call, when = phase
    path = write_input(tmp_path / "in.txt")
    previous = write_previous_vectors(tmp_path / "out.hdf5")
    stopped = None
    with monkeypatch.context() as patch, cli.sigterm_raises():
        stop_at(patch, owner, attribute, call, when, STOPS[stop])
        try:
            ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), OVERWRITE)
        except (KeyboardInterrupt, cli.Terminated) as e:
            stopped = e
    result = outcome(tiny_params, tmp_path, path, previous, uninterrupted[0], name)
    if result == "resumable":
        assert stopped is not None and "run the same command again to continue" in " ".join(stopped.__notes__)
    print(f"{name}, {stop}: {result}{'' if stopped is None else ', ' + type(stopped).__name__}")


# ------------------------------------------------------------- a signal lost or changed on its way


@pytest.mark.parametrize(
    "fate, signals",
    [("lost", 1), ("turned into an error", 1), ("turned into an error", 2)],
)
def test_a_signal_that_the_code_it_lands_in_loses_or_changes_still_stops_the_run_resumably(
    tiny_params, uninterrupted, tmp_path, monkeypatch, fate, signals
):
    """SIGTERM landing in JAX while it traces a new batch shape: its garbage-collection callback reports
    the exception and goes on ("lost"), its bare `except:` clauses (jax/_src/core.py) turn it into another
    error ("turned into an error"; measured: 32 of 379 signals landing there were lost or changed). The
    run must still stop, resumably: a signal is taken at the run's next stop point, so it never raises
    inside that code; a second one raises at once, and if that is turned into an error, the run knows it
    was a stop. (The flake of test_a_killed_command_continues_where_it_stopped[SIGTERM]: before, the
    error removed the spool, and neither the output nor the progress was left.)"""
    path = write_input(tmp_path / "in.txt")
    previous = write_previous_vectors(tmp_path / "out.hdf5")
    dispatch, calls = BatchRunner.dispatch, []

    def tracing(self, batch):
        calls.append(1)
        if len(calls) == 6:  # a few batches are in the spool
            try:
                for _ in range(signals):
                    signal.raise_signal(signal.SIGTERM)
            except BaseException:  # noqa: B036 (what the code a signal lands in may do)
                if fate == "turned into an error":
                    raise AttributeError("'int' object has no attribute '_evaluate'") from None
        return dispatch(self, batch)

    with monkeypatch.context() as patch, cli.sigterm_raises():
        patch.setattr(BatchRunner, "dispatch", tracing)
        with pytest.raises(cli.Terminated) as stopped:
            ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), OVERWRITE)
    assert "run the same command again to continue" in " ".join(stopped.value.__notes__)
    assert outcome(tiny_params, tmp_path, path, previous, uninterrupted[0], "spooling") == "resumable"


# ---------------------------------------------------------------------- two runs writing one output


@pytest.fixture
def other_writer():
    """A live process of this host (another run's writer, as far as a staging name can tell)."""
    sleeper = subprocess.Popen(["sleep", "300"])
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def model_flags(fixture_dir) -> list[str]:
    return [f"--options={fixture_dir / 'options.json'}", f"--weights={fixture_dir / 'weights.hdf5'}"]


def test_a_second_run_writing_the_same_output_is_refused_in_one_line(
    fixture_dir, tiny_params, uninterrupted, tmp_path, monkeypatch, other_writer
):
    """Another run (a live pid of this host) has a staging directory of the output: the command is refused
    at once, naming it, and touches nothing; a run that took its staging directory while the other one
    appeared is refused too and removes its own. Once the other run is gone, the same command runs."""
    path = write_input(tmp_path / "in.txt")
    target = tmp_path / "out.hdf5"
    previous = write_previous_vectors(target)
    theirs = as_left_by(atomic.temporary_directory(target), other_writer)
    (tmp_path / theirs / vector_spool.JOURNAL).write_text("their progress\n")
    command = ["elmo_jax.embed_file", *model_flags(fixture_dir), f"--input={path}", f"--output={target}", *FLAGS]
    result = run_in_process(*command, "--overwrite")
    error_line(result, f"--output={target} is being written by another run (pid {other_writer}", theirs)
    assert sorted(os.listdir(tmp_path)) == sorted(["in.txt", "out.hdf5", os.path.basename(theirs)])

    os.rename(theirs, tmp_path / "aside")  # the other run starts after this one has checked
    gather = processes.gather_text

    def meanwhile(text):  # the processes meet (check_same) after this run's first check
        if (tmp_path / "aside").exists():
            os.rename(tmp_path / "aside", theirs)
        return gather(text)

    monkeypatch.setattr(processes, "gather_text", meanwhile)
    with pytest.raises(ValueError, match=f"is being written by another run \\(pid {other_writer}"):
        ef.embed_file(tiny_params, str(path), str(target), OVERWRITE)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == sorted(["in.txt", "out.hdf5", os.path.basename(theirs)])
    assert target.read_bytes() == previous
    assert (tmp_path / theirs / vector_spool.JOURNAL).read_text() == "their progress\n"

    os.rename(theirs, tmp_path / "aside")  # the other run ends (its staging is its own business)
    result = run_in_process(*command, "--overwrite")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_file(target, uninterrupted[0])


# ------------------------------------------------------------------------------ a full or read-only disk


def no_room(*args):
    """fallocate(2) on a full disk."""
    ctypes.set_errno(errno.ENOSPC)
    return -1


@pytest.mark.parametrize("full", ["while spooling", "for the final file", "for the final file's blocks"])
def test_a_full_disk_fails_in_one_line_naming_the_output_and_leaves_nothing(
    fixture_dir, uninterrupted, tmp_path, monkeypatch, full
):
    """The disk fills up while the spool is written (RLIMIT_FSIZE at half its final size), or has no room
    for the final file (the limit between the spool's size and the file's; or no blocks for it: fallocate
    fails with ENOSPC): one error line naming --output, nothing of the run left (the staging directory
    removed, the space given back), the earlier output untouched. (A failed HDF5 write crashes the process
    when the file is closed, h5py#914: the file's size is checked and its blocks reserved first.)"""
    _, file_bytes, vector_bytes = uninterrupted
    limit = vector_bytes // 2 if full == "while spooling" else (vector_bytes + file_bytes) // 2
    if full == "for the final file's blocks":
        limit = None
        monkeypatch.setattr(vectors_hdf5, "_fallocate", lambda: no_room)
    path = write_input(tmp_path / "in.txt")
    target = tmp_path / "out.hdf5"
    previous = write_previous_vectors(target)
    command = ["elmo_jax.embed_file", *model_flags(fixture_dir), f"--input={path}", f"--output={target}", *FLAGS]
    with file_size_limit(limit) if limit else contextlib.nullcontext():
        result = run_in_process(*command, "--overwrite")
    expected = {
        "while spooling": ("writing the spool of finished vectors", "File too large"),
        "for the final file": ("the file needs up to", "over this process's file size limit"),
        "for the final file's blocks": ("the file needs up to", "No space left on device"),
    }[full]
    error_line(result, f"--output={target}: ", *expected)
    assert target.read_bytes() == previous
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]


def read_only(directory):
    """(protect, unprotect) commands: root writes whatever the permission bits say, so as root the
    directory is made immutable instead (as tests/test_faults.py does)."""
    if os.geteuid() == 0:
        return ["chattr", "+i", str(directory)], ["chattr", "-i", str(directory)]
    return ["chmod", "555", str(directory)], ["chmod", "755", str(directory)]


@pytest.mark.parametrize("read_only_from", ["the start", "before the rename"])
def test_a_read_only_output_directory_fails_in_one_line_naming_the_output(
    fixture_dir, uninterrupted, tmp_path, monkeypatch, read_only_from
):
    """The output's directory is read-only from the start (refused before anything is read), or becomes so
    while the file is written (a disk remounted read-only: the rename fails): one error line naming
    --output, the earlier output untouched, nothing of the run left but, in the second case, its empty
    staging directory, which a read-only directory keeps (the next run there removes it)."""
    directory = tmp_path / "vectors"
    directory.mkdir()
    path = write_input(tmp_path / "in.txt")
    target = directory / "out.hdf5"
    previous = write_previous_vectors(target)
    protect, unprotect = read_only(directory)
    if read_only_from == "the start":
        subprocess.run(protect, check=True)
    else:
        commit = VectorsWriter.commit

        def committing(self):
            commit(self)
            subprocess.run(protect, check=True)

        monkeypatch.setattr(VectorsWriter, "commit", committing)
    try:
        result = run_in_process(
            "elmo_jax.embed_file",
            *model_flags(fixture_dir),
            f"--input={path}",
            f"--output={target}",
            *FLAGS,
            "--overwrite",
        )
    finally:
        subprocess.run(unprotect, check=True)
    expected = "is not writable" if read_only_from == "the start" else "putting the finished file in place failed"
    error_line(result, f"--output={target}", expected)
    assert target.read_bytes() == previous
    left = staging_dirs(directory)
    assert sorted(os.listdir(directory)) == sorted(["out.hdf5", *map(os.path.basename, left)])
    assert len(left) == (read_only_from != "the start") and all(os.listdir(d) == [] for d in left)
