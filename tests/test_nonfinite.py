"""A non-finite loss stops training with a message naming the step, and no non-finite checkpoint is saved;
with `max_nonfinite_steps` such steps are skipped (parameters unchanged) up to that many, then it stops."""

from __future__ import annotations

import math
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import elmo_jax
from elmo_jax.formats import model_dir
from elmo_jax.model.params import from_flat, iter_flat
from elmo_jax.training import jitted_steps, loop, step_report
from tests.support.commands import error_line
from tests.support.compare import assert_trees_equal, read_metrics, restored
from tests.support.configs import tiny_config
from tests.support.inprocess import run_in_process


@pytest.mark.slow
def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(corpus, tmp_path):
    # Adagrad's first step moves every parameter by about the learning rate: 1e30 overflows the next loss.
    config = tiny_config(corpus, **{"learning_rate": 1e30, "num_train_steps": 6, "checkpoint_every_steps": 1})
    workdir = str(tmp_path / "w")
    with pytest.raises(step_report.TrainingError, match=r"non-finite loss or gradient at step (\d+)") as info:
        loop.train_and_evaluate(config, workdir)
    bad_step = int(re.search(r"at step (\d+)", str(info.value)).group(1))
    assert 1 <= bad_step <= 6
    state, _ = restored(workdir)  # the newest checkpoint on disk
    assert int(state.step) < bad_step
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state.params))
    logged = read_metrics(workdir)
    assert all(math.isfinite(r["loss"]) for r in logged if r["step"] < bad_step)


# ----------------------------------------------------------------------------- skipping (max_nonfinite_steps)

BAD_STEPS = (3, 5)  # 1-based steps whose update is poisoned


@pytest.fixture
def poisoned_steps():
    """The real train step, except that steps BAD_STEPS return a NaN loss and NaN parameters (what an
    overflow does), decided on the device from the step counter. The jitted steps are rebuilt around
    it, and again afterwards: no other test, nor a session fixture built meanwhile, gets them."""
    real = jitted_steps.train_step_fn

    def poisoned(state, batch, **kwargs):
        new, metrics = real(state, batch, **kwargs)
        bad = jnp.isin(state.step + 1, jnp.array(BAD_STEPS))
        nan = jnp.where(bad, jnp.nan, 0.0).astype(jnp.float32)
        new = new.replace(params=jax.tree.map(lambda p: p + nan, new.params))
        return new, {**metrics, "loss": metrics["loss"] + nan}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jitted_steps, "train_step_fn", poisoned)
        jitted_steps.jit_steps.cache_clear()
        yield
    jitted_steps.jit_steps.cache_clear()


def skip_config(corpus, steps, limit):
    return tiny_config(
        corpus,
        **{
            "num_train_steps": steps,
            "checkpoint_every_steps": 1,
            "keep_checkpoints": 10,
            "eval_every_steps": 0,
            "max_nonfinite_steps": limit,
        },
    )


@pytest.mark.slow
def test_skipped_nonfinite_steps_leave_parameters_unchanged_and_are_counted(corpus, tmp_path, poisoned_steps):
    """max_nonfinite_steps=2 with steps 3 and 5 non-finite: each is skipped on the device (the
    checkpoint after it holds exactly the parameters and Adagrad state of the one before), logged with
    its NaN loss and the running count, and training goes on; the count survives a resume (the run
    stops after step 4 and is re-run to 6)."""
    workdir = str(tmp_path / "w")
    loop.train_and_evaluate(skip_config(corpus, 4, 2), workdir)
    loop.train_and_evaluate(skip_config(corpus, 6, 2), workdir)
    states = {step: restored(workdir, step=step)[0] for step in range(1, 7)}
    for bad in BAD_STEPS:
        assert int(states[bad].step) == bad
        assert_trees_equal(states[bad].params, states[bad - 1].params)
        assert_trees_equal(states[bad].opt_state, states[bad - 1].opt_state)
    for good in (2, 4, 6):  # the other steps do train
        assert (
            np.max(
                np.abs(
                    np.asarray(states[good].params["softmax"]["W"])
                    - np.asarray(states[good - 1].params["softmax"]["W"])
                )
            )
            > 0
        )
    for state in states.values():
        assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state))
    logged = {r["step"]: r for r in read_metrics(workdir)}  # the last record of each step
    assert sorted(logged) == list(range(1, 7))
    for step, r in logged.items():
        assert (r["loss"] == "nan") == (step in BAD_STEPS), r
        assert r["nonfinite_skipped"] == sum(bad <= step for bad in BAD_STEPS), r


@pytest.mark.slow
def test_more_nonfinite_steps_than_allowed_stop_training(corpus, tmp_path, poisoned_steps):
    """max_nonfinite_steps=1: step 3 is skipped, step 5 stops training with a message naming the step
    and the limit; the newest checkpoint is step 4's, finite."""
    workdir = str(tmp_path / "w")
    with pytest.raises(
        step_report.TrainingError,
        match=r"at step 5 .*1 such steps skipped already, the most "
        r"--config.max_nonfinite_steps allows; stopped without saving it",
    ):
        loop.train_and_evaluate(skip_config(corpus, 6, 1), workdir)
    state, _ = restored(workdir)
    assert int(state.step) == 4
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state))


# ----------------------------------------------------------------------------- no non-finite state saved or used


@pytest.fixture
def nan_update_at_step_2():
    """The real train step, except that step 2's update makes the parameters NaN while its loss and
    gradient stay finite (what a NaN learning rate did before config checks refused one)."""
    real = jitted_steps.train_step_fn

    def poisoned(state, batch, **kwargs):
        new, metrics = real(state, batch, **kwargs)
        nan = jnp.where(state.step + 1 == 2, jnp.nan, 0.0).astype(jnp.float32)
        return new.replace(params=jax.tree.map(lambda p: p + nan, new.params)), metrics

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jitted_steps, "train_step_fn", poisoned)
        jitted_steps.jit_steps.cache_clear()
        yield
    jitted_steps.jit_steps.cache_clear()


@pytest.mark.slow
def test_a_state_made_non_finite_by_a_finite_step_is_never_checkpointed(corpus, tmp_path, nan_update_at_step_2):
    """Issue #17 case 7: with a NaN learning rate, training stopped at step 2 (its loss was NaN) but
    checkpoint 1 already held the NaN parameters step 1's update made. Now the state is checked before
    every save: step 2's NaN parameters stop training there, naming the step, and the newest
    checkpoint is step 1's, finite."""
    workdir = str(tmp_path / "w")
    config = tiny_config(corpus, num_train_steps=4, checkpoint_every_steps=1)
    with pytest.raises(step_report.TrainingError, match=r"after step 2 hold NaN or Inf .* the last checkpoint, step 1"):
        loop.train_and_evaluate(config, workdir)
    state, _ = restored(workdir)
    assert int(state.step) == 1
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state))


@pytest.fixture(scope="module")
def nan_checkpoint(trained_run, tmp_path_factory):
    """A copy of the trained run with one more checkpoint whose softmax holds a NaN (as an old run with
    a NaN learning rate could leave)."""
    from elmo_jax.training.checkpoint import Checkpoints
    from elmo_jax.training.start import restore_checkpoint

    workdir = tmp_path_factory.mktemp("nan_checkpoint") / "w"
    shutil.copytree(trained_run.workdir, workdir)
    state, data, meta = restore_checkpoint(str(workdir))

    def with_nan(bilm):  # the biLM's weights and, as the same step would leave it, their average
        return (
            None
            if bilm is None
            else jax.tree.map(lambda w: w.at[(0,) * w.ndim].set(jnp.nan) if w.ndim == 2 else w, bilm)
        )

    params = {**state.params, "bilm": with_nan(state.params["bilm"])}
    bad = state.replace(step=state.step + 1, params=params, average=with_nan(state.average))
    checkpoints = Checkpoints(str(workdir), async_save=False)
    checkpoints.save(int(bad.step), bad, data, meta)
    checkpoints.close()
    return workdir, int(bad.step)


def test_evaluate_and_export_refuse_non_finite_weights(nan_checkpoint, tmp_path):
    """Case 7: `evaluate` printed "perplexity": NaN and `export` wrote the model (exit 0 both)."""
    workdir, step = nan_checkpoint
    expected = (f"{workdir} step {step}: non-finite weights: bilm/", "holds NaN or Inf")
    error_line(run_in_process("elmo_jax.evaluate", f"--workdir={workdir}"), *expected)
    error_line(run_in_process("elmo_jax.export", f"--workdir={workdir}", f"--output={tmp_path / 'model'}"), *expected)
    assert not (tmp_path / "model").exists()


def test_embed_and_the_model_files_refuse_non_finite_weights(tiny_params, tmp_path):
    """Case 16 (a weight file with a NaN loaded without a word, and `embed` returned NaN vectors) and
    case 7's `embed_text` on a NaN export: every way into a model refuses NaN/Inf, naming the array."""
    name = "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"
    flat = dict(iter_flat(tiny_params.weights))
    flat[name] = np.asarray(flat[name]).copy()
    flat[name][3, 5] = np.inf
    bad = elmo_jax.BiLMParams(weights=from_flat(flat), config=tiny_params.config)
    chars = elmo_jax.batch_to_ids([["the", "bank"]])
    with pytest.raises(ValueError, match=f"non-finite weights: {name} holds NaN or Inf"):
        elmo_jax.embed(bad, chars)
    elmo_jax.embed(tiny_params, chars)  # the good weights still embed
    elmo_jax.save_hdf5(bad, tmp_path / "options.json", tmp_path / "weights.hdf5")  # a damaged file
    with pytest.raises(
        ValueError, match=f"weights.hdf5: non-finite weights: {name}: 1 of .* first at index \\(3, 5\\)"
    ):
        elmo_jax.load_hdf5(tmp_path / "options.json", tmp_path / "weights.hdf5")
    with pytest.raises(ValueError, match="cannot write the model directory .*non-finite weights"):
        model_dir.write_model_dir(bad, tmp_path / "model")
    model_dir.write_model_dir(tiny_params, tmp_path / "model")
    good = np.load(tmp_path / "model" / "params.npz")
    np.savez(tmp_path / "model" / "params.npz", **{k: (flat[k] if k == name else good[k]) for k in good.files})
    with pytest.raises(ValueError, match=f"params.npz: non-finite weights: {name}"):
        model_dir.load(tmp_path / "model", verify=False)  # sizes match; the digest check is off
