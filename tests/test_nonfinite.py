"""A non-finite loss stops training with a message naming the step, and no non-finite checkpoint is saved;
with `max_nonfinite_steps` such steps are skipped (parameters unchanged) up to that many, then it stops."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.training import jitted_steps, loop, step_report
from tests.support.compare import assert_trees_equal, read_metrics, restored
from tests.support.configs import tiny_config


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


@pytest.fixture(scope="module")
def poisoned_steps():
    """The real train step, except that steps BAD_STEPS return a NaN loss and NaN parameters (what an
    overflow does), decided on the device from the step counter. The jitted steps are rebuilt around
    it (and again afterwards, so no other test gets them); the tests here share one compilation."""
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
