"""A non-finite loss stops training with a message naming the step, and no non-finite checkpoint is saved."""

from __future__ import annotations

import math
import re

import jax
import numpy as np
import pytest

from elmo_jax import trainer
from test_train import corpus, read_metrics, restore, tiny_config  # noqa: F401


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(corpus, tmp_path):  # noqa: F811
    # Adagrad's first step moves every parameter by about the learning rate: 1e30 overflows the next loss.
    config = tiny_config(corpus, **{"learning_rate": 1e30, "num_train_steps": 6, "checkpoint_every_steps": 1})
    workdir = str(tmp_path / "w")
    with pytest.raises(trainer.TrainingError, match=r"non-finite loss or gradient at step (\d+)") as info:
        trainer.train_and_evaluate(config, workdir)
    bad_step = int(re.search(r"at step (\d+)", str(info.value)).group(1))
    assert 1 <= bad_step <= 6
    state, _ = restore(workdir, config)  # the newest checkpoint on disk
    assert int(state.step) < bad_step
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state.params))
    logged = read_metrics(workdir)
    assert all(math.isfinite(r["loss"]) for r in logged if r["step"] < bad_step)
