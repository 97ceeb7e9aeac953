"""Files damaged after they were written: a checkpoint with a truncated or deleted file is named when
it fails to restore, and the previous complete checkpoint is used (said loudly, the bad one moved aside,
never deleted) or, with none left, training refuses naming them all; a truncated HDF5 weight file or
options file gives an error naming the file, never garbage vectors.
"""

from __future__ import annotations

import logging
import os
import shutil

import jax
import pytest

import elmo_jax
from elmo_jax.training import loop, start
from elmo_jax.training.checkpoint import CheckpointCorruptError
from tests.support.compare import assert_trees_equal, read_metrics, tree_digest, without_timing
from tests.support.configs import tiny_config


def train(corpus, workdir, steps: int):
    config = tiny_config(corpus, num_train_steps=steps, checkpoint_every_steps=2)
    return loop.train_and_evaluate(config, str(workdir))


@pytest.fixture(scope="module")
def six_steps(corpus, tmp_path_factory):
    """A workdir trained for 6 steps: checkpoints 2, 4 and 6."""
    workdir = tmp_path_factory.mktemp("six_steps")
    train(corpus, workdir, 6)
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4", "6"]
    return workdir


@pytest.fixture(scope="module")
def clean_eight(corpus, six_steps, tmp_path_factory):
    """The undamaged six-step workdir resumed to step 8 (what a damaged one must end equal to)."""
    workdir = tmp_path_factory.mktemp("clean_eight") / "w"
    shutil.copytree(six_steps, workdir)
    train(corpus, workdir, 8)
    return workdir


def truncate_arrays(step_dir):
    """Cuts every array data file of the checkpoint (OCDBT's `d/` files) in half. (Some of them are
    copies the merged database no longer reads; those restore fine, which is right.)"""
    files = [
        os.path.join(root, f)
        for root, _, names in os.walk(os.path.join(step_dir, "state"))
        for f in names
        if os.path.basename(root) == "d"
    ]
    assert files
    for path in files:
        os.truncate(path, os.path.getsize(path) // 2)


def delete_stream_position(step_dir):
    os.remove(os.path.join(step_dir, "data", "metadata"))


def truncate_meta(step_dir):
    path = os.path.join(step_dir, "meta", "metadata")
    os.truncate(path, os.path.getsize(path) // 2)


DAMAGE = {
    "truncated_arrays": truncate_arrays,
    "deleted_stream_position": delete_stream_position,
    "truncated_meta": truncate_meta,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_training_falls_back_to_the_previous_checkpoint_loudly(
    corpus, six_steps, clean_eight, tmp_path, caplog, damage
):
    """Checkpoint 6 damaged: re-running training names it, moves it aside to 6.corrupt, says it uses
    checkpoint 4, resumes there and ends at step 8 exactly like the undamaged workdir."""
    workdir = tmp_path / "w"
    shutil.copytree(six_steps, workdir)
    directory = workdir / "checkpoints"
    DAMAGE[damage](directory / "6")
    with caplog.at_level(logging.WARNING):
        train(corpus, workdir, 8)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"checkpoint {directory / '6'} cannot be restored (") for m in messages), messages
    assert any(
        m.startswith(f"USING THE OLDER CHECKPOINT {directory / '4'}: the newer {directory / '6'} cannot")
        for m in messages
    ), messages
    assert os.path.isdir(directory / "6.corrupt")  # kept for a person to look at
    assert [r["step"] for r in read_metrics(workdir, "resume")] == [4]
    state, data, _ = start.restore_checkpoint(str(workdir), 8)
    state_ref, data_ref, _ = start.restore_checkpoint(str(clean_eight), 8)
    assert_trees_equal(jax.device_get(state), jax.device_get(state_ref))
    assert data == data_ref
    want = {r["step"]: without_timing(r) for r in read_metrics(clean_eight)}
    assert all(without_timing(r) == want[r["step"]] for r in read_metrics(workdir))


def test_readers_use_the_previous_checkpoint_and_move_nothing(six_steps, tmp_path, caplog):
    """`restore_checkpoint` (evaluate, tests) names the damaged newest checkpoint and returns the one
    before it, leaving the workdir as it is."""
    workdir = tmp_path / "w"
    shutil.copytree(six_steps, workdir)
    truncate_arrays(workdir / "checkpoints" / "6")
    before = tree_digest(workdir)
    with caplog.at_level(logging.WARNING):
        state, _, _ = start.restore_checkpoint(str(workdir))
    assert int(state.step) == 4
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"USING THE OLDER CHECKPOINT {workdir / 'checkpoints' / '4'}") for m in messages)
    assert tree_digest(workdir) == before
    with pytest.raises(ValueError):  # asking for the damaged step itself fails rather than return garbage
        start.restore_checkpoint(str(workdir), 6)


def test_training_refuses_when_no_checkpoint_restores(corpus, six_steps, tmp_path):
    """Every checkpoint damaged: training does not start from scratch silently; the error names the
    directory and each checkpoint, and nothing is moved or written there."""
    workdir = tmp_path / "w"
    shutil.copytree(six_steps, workdir)
    directory = workdir / "checkpoints"
    for step in ("2", "4", "6"):
        truncate_arrays(directory / step)
    before = tree_digest(directory)
    with pytest.raises(CheckpointCorruptError) as info:
        train(corpus, workdir, 8)
    message = str(info.value)
    assert message.startswith(f"no checkpoint in {directory} can be restored")
    assert all(f"{directory / step}: " in message for step in ("2", "4", "6")), message
    assert tree_digest(directory) == before


@pytest.mark.parametrize("keep", [0, 8, 100, 0.5, -1], ids=["empty", "8_bytes", "100_bytes", "half", "all_but_1"])
def test_truncated_hdf5_weight_file_is_named(fixture_dir, tmp_path, keep):
    size = os.path.getsize(fixture_dir / "weights.hdf5")
    cut = int(size * keep) if isinstance(keep, float) else (size - 1 if keep == -1 else keep)
    weights = tmp_path / "weights.hdf5"
    shutil.copy(fixture_dir / "weights.hdf5", weights)
    os.truncate(weights, cut)
    with pytest.raises(ValueError) as info:
        elmo_jax.load_hdf5(fixture_dir / "options.json", weights)
    assert str(info.value).startswith(f"{weights}: ")
    if cut >= 100:
        assert f"truncated HDF5 weight file ({cut} of its {size} bytes" in str(info.value)


def test_truncated_options_file_is_named(fixture_dir, tmp_path):
    options = tmp_path / "options.json"
    text = (fixture_dir / "options.json").read_text(encoding="utf-8")
    options.write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{options}: not valid JSON"):
        elmo_jax.load_hdf5(options, fixture_dir / "weights.hdf5")


def test_metrics_line_cut_short_is_removed_before_resuming(tmp_path, caplog):
    """A metrics.jsonl whose last line was cut short (the disk filled mid-write) is repaired when a
    run resumes: the partial line goes (with a warning), complete records stay, and the last logged
    step (for 'M steps since it were lost') comes from them."""
    from elmo_jax.training.step_report import last_logged_step

    path = tmp_path / "metrics.jsonl"
    complete = '{"step": 4, "kind": "train", "loss": 2.5}\n{"step": 4, "kind": "eval", "perplexity": 9.0}\n'
    path.write_text(complete + '{"step": 5, "kind": "train", "lo', encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert last_logged_step(str(tmp_path)) == 4
    assert path.read_text(encoding="utf-8") == complete
    assert any("cut short" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    assert last_logged_step(str(tmp_path / "nowhere")) is None
