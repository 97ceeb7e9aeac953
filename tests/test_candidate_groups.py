"""Sampled-softmax candidates drawn per group of rows, and configs/bilm_large.py as bilm-tf's recipe.

bilm-tf calls TF's sampled softmax once per direction on each GPU's batch of 128 rows, so each GPU draws
its own candidates. `negative_sample_group_rows` does the same for groups of rows of the global batch:
group k of direction d draws with `fold_in(split(key, 2)[d], k)`. The reference below scores each
group's tokens against its draw with the NumPy re-derivation of TF's loss (tests/reference).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import bilm_large, default, tiny
from elmo_jax.model.config import BiLMConfig
from elmo_jax.training import settings
from elmo_jax.training.lm import lm_losses
from elmo_jax.training.softmax import sample_candidates
from tests.reference.sampled_softmax import np_tf_sampled_softmax

ATOL = 1e-5
D, B, T, P, V, S = 2, 6, 3, 5, 40, 6


@pytest.fixture(scope="module")
def window():
    rng = np.random.default_rng(0)
    W, b = rng.normal(0, 1, (V, P)), rng.normal(0, 0.5, (V,))
    outputs = rng.normal(0, 1, (D, B, T, P))
    targets = rng.integers(0, 8, (D, B, T))  # frequent ids, so some are candidates too (accidental hits)
    mask = rng.random((D, B, T)) < 0.85
    return W, b, outputs, targets, mask


def losses(window, key, group_rows):
    W, b, outputs, targets, mask = (jnp.asarray(x, jnp.float32 if x.dtype == np.float64 else None) for x in window)
    sums, counts = lm_losses(
        {"W": W, "b": b}, outputs, targets, mask, vocab_size=V, num_sampled=S, key=key, group_rows=group_rows
    )
    return np.asarray(sums), np.asarray(counts)


def test_each_group_of_rows_is_scored_against_its_own_draw(window):
    """Three groups of two rows per direction: each group's summed loss is TF's loss against the
    candidates of its own key, and the six draws are not all the same."""
    W, b, outputs, targets, mask = window
    key = jax.random.key(7)
    direction_keys = jax.random.split(key, D)
    expected, draws = np.zeros(D), []
    for d in range(D):
        for k in range(B // 2):
            candidates = np.asarray(sample_candidates(jax.random.fold_in(direction_keys[d], k), V, S))
            draws.append(tuple(sorted(candidates)))
            rows = slice(2 * k, 2 * k + 2)
            token_losses = np_tf_sampled_softmax(
                W, b, outputs[d, rows].reshape(-1, P), targets[d, rows].reshape(-1), candidates, V, S
            )
            expected[d] += np.sum(token_losses * mask[d, rows].reshape(-1))
    sums, counts = losses(window, key, group_rows=2)
    np.testing.assert_allclose(sums, expected, atol=ATOL, rtol=1e-6)
    np.testing.assert_array_equal(counts, mask.sum(axis=(1, 2)))
    assert len(set(draws)) > 1, draws


def test_one_group_is_one_draw_for_the_whole_batch(window):
    """group_rows 0 and group_rows = B both draw once per direction (the same bits); smaller groups differ."""
    key = jax.random.key(3)
    whole = losses(window, key, group_rows=0)
    np.testing.assert_array_equal(losses(window, key, group_rows=B)[0], whole[0])
    assert np.max(np.abs(losses(window, key, group_rows=3)[0] - whole[0])) > 1e-3


def test_a_group_that_does_not_divide_the_batch_is_refused(window):
    with pytest.raises(ValueError, match=r"negative_sample_group_rows=4 must be 0 .* or divide the batch's 6 rows"):
        losses(window, jax.random.key(0), group_rows=4)


def test_bilm_large_is_bilm_tfs_recipe():
    """No state resets; 8192 candidates per direction for each 128 of the 384 rows (bilm-tf's three
    GPUs); Adagrad 0.2 from 1.0, the loss times unroll_steps clipped at norm 10, dropout 0.1."""
    config = bilm_large.get_config()
    settings.check_config(config, sources=False)  # its lm1b is prepared on the machine that trains it
    assert config.state_reset_probability == 0.0
    assert (config.batch_size, config.negative_sample_group_rows) == (384, 128)
    assert (config.learning_rate, config.adagrad_initial_accumulator, config.clip_norm) == (0.2, 1.0, 10.0)
    assert (config.dropout, config.n_negative_samples, config.unroll_steps) == (0.1, 8192, 20)
    assert config.loss_scale_by_unroll and not config.full_softmax
    cfg = settings.step_config(config, vocab_size=793_471)
    assert cfg.model == BiLMConfig.preset("original")
    assert (cfg.n_negative_samples, cfg.negative_sample_group_rows) == (8192, 128)
    # The default config keeps one draw per batch: its 128 rows are one bilm-tf GPU batch.
    assert (default.get_config().batch_size, default.get_config().negative_sample_group_rows) == (128, 0)


def test_bilm_large_tpu_meshes_keep_128_rows_per_chip():
    """configs/bilm_large.py:TPU_MESHES: data-parallel, 128 rows per chip (one candidate group each), and
    the chip count the slice's name says (v4 and v5p names count TensorCores, two per chip)."""
    for name, (data, model, batch) in bilm_large.TPU_MESHES.items():
        assert model == 1 and batch == 128 * data, name
        cores_per_chip = 2 if name.startswith(("v4-", "v5p-")) else 1
        assert data == int(name.split("-")[1]) // cores_per_chip, name


@pytest.mark.parametrize(
    "value,message",
    [
        (
            3,
            r"--config.negative_sample_group_rows=3: expected 0 \(one candidate draw for the batch\) or a divisor "
            r"of --config.batch_size=8",
        ),
        (-1, r"--config.negative_sample_group_rows must be 0 \(off\) or positive, found -1"),
    ],
)
def test_check_config_refuses_a_bad_group_size(value, message):
    config = tiny.get_config()
    config.negative_sample_group_rows = value
    with pytest.raises(ValueError, match=message):
        settings.check_config(config)
