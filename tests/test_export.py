"""Model directories: `python -m elmo_jax.export`, `elmo_jax.load`, and the jax-only StableHLO extractor.

The references are `load_hdf5` + `embed` of the AllenNLP fixture model (itself checked against AllenNLP's
outputs in test_parity_allennlp.py) and, for the workdir export, the trained run's own parameters.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import elmo_jax
from elmo_jax.formats import model_dir
from elmo_jax.formats.extractor import content_buckets
from elmo_jax.model.char_cnn import content_bucket
from elmo_jax.model.params import iter_flat
from elmo_jax.training import start
from elmo_jax.training.weight_average import model_params
from tests.support.commands import error_line, run_command
from tests.support.configs import TRAINED_STEPS
from tests.support.inprocess import run_in_process
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms, lstm_terms

# A process that can import jax and NumPy but not elmo_jax (nor flax or h5py, which it would pull in).
JAX_ONLY_SCRIPT = r"""
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("elmo_jax", "flax", "h5py", "orbax"):
            raise ImportError(f"{name} must not be imported here")

sys.meta_path.insert(0, Refuse())
import jax
import jax.export
import numpy as np

model, inputs, outputs = sys.argv[1:]
extract = jax.export.deserialize(open(f"{model}/extractor.jax", "rb").read())
weights = dict(np.load(f"{model}/params.npz"))
results = {}
with np.load(inputs) as batches:
    for name in batches.files:
        layers, mask = extract.call(weights, batches[name])
        results[name + "/layers"], results[name + "/mask"] = np.asarray(layers), np.asarray(mask)
np.savez(outputs, **results)
print("modules:", sorted(m for m in sys.modules if m.split(".")[0] in ("elmo_jax", "flax", "h5py")))
"""


@pytest.fixture(scope="module")
def exported(fixture_dir, tmp_path_factory):
    """The fixture model exported through the CLI."""
    out = tmp_path_factory.mktemp("models") / "tiny"
    result = run_command(
        "elmo_jax.export",
        f"--options={fixture_dir / 'options.json'}",
        f"--weights={fixture_dir / 'weights.hdf5'}",
        f"--output={out}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def batches_of_several_shapes(rng) -> dict[str, np.ndarray]:
    """Batches of 1, 3 and 9 sentences of 1, 7 and 23 tokens, with long tokens in some: three char-CNN buckets
    (8, 16 and 48 characters, one program each)."""
    words = ["the", "bank", "of", "river", ".", "a", "Zürich", "naïve", "x" * 20, "y" * 45, "<S>", "日本語"]
    out = {}
    for name, (B, T) in {"b1t1": (1, 1), "b3t7": (3, 7), "b9t23": (9, 23)}.items():
        pool = words[:7] if name == "b3t7" else words
        sentences = [[str(rng.choice(pool)) for _ in range(int(rng.integers(1, T + 1)))] for _ in range(B)]
        sentences[0] = sentences[0] + ["."] * (T - len(sentences[0]))  # the batch is exactly T long
        out[name] = elmo_jax.batch_to_ids(sentences)
    return out


def test_model_directory_holds_every_file_and_a_manifest(exported):
    files = set(os.listdir(exported))
    assert {"options.json", "weights.hdf5", "params.npz", "extractor.jax", "USAGE.md", "manifest.json"} <= files
    manifest = json.loads((exported / "manifest.json").read_text())
    assert set(manifest["files"]) == files - {"manifest.json"}
    for name, entry in manifest["files"].items():
        assert entry["bytes"] == os.path.getsize(exported / name)
    # The published pair inside loads like any HDF5 model.
    assert (
        elmo_jax.load_hdf5(exported / "options.json", exported / "weights.hdf5").config
        == elmo_jax.load(exported).config
    )
    assert not [n for n in os.listdir(exported.parent) if n.endswith((".tmp", ".old"))]  # nothing left over


def test_load_gives_the_weights_of_the_hdf5_pair(exported, tiny_params):
    params = elmo_jax.load(exported)
    assert params.config == tiny_params.config
    for (path, a), (path_b, b) in zip(sorted(iter_flat(params.weights)), sorted(iter_flat(tiny_params.weights))):
        assert path == path_b
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)


@pytest.mark.slow
def test_extractor_in_a_jax_only_process_equals_embed(exported, tiny_params, tmp_path):
    batches = batches_of_several_shapes(np.random.default_rng(0))
    np.savez(tmp_path / "inputs.npz", **batches)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ""}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            JAX_ONLY_SCRIPT,
            str(exported),
            str(tmp_path / "inputs.npz"),
            str(tmp_path / "outputs.npz"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "modules: []" in result.stdout
    buckets_seen = set()
    with np.load(tmp_path / "outputs.npz") as outputs:
        for name, chars in batches.items():
            layers, mask = elmo_jax.embed(tiny_params, chars)
            assert outputs[name + "/layers"].shape == layers.shape
            # Another program (symbolic shapes) in another process: its sums may be ordered otherwise.
            terms = char_cnn_terms(tiny_params.config) + lstm_terms(tiny_params.config, chars.shape[1] + 2)
            assert_close_up_to_order(outputs[name + "/layers"], layers, terms, err_msg=name)
            np.testing.assert_array_equal(outputs[name + "/mask"], np.asarray(mask))
            buckets_seen.add(content_bucket(chars, 50))
    assert len(buckets_seen) >= 3  # the in-program bucket choice is exercised, not just one branch
    assert set(buckets_seen) <= set(content_buckets(50))


@pytest.mark.slow
def test_export_of_a_training_workdir_embeds_like_the_trained_parameters(trained_run, tmp_path):
    workdir, config = trained_run.workdir, trained_run.config
    out = tmp_path / "trained"
    result = run_in_process("elmo_jax.export", f"--workdir={workdir}", f"--output={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "vocab.txt").read_text() == open(os.path.join(workdir, "vocab.txt")).read()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"] == f"{workdir} step {config.num_train_steps}"
    state, _, _ = start.restore_checkpoint(workdir)
    trained = elmo_jax.BiLMParams(weights=model_params(state)["bilm"], config=elmo_jax.load(out).config)
    chars = elmo_jax.batch_to_ids([["the", "cat", "meows"], ["a", "dog", "barks", "loudly", "and", "the", "cow"]])
    # The same float32 weights through the same program: the same bits.
    np.testing.assert_array_equal(
        np.asarray(elmo_jax.embed(elmo_jax.load(out), chars)[0]), np.asarray(elmo_jax.embed(trained, chars)[0])
    )
    # An older checkpoint by --step, without the extractor (its own export is checked above).
    older = run_in_process(
        "elmo_jax.export",
        f"--workdir={workdir}",
        f"--step={TRAINED_STEPS[0]}",
        f"--output={tmp_path / 'older'}",
        "--noextractor",
    )
    assert older.returncode == 0, older.stderr[-3000:]
    manifest = json.loads((tmp_path / "older" / "manifest.json").read_text())
    assert manifest["source"].endswith(f"step {TRAINED_STEPS[0]}") and "extractor.jax" not in manifest["files"]
    assert not (tmp_path / "older" / "extractor.jax").exists()
    older_params = elmo_jax.load(tmp_path / "older")
    assert older_params.config == trained.config


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("delete params.npz", "missing params.npz"),
        ("delete extractor.jax", "missing extractor.jax"),
        ("truncate params.npz", "truncated or replaced"),
        ("truncate weights.hdf5", "truncated or replaced"),
        ("flip a byte of params.npz", "SHA-256 mismatch"),
        ("delete manifest.json", "missing manifest.json"),
        ("garble manifest.json", "not valid JSON"),
    ],
)
def test_a_damaged_model_directory_is_refused_by_name(exported, tmp_path, damage, expected):
    model = tmp_path / "model"
    shutil.copytree(exported, model)
    action, name = damage.split(" ", 1)[0], damage.rsplit(" ", 1)[-1]
    target = model / name
    if action == "delete":
        target.unlink()
    elif action == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif action == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    else:
        target.write_text("{not json")
    with pytest.raises((ValueError, FileNotFoundError), match=expected.replace(".", r"\.")) as info:
        elmo_jax.load(model)
    assert str(model) in str(info.value)


def test_export_cli_refuses_bad_requests_and_keeps_what_exists(exported, fixture_dir, tmp_path):
    options, weights = f"--options={fixture_dir / 'options.json'}", f"--weights={fixture_dir / 'weights.hdf5'}"
    existing = tmp_path / "existing"
    shutil.copytree(exported, existing)
    before = {name: (existing / name).read_bytes() for name in os.listdir(existing)}
    error_line(run_in_process("elmo_jax.export", options, weights, f"--output={existing}"), "--overwrite")
    assert {name: (existing / name).read_bytes() for name in os.listdir(existing)} == before
    error_line(
        run_in_process("elmo_jax.export", options, weights, f"--output={tmp_path / 'no' / 'such' / 'dir'}"),
        "does not exist",
    )
    error_line(run_in_process("elmo_jax.export", options, f"--output={tmp_path / 'x'}"), "--weights")
    error_line(
        run_in_process("elmo_jax.export", f"--workdir={tmp_path}", f"--output={tmp_path / 'x'}"), "no checkpoint"
    )
    error_line(
        run_in_process("elmo_jax.export", f"--workdir={tmp_path}", options, weights, f"--output={tmp_path / 'x'}"),
        "either --workdir",
    )
    assert not (tmp_path / "x").exists()
    # --overwrite replaces it with a complete new directory.
    result = run_in_process("elmo_jax.export", options, weights, f"--output={existing}", "--overwrite")
    assert result.returncode == 0, result.stderr[-3000:]
    assert elmo_jax.load(existing).config == elmo_jax.load(exported).config
    assert sorted(os.listdir(tmp_path)) == ["existing"]


def test_manifest_check_names_a_directory_that_is_only_an_hdf5_pair(fixture_dir):
    with pytest.raises(FileNotFoundError, match="--options/--weights"):
        model_dir.load(fixture_dir)


def test_embed_text_cli_reads_a_model_directory(exported, tiny_params, tmp_path):
    """The README's last step: `python -m elmo_jax.embed_text --model=DIR "sentence" ... --output=x.npz`."""
    result = run_command(
        "elmo_jax.embed_text",
        f"--model={exported}",
        f"--output={tmp_path / 'x.npz'}",
        "The bank of the river .",
        "Hello !",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bank" in result.stdout
    expected, mask = elmo_jax.embed(
        tiny_params, elmo_jax.batch_to_ids([["The", "bank", "of", "the", "river", "."], ["Hello", "!"]])
    )
    with np.load(tmp_path / "x.npz") as saved:
        # The same program in another process (one device there): rounding may differ at most.
        terms = char_cnn_terms(tiny_params.config) + lstm_terms(tiny_params.config, 6 + 2)
        assert_close_up_to_order(saved["layers"], expected, terms)
        np.testing.assert_array_equal(saved["mask"], np.asarray(mask))
    error_line(run_in_process("elmo_jax.embed_text", f"--model={tmp_path}", "Hello"), "missing manifest.json")


def test_overwrite_replaces_only_a_model_directory(tiny_params, tmp_path):
    """--overwrite never deletes a directory that is not an earlier export (a workdir, $HOME, '.')."""
    precious = tmp_path / "mydata"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="is not an elmo-jax model directory"):
        model_dir.write_model_dir(tiny_params, precious, overwrite=True)
    assert (precious / "thesis.tex").read_text() == "years of work"
    assert sorted(os.listdir(tmp_path)) == ["mydata"]


def test_a_failed_swap_puts_the_old_model_back(exported, tiny_params, tmp_path, monkeypatch):
    model = tmp_path / "model"
    shutil.copytree(exported, model)
    before = {name: (model / name).read_bytes() for name in os.listdir(model)}
    real_rename, calls = os.rename, []

    def rename(source, target):  # the second rename (staging -> target) fails, as on a full or odd file system
        calls.append(target)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_rename(source, target)

    monkeypatch.setattr(model_dir.os, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        model_dir.write_model_dir(tiny_params, model, overwrite=True)
    monkeypatch.undo()
    assert {name: (model / name).read_bytes() for name in os.listdir(model)} == before
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_a_model_directory_without_the_extractor_loads_and_says_how_to_add_it(tiny_params, tmp_path):
    """`export_extractor=False` (a training config key): no extractor.jax, the manifest says so, `load` and
    the manifest check accept it, and USAGE.md names the command that writes a complete directory."""
    directory = tmp_path / "model"
    manifest = model_dir.write_model_dir(tiny_params, directory, source=f"{tmp_path / 'run'} step 7", extractor=False)
    assert manifest["extractor"] is None and "extractor.jax" not in manifest["files"]
    assert not (directory / "extractor.jax").exists()
    assert model_dir.read_manifest(str(directory))["extractor"] is None
    for (path, a), (_, b) in zip(
        sorted(iter_flat(elmo_jax.load(directory).weights)), sorted(iter_flat(tiny_params.weights))
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
    assert f"python -m elmo_jax.export --workdir={tmp_path / 'run'}" in (directory / "USAGE.md").read_text()
    # A directory whose manifest promises an extractor must still have it.
    complete = tmp_path / "complete"
    model_dir.write_model_dir(tiny_params, complete)
    (complete / "extractor.jax").unlink()
    with pytest.raises(FileNotFoundError, match="extractor.jax"):
        elmo_jax.load(complete)


def test_params_and_weights_from_two_models_are_refused_naming_both(tiny_params, tmp_path):
    """Issue #31: a hand-merged model directory (weights.hdf5 and its manifest entry taken from another
    model) loaded silently: `load` read params.npz, AllenNLP and bilm-tf read the other model's HDF5."""
    first, second = tmp_path / "first", tmp_path / "second"
    model_dir.write_model_dir(tiny_params, first, extractor=False)
    doubled = elmo_jax.BiLMParams(jax.tree.map(lambda w: w * 2, tiny_params.weights), tiny_params.config)
    model_dir.write_model_dir(doubled, second, extractor=False)
    shutil.copy(second / "weights.hdf5", first / "weights.hdf5")
    manifest = json.loads((first / "manifest.json").read_text())
    manifest["files"]["weights.hdf5"] = json.loads((second / "manifest.json").read_text())["files"]["weights.hdf5"]
    (first / "manifest.json").write_text(json.dumps(manifest))
    for verify in (True, False):
        with pytest.raises(ValueError, match="params.npz and weights.hdf5 hold different weights") as info:
            elmo_jax.load(first, verify=verify)
        assert str(first / "params.npz") in str(info.value) and str(first / "weights.hdf5") in str(info.value)
    elmo_jax.load(second)  # a directory written whole is consistent
