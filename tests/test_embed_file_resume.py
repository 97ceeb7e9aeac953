"""Resumable `embed_file`: a stopped run's staging directory is taken over by the next run with the same
input, arguments and model, which embeds only what is missing and ends with the file an uninterrupted run
writes; anything else starts over and says why (formats/vector_spool.py, files/file_embedding.py).

A writer counts as dead when its pid no longer runs on this host; in-process tests stop a run with an
exception and rename its staging directory to the pid of a process that has exited, the slow tests
kill a real process.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from elmo_jax.files import file_embedding as ef
from elmo_jax.formats import vector_spool
from tests.support.commands import REPO, command_argv, command_env
from tests.support.embed_files import (
    OPTIONS,
    WORDS,
    as_left_by_a_dead_process,
    assert_same_file,
    read_all,
    staging_dirs,
    write_input,
    write_previous_vectors,
)
from tests.support.inprocess import run_in_process


def stop_after(monkeypatch, batches: int):
    """The next run stops (as on Ctrl-C) when it has appended `batches` batches to its spool."""
    append, calls = vector_spool.Spool.append, []

    def stopping(self, pieces, arrays):
        if len(calls) == batches:
            raise KeyboardInterrupt
        calls.append(1)
        return append(self, pieces, arrays)

    monkeypatch.setattr(vector_spool.Spool, "append", stopping)


@pytest.fixture(scope="module")
def uninterrupted(tiny_params, tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    path = write_input(root / "in.txt")
    ef.embed_file(tiny_params, str(path), str(root / "out.hdf5"), OPTIONS)
    return read_all(root / "out.hdf5")


def interrupted_run(tiny_params, tmp_path, monkeypatch, options=OPTIONS, batches=4):
    """A run stopped after `batches` batches whose writer is then taken for dead; returns its staging dir."""
    path = write_input(tmp_path / "in.txt")
    with monkeypatch.context() as patch:
        stop_after(patch, batches)
        with pytest.raises(KeyboardInterrupt) as stopped:
            ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), options)
    assert "run the same command again to continue" in " ".join(stopped.value.__notes__)
    assert not (tmp_path / "out.hdf5").exists()
    (staging,) = staging_dirs(tmp_path)
    return path, as_left_by_a_dead_process(staging)


def test_a_stopped_run_continues_and_writes_the_same_file(tiny_params, uninterrupted, tmp_path, monkeypatch, caplog):
    path, staging = interrupted_run(tiny_params, tmp_path, monkeypatch)
    with open(os.path.join(staging, vector_spool.JOURNAL)) as journal:
        assert len(journal.readlines()) == 4
    with caplog.at_level(logging.WARNING):
        counts = ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), OPTIONS)
    assert "resuming the run of pid" in caplog.text
    assert 0 < counts["resumed_lines"] < counts["lines"] - counts["blank_lines"]
    assert_same_file(tmp_path / "out.hdf5", uninterrupted)
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]


def test_a_torn_spool_keeps_only_what_it_can_prove(tiny_params, uninterrupted, tmp_path, monkeypatch):
    """A kill between the vectors and their journal line, or a lost tail: the trustworthy part is kept."""
    path, staging = interrupted_run(tiny_params, tmp_path, monkeypatch)
    vectors = os.path.join(staging, vector_spool.VECTORS)
    with open(os.path.join(staging, vector_spool.JOURNAL), "rb") as f:
        lines = f.readlines()
    with open(os.path.join(staging, vector_spool.JOURNAL), "wb") as f:
        f.writelines(lines[:3] + [lines[3][:-20]])  # the 4th line cut short
    with open(vectors, "r+b") as f:  # the 3rd batch's bytes damaged
        f.seek(json.loads(lines[2])["at"] + 5)
        f.write(b"\x00\x01\x02")
    counts = ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), OPTIONS)
    first_two = {p[0] for line in lines[:2] for p in json.loads(line)["pieces"]}
    assert counts["resumed_lines"] == len(first_two)
    assert_same_file(tmp_path / "out.hdf5", uninterrupted)


@pytest.mark.parametrize(
    "change, reason",
    [
        ("layers", "the arguments changed: --layers was 'all', now 'top'"),
        ("input", "the input file changed since"),
        ("resume", None),
    ],
)
def test_changed_input_or_arguments_start_over_saying_why(tiny_params, tmp_path, monkeypatch, caplog, change, reason):
    path, staging = interrupted_run(tiny_params, tmp_path, monkeypatch)
    options = OPTIONS
    if change == "layers":
        options = ef.Options(**{**OPTIONS.__dict__, "layers": "top"})
    elif change == "input":
        write_input(path, seed=1)
    else:
        options = ef.Options(**{**OPTIONS.__dict__, "resume": False})
    with caplog.at_level(logging.WARNING):
        counts = ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), options)
    assert counts["resumed_lines"] == 0
    if reason:
        assert f"not resuming from {staging}" in caplog.text and reason in caplog.text
    assert f"removed {staging}" in caplog.text  # then the stale-staging rule removes it
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]


def test_an_error_removes_the_staging_directory(tiny_params, tmp_path, monkeypatch):
    path = write_input(tmp_path / "in.txt")

    def failing(self, pieces, arrays):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(vector_spool.Spool, "append", failing)
    with pytest.raises(OSError, match="No space left"):
        ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), OPTIONS)
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]


def embed_file_process(fixture_dir, path, target, *extra):
    return subprocess.Popen(
        command_argv(
            "elmo_jax.embed_file",
            f"--options={fixture_dir / 'options.json'}",
            f"--weights={fixture_dir / 'weights.hdf5'}",
            f"--input={path}",
            f"--output={target}",
            "--batch_tokens=256",
            "--progress=false",
            *extra,
        ),
        cwd=REPO,
        env=command_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def long_input(tiny_params, tmp_path_factory):
    """(a 3,000-line input, the layers of an uninterrupted in-process run of it)."""
    root = tmp_path_factory.mktemp("long_input")
    rng = np.random.default_rng(3)
    lines = [" ".join(rng.choice(WORDS, int(rng.integers(1, 20)))) for _ in range(3000)]
    path = root / "in.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    ef.embed_file(tiny_params, str(path), str(root / "reference.hdf5"), ef.Options(batch_tokens=256))
    return path, read_all(root / "reference.hdf5")[0]


# SIGTERM in the suite; SIGKILL (no handler runs) in the stress tier, as the suite's SIGKILL of an embed_file
# process is test_embed_file_scale.py's killed process, whose spool the same commands continue.
@pytest.mark.slow
@pytest.mark.parametrize(
    "signum",
    [pytest.param(signal.SIGKILL, marks=pytest.mark.stress, id="SIGKILL"), pytest.param(signal.SIGTERM, id="SIGTERM")],
)
def test_a_killed_command_continues_where_it_stopped(long_input, fixture_dir, tmp_path, signum):
    """The real thing: the command (a real process, replacing an earlier output with --overwrite) killed
    once its spool holds a few batches. The target keeps its old contents; the staging directory stays,
    under a hidden name, for the next run (SIGTERM: exit 143 with one line saying where the progress
    is). Run again, the command continues from it, and the output equals an uninterrupted run's (to
    float32 rounding: that run is in this process, on 8 devices)."""
    path, expected = tmp_path / "in.txt", long_input[1]
    path.write_bytes(long_input[0].read_bytes())
    target = tmp_path / "out.hdf5"
    previous = write_previous_vectors(target)
    process = embed_file_process(fixture_dir, path, target, "--overwrite")
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            journals = glob.glob(str(tmp_path / ".out.hdf5.*.tmp" / vector_spool.JOURNAL))
            if journals and os.path.getsize(journals[0]) > 2000:
                break
            assert process.poll() is None, "embed_file finished before it could be killed"
            time.sleep(0.05)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert target.read_bytes() == previous
    left = sorted(set(os.listdir(tmp_path)) - {"in.txt", "out.hdf5"})
    assert len(left) == 1 and re.fullmatch(r"\.out\.hdf5\.[^.]+\.\d+\.[^.]+\.tmp", left[0]), left
    if signum == signal.SIGTERM:
        assert process.returncode == 143, stderr[-2000:]
        last = stderr.strip().splitlines()[-1]
        assert "Traceback" not in stderr
        assert last.startswith("stopped by SIGTERM") and "run the same command again to continue" in last
    result = run_in_process(  # the same command again (in this process: what is tested is the adoption)
        "elmo_jax.embed_file",
        f"--options={fixture_dir / 'options.json'}",
        f"--weights={fixture_dir / 'weights.hdf5'}",
        f"--input={path}",
        f"--output={target}",
        "--overwrite",
        "--batch_tokens=256",
        "--progress=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming the run of pid" in result.stderr and "of them from the stopped run" in result.stdout
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]
    got = read_all(target)[0]
    assert sorted(got) == sorted(expected)
    for name in expected:
        if name != "sentence_to_index":
            np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-5, err_msg=name)
