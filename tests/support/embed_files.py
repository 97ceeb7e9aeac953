"""What the tests of a stopped, resumed or failing `embed_file` share: their input, reading and comparing
output files, and staging directories made to look as if another process (dead or alive) left them."""

from __future__ import annotations

import glob
import json
import os
import subprocess

import h5py
import numpy as np

from elmo_jax.files import file_embedding as ef

WORDS = ["the", "bank", "of", "river", ".", "a", "Zürich", "naïve", "x" * 20, "<S>"]
OPTIONS = ef.Options(layers="all", batch_tokens=64, long_sentences="split", max_sentence_tokens=20)
FLAGS = ["--layers=all", "--batch_tokens=64", "--long_sentences=split", "--max_sentence_tokens=20", "--progress=false"]


def write_input(path, n=120, seed=0):
    """`n` random lines of 1-29 tokens (line 8 blank, some split into pieces by OPTIONS)."""
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, int(rng.integers(1, 30)))) for _ in range(n)]
    lines[7] = ""  # a blank line
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_all(path):
    """(every dataset by name, the root attributes) of an HDF5 file."""
    with h5py.File(path, "r") as f:
        return {name: f[name][...] for name in f}, dict(f.attrs)


def assert_same_file(path, reference):
    """The file at `path` holds exactly `reference` (`read_all` of another file)."""
    got, attrs = read_all(path)
    expected, expected_attrs = reference
    assert sorted(got) == sorted(expected) and attrs == expected_attrs
    for name in expected:
        if name == "sentence_to_index":
            assert json.loads(got[name][0]) == json.loads(expected[name][0])
        else:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def write_previous_vectors(path) -> bytes:
    """An earlier output in the elmo-command layout (what --overwrite may replace); returns its bytes."""
    with h5py.File(path, "w") as f:
        f["0"] = np.ones((3, 2, 32), np.float32)
        f["sentence_to_index"] = np.array([json.dumps({"previous results": "0"})], dtype=h5py.string_dtype())
    return path.read_bytes()


def staging_dirs(directory, name="out.hdf5"):
    """The staging directories of `directory/name`."""
    return glob.glob(os.path.join(str(directory), f".{name}.*.tmp"))


def as_left_by(staging: str, pid: int) -> str:
    """Renames a staging directory of this process as if process `pid` (of this host) had written it."""
    prefix, suffix = staging.rsplit(".", 3)[0], staging.rsplit(".", 2)[1:]
    assert staging.split(".")[-3] == str(os.getpid())
    renamed = f"{prefix}.{pid}.{'.'.join(suffix)}"
    os.rename(staging, renamed)
    return renamed


def as_left_by_a_dead_process(staging: str) -> str:
    """Renames a staging directory of this process as if written by a process that has exited."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    return as_left_by(staging, dead.pid)
