"""The weights a run stands for (`training/weight_average.py`): a debiased moving average of its biLM's weights,
re-derived in NumPy, kept through checkpoints, and started at the resumed weights for a checkpoint that
holds none (its run kept none, as every run before the average existed)."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest

from elmo_jax.training import start, weight_average
from elmo_jax.training.checkpoint import Checkpoints
from elmo_jax.training.loop import train_and_evaluate
from tests.support.compare import restored
from tests.support.configs import tiny_config


def numpy_average(values: list[np.ndarray], decay: float) -> np.ndarray:
    """float64: the mean of values[0..t-1] weighted by decay^(t-1-i), the newest weighing most."""
    weights = decay ** np.arange(len(values) - 1, -1, -1, dtype=np.float64)
    return np.tensordot(weights, np.stack(values).astype(np.float64), axes=1) / weights.sum()


@pytest.mark.parametrize("decay", [0.5, 0.98])
def test_the_average_is_the_decay_weighted_mean_of_every_step_seen(decay):
    """After each of 40 updates, the average of a two-leaf tree equals the NumPy weighted mean of the
    parameter values so far, the initial value carrying no weight (float32: each update rounds once, so
    40 updates stay within 40 ulps of the values' magnitude)."""
    rng = np.random.default_rng(0)
    values = [{"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=(4,)).astype(np.float32)}]
    average = weight_average.fresh(values[0])
    for t in range(40):
        values.append({k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in values[-1].items()})
        average = weight_average.updated(average, values[-1], decay, t)
        for key in ("w", "b"):
            want = numpy_average([v[key] for v in values[1:]], decay)
            bound = (t + 2) * np.finfo(np.float32).eps * np.max(np.abs([v[key] for v in values]))
            np.testing.assert_allclose(np.asarray(average[key]), want, rtol=0, atol=bound)


def test_the_first_update_is_the_parameters_and_the_decay_rises_to_its_setting():
    assert float(weight_average.step_decay(0.98, 0)) == 0.0
    decays = [float(weight_average.step_decay(0.98, u)) for u in range(0, 2000, 100)]
    assert decays == sorted(decays) and abs(decays[-1] - 0.98) < 1e-6


@pytest.mark.slow
def test_a_checkpoint_from_before_the_average_resumes_with_the_average_at_its_weights(corpus, tmp_path):
    """A checkpoint as every run wrote it before the average existed (the state's tree without `average`;
    such checkpoints failed to restore into a state with the field until `checkpoint._on_disk` left empty
    fields out) resumes with the average: the checkpoint's parameters and optimiser state continue, the
    average starts at its weights, and after one more step it holds their average with the new
    parameters as `updated` computes it."""
    workdir = str(tmp_path / "run")
    config = tiny_config(corpus, num_train_steps=2, checkpoint_every_steps=2, weight_average_decay=0.0)
    train_and_evaluate(config, workdir)
    state, data, meta = start.restore_checkpoint(workdir, 2)
    assert state.average is None and "weight_average_decay" in meta["config"]
    shutil.rmtree(os.path.join(workdir, "checkpoints", "2"))
    del meta["config"]["weight_average_decay"]  # as the config of a run from before the key existed
    old = {name: getattr(state, name) for name in ("step", "params", "opt_state", "key", "lstm")}
    checkpoints = Checkpoints(workdir, async_save=False)
    checkpoints.save(2, old, data, meta)
    checkpoints.close()

    resumed = tiny_config(corpus, num_train_steps=3, checkpoint_every_steps=1, weight_average_decay=0.9)
    train_and_evaluate(resumed, workdir)
    before, after = jax.device_get(state), restored(workdir, step=3)[0]
    want = weight_average.updated(before.params["bilm"], after.params["bilm"], 0.9, 2)
    assert jax.tree.structure(after.average) == jax.tree.structure(want)
    leaves = map(jax.tree.leaves, (after.average, want, before.params["bilm"], after.params["bilm"]))
    for got, expected, a, b in zip(*leaves):
        # one multiply-add per element, rounded (or fused) differently in the jitted step: 2 ulps of its inputs
        bound = 2 * np.finfo(np.float32).eps * np.maximum(np.abs(a), np.abs(b))
        assert np.all(np.abs(np.asarray(got) - np.asarray(expected)) <= bound)
    assert np.any(np.asarray(jax.tree.leaves(after.average)[0]) != np.asarray(jax.tree.leaves(after.params["bilm"])[0]))
