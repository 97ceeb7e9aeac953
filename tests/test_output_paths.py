"""Outputs that never overwrite what they should not (issue #17, cases 1-4 and 17): every command's
--output is refused when it exists (unless --overwrite, and then only for the same kind of artifact),
lies inside a model directory or a workdir, or is one of the command's inputs (also through a link);
staging files a killed run left behind are removed by the next write to the same target.

Each case runs the command's `main` as a person's command line would (in this process:
tests/support/inprocess.py) and checks that every file is byte-identical afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from elmo_jax.formats import model_dir, output_paths
from elmo_jax.formats.vectors_hdf5 import VECTORS_FILE
from elmo_jax.storage import atomic
from tests.support.commands import error_line
from tests.support.compare import tree_digest
from tests.support.inprocess import run_in_process


@pytest.fixture(scope="module")
def model(tiny_params, tmp_path_factory):
    """A model directory of the AllenNLP fixture's biLM."""
    directory = tmp_path_factory.mktemp("models") / "tiny"
    model_dir.write_model_dir(tiny_params, directory)
    return directory


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "sentences.txt"
    path.write_text("the bank of the river .\nhello !\n", encoding="utf-8")
    return path


def embed_file(model, text, output, *flags):
    return run_in_process("elmo_jax.embed_file", f"--model={model}", f"--input={text}", f"--output={output}", *flags)


def test_embed_file_refuses_an_existing_output_unless_it_is_vectors_and_overwrite(model, text, tmp_path):
    """Case 1: an existing text file named by --output was silently replaced by HDF5 (exit 0)."""
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"82 KB of someone's notes\n" * 3000)
    before = tree_digest(tmp_path)
    error_line(embed_file(model, text, notes), f"--output={notes} already exists", "--overwrite")
    error_line(embed_file(model, text, notes, "--overwrite"), "is not an elmo-command HDF5 vectors file")
    assert tree_digest(tmp_path) == before
    # An earlier output of embed_file is replaced with --overwrite, and only then.
    vectors = tmp_path / "vectors.hdf5"
    assert embed_file(model, text, vectors).returncode == 0
    first = vectors.read_bytes()
    error_line(embed_file(model, text, vectors), "already exists")
    assert vectors.read_bytes() == first
    result = embed_file(model, text, vectors, "--overwrite", "--layers=top")
    assert result.returncode == 0, result.stderr[-2000:]
    with h5py.File(vectors, "r") as f:
        assert f["0"].shape == (6, 32)  # the new file (top layer), not the old one (all layers)


def test_no_output_inside_a_model_directory(model, text, tmp_path):
    """Case 2: --output=MODEL/weights.hdf5 destroyed the model being read (and another model's
    manifest.json the same way); a new name inside a model directory is refused too."""
    other = tmp_path / "other_model"
    shutil.copytree(model, other)
    before = {path: tree_digest(path) for path in (model, other)}
    for target in (model / "weights.hdf5", other / "manifest.json", other / "new.hdf5"):
        for flags in ((), ("--overwrite",)):
            error_line(embed_file(model, text, target, *flags), "is inside", "a model directory")
    assert {path: tree_digest(path) for path in (model, other)} == before
    model_dir.load(model)
    model_dir.load(other)


def test_export_overwrite_replaces_only_an_exact_earlier_export(model, fixture_dir, tmp_path):
    """Case 3: --overwrite deleted a user's file inside an earlier export, and wiped a folder holding
    a copied manifest.json next to user files."""
    options, weights = f"--options={fixture_dir / 'options.json'}", f"--weights={fixture_dir / 'weights.hdf5'}"
    with_notes = tmp_path / "export_with_notes"
    shutil.copytree(model, with_notes)
    (with_notes / "my_notes.txt").write_text("keep me")
    copied_manifest = tmp_path / "copied_manifest"
    copied_manifest.mkdir()
    shutil.copy(model / "manifest.json", copied_manifest)
    (copied_manifest / "thesis.tex").write_text("years of work")
    before = tree_digest(tmp_path)
    for target in (with_notes, copied_manifest):
        result = run_in_process("elmo_jax.export", options, weights, f"--output={target}", "--overwrite")
        error_line(result, "is not an elmo-jax model directory", "never other files")
    assert tree_digest(tmp_path) == before
    # An exact earlier export is replaced.
    exact = tmp_path / "exact"
    shutil.copytree(model, exact)
    result = run_in_process("elmo_jax.export", options, weights, f"--output={exact}", "--overwrite")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(exact)) == sorted(os.listdir(model))


def test_vocab_refuses_its_own_input_as_output(tmp_path):
    """Case 4: `vocab --files=C.txt --output=C.txt` replaced the corpus with its vocabulary; through a
    symbolic link too; and an existing non-vocabulary file is never replaced."""
    corpus = tmp_path / "C.txt"
    corpus.write_text("the cat sat .\n" * 50, encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(corpus)
    before = tree_digest(tmp_path)
    for output, flags in ((corpus, ()), (corpus, ("--overwrite",)), (link, ("--overwrite",))):
        error_line(run_in_process("elmo_jax.vocab", f"--files={corpus}", f"--output={output}", *flags), "is the input")
    error_line(
        run_in_process("elmo_jax.vocab", f"--files={corpus}", f"--output={tmp_path}/new/v.txt"), "does not exist"
    )
    assert tree_digest(tmp_path) == before
    vocab = tmp_path / "vocab.txt"
    assert run_in_process("elmo_jax.vocab", f"--files={corpus}", f"--output={vocab}").returncode == 0
    result = run_in_process("elmo_jax.vocab", f"--files={corpus}", f"--output={vocab}", "--overwrite", "--min_count=2")
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_killed_runs_staging_is_removed_by_the_next_run_on_that_target(model, text, tmp_path):
    """Case 17: after a SIGKILL the staged `.NAME.<host>.<pid>.<random>.tmp` of embed_file (a file) and
    export (a directory) stayed forever. The next run writing the same target removes them, saying so;
    a live writer's staging and other targets' are left alone."""
    vectors, exported = tmp_path / "vectors.hdf5", tmp_path / "exported"
    dead = _dead_pid()
    stale_file = tmp_path / f".vectors.hdf5.{atomic._host()}.{dead}.abc123.tmp"
    stale_file.write_bytes(b"half an HDF5 file")
    stale_dir = tmp_path / f".exported.{atomic._host()}.{dead}.def456.tmp"
    stale_dir.mkdir()
    (stale_dir / "weights.hdf5").write_bytes(b"half a model")
    live = tmp_path / f".vectors.hdf5.{atomic._host()}.{os.getpid()}.ghi789.tmp"  # this process: alive
    live.write_bytes(b"being written")
    other_target = tmp_path / f".other.hdf5.{atomic._host()}.{dead}.jkl012.tmp"
    other_target.write_bytes(b"not ours to judge")

    result = embed_file(model, text, vectors)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"removed {stale_file}: left behind by an interrupted run (pid {dead})" in result.stderr
    result = run_in_process(
        "elmo_jax.export",
        f"--options={model / 'options.json'}",
        f"--weights={model / 'weights.hdf5'}",
        f"--output={exported}",
    )
    assert f"removed {stale_dir}: left behind by an interrupted run (pid {dead})" in result.stderr
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == sorted([text.name, "vectors.hdf5", "exported", live.name, other_target.name])


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("kind", ["file", "symlink", "directory holding the input"])
def test_check_output_refuses_inputs_in_every_form(tmp_path, kind):
    """The one rule, as a function: an output that is an input, a link to one, or a directory that holds one."""
    source = tmp_path / "data" / "in.txt"
    source.parent.mkdir()
    source.write_text("x")
    target = {"file": source, "symlink": tmp_path / "link", "directory holding the input": source.parent}[kind]
    if kind == "symlink":
        target.symlink_to(source)
    artifact = output_paths.Artifact("a thing", is_directory=kind.startswith("directory"), recognizes=lambda p: True)
    with pytest.raises(ValueError, match="input"):
        output_paths.check_output(target, artifact, overwrite=True, inputs=[source])


def test_vectors_files_are_recognized_by_layout(tmp_path):
    """What embed_file may replace: its own files, and AllenNLP's `elmo` command files (datasets named
    by line index plus sentence_to_index); not other HDF5 files."""
    allennlp = tmp_path / "allennlp.hdf5"
    with h5py.File(allennlp, "w") as f:
        f["0"] = np.zeros((3, 2, 4), np.float32)
        f["sentence_to_index"] = np.array(["{}"], dtype=h5py.string_dtype())
    other = tmp_path / "other.hdf5"
    with h5py.File(other, "w") as f:
        f["weights"] = np.zeros(3)
    assert VECTORS_FILE.recognizes(str(allennlp))
    assert not VECTORS_FILE.recognizes(str(other))
    assert not VECTORS_FILE.recognizes(str(tmp_path / "missing.hdf5"))
