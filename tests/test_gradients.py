"""Hand-written gradients (issue #8's speed-ups, issue #32's TPU kernels) against plain autodiff of the
textbook forms.

`char_cnn.conv_max` runs in token blocks and keeps only the argmax for its backward pass, and
`precision.matmul` flattens a >2-D input before the product; both must give the gradients `jax.grad`
gives for `jnp.max` and `jnp.einsum`, and the char CNN as a whole the gradient of a max-pool written
with `jnp.max`. `char_cnn.highway`'s written-out gradient must equal autodiff's of the same layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.model import char_cnn
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.params import init_params
from elmo_jax.model.precision import ComputeOptions, matmul


def _plain_conv_max(windows, kernel, last_start):
    conv = jnp.einsum("nsk,kf->nsf", windows, kernel, precision="highest")
    if last_start is not None:
        valid = jnp.arange(windows.shape[1])[:, None] <= jnp.asarray(last_start)[None, :]
        conv = jnp.where(valid, conv, -jnp.inf)
    return jnp.max(conv, axis=1)


@pytest.mark.parametrize("n_blocks", [1, 3])
@pytest.mark.parametrize("last_start", [None, (6, 4, 2)])
def test_conv_max_value_and_gradient_equal_autodiff_of_jnp_max_without_ties(n_blocks, last_start):
    windows = jax.random.normal(jax.random.key(0), (6, 7, 5))  # N = 6 tokens, S = 7 starts, K = 5
    kernel = jax.random.normal(jax.random.key(1), (5, 3))
    g = jax.random.normal(jax.random.key(2), (6, 3))
    ours = lambda w, k: char_cnn.conv_max(w, k, last_start, n_blocks, "float32")
    reference = lambda w, k: _plain_conv_max(w, k, last_start)
    np.testing.assert_allclose(
        np.asarray(ours(windows, kernel)), np.asarray(reference(windows, kernel)), rtol=1e-6, atol=1e-6
    )
    grads = jax.grad(lambda w, k: jnp.sum(ours(w, k) * g), argnums=(0, 1))(windows, kernel)
    expected = jax.grad(lambda w, k: jnp.sum(reference(w, k) * g), argnums=(0, 1))(windows, kernel)
    for a, b in zip(grads, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_conv_max_gives_a_tie_its_whole_gradient_at_the_first_maximum():
    windows = jnp.asarray([[[1.0], [3.0], [3.0], [2.0]]])  # (1, 4, 1): starts 1 and 2 tie
    kernel = jnp.ones((1, 1))
    ours = jax.grad(lambda w: jnp.sum(char_cnn.conv_max(w, kernel, None, 1, "float32")))(windows)
    np.testing.assert_array_equal(np.asarray(ours)[0, :, 0], [0.0, 1.0, 0.0, 0.0])
    # jnp.max splits it; the sum over the tied starts is the same.
    reference = jax.grad(lambda w: jnp.sum(_plain_conv_max(w, kernel, None)))(windows)
    np.testing.assert_array_equal(np.asarray(reference)[0, :, 0], [0.0, 0.5, 0.5, 0.0])


@pytest.mark.parametrize("shape", [(6, 4), (3, 5, 4), (2, 3, 5, 4)])
def test_matmul_gradients_equal_einsum(shape):
    x = jax.random.normal(jax.random.key(2), shape)
    w = jax.random.normal(jax.random.key(3), (4, 6))
    g = jax.random.normal(jax.random.key(4), (*shape[:-1], 6))
    ours = jax.grad(lambda x, w: jnp.sum(matmul(x, w) * g), argnums=(0, 1))(x, w)
    spec = "...i,io->...o"
    reference = jax.grad(lambda x, w: jnp.sum(jnp.einsum(spec, x, w, precision="highest") * g), argnums=(0, 1))(x, w)
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def _highway_problem(F=24, N=37):
    keys = jax.random.split(jax.random.key(7), 6)
    x = jax.random.normal(keys[0], (N, F))
    weights = {
        "W_carry": jax.random.normal(keys[1], (F, F)) / np.sqrt(F),
        "b_carry": jax.random.normal(keys[2], (F,)),
        "W_transform": jax.random.normal(keys[3], (F, F)) / np.sqrt(F),
        "b_transform": jax.random.normal(keys[4], (F,)),  # about half the relu inputs are negative
    }
    return x, weights, jax.random.normal(keys[5], (N, F))


def _highway_gradients(layer, x, weights, g, compute_dtype):
    """Gradients of sum(layer(x) * g) in x and every weight, as one flat dict."""
    args = (x, weights["W_carry"], weights["b_carry"], weights["W_transform"], weights["b_transform"])
    grads = jax.grad(lambda *a: jnp.sum(layer(*a, compute_dtype) * g), argnums=tuple(range(5)))(*args)
    return dict(zip(("x", "W_carry", "b_carry", "W_transform", "b_transform"), grads))


def test_highway_gradient_equals_autodiff_of_the_same_layer():
    """`_highway.fun` is the undecorated layer, so `jax.grad` of it is plain autodiff. Values identical;
    gradients within float32 rounding of sums over 24-37 terms of magnitude ~1 (the products and
    the bias sums run in another order)."""
    x, weights, g = _highway_problem()
    assert np.asarray(jnp.sum(x @ weights["W_transform"] + weights["b_transform"][None, :] < 0)) > 100  # relu bites
    np.testing.assert_array_equal(
        np.asarray(char_cnn.highway(x, weights)),
        np.asarray(char_cnn._highway.fun(x, *weights.values(), "float32")),
    )
    ours = _highway_gradients(char_cnn._highway, x, weights, g, "float32")
    autodiff = _highway_gradients(char_cnn._highway.fun, x, weights, g, "float32")
    for name in ours:
        scale = float(jnp.max(jnp.abs(autodiff[name])))
        np.testing.assert_allclose(ours[name], autodiff[name], rtol=0, atol=64 * 2**-24 * scale, err_msg=name)


def test_highway_bfloat16_gradient_is_as_close_to_float32_as_autodiff():
    x, weights, g = _highway_problem(F=64, N=96)
    truth = _highway_gradients(char_cnn._highway.fun, x, weights, g, "float32")
    error = lambda got: max(float(jnp.linalg.norm(got[k] - truth[k]) / jnp.linalg.norm(truth[k])) for k in truth)
    custom = error(_highway_gradients(char_cnn._highway, x, weights, g, "bfloat16"))
    autodiff = error(_highway_gradients(char_cnn._highway.fun, x, weights, g, "bfloat16"))
    assert custom <= 1.1 * autodiff, (custom, autodiff)


def _jnp_max_conv(char_vectors, kernel, last_start, n_starts, compute):
    """The char CNN's convolution + max-pool as plain jnp (autodiff's max gradient)."""
    E = char_vectors.shape[-1]
    wmax = kernel.shape[0] // E
    windows = jnp.concatenate([char_vectors[:, s : s + n_starts] for s in range(wmax)], axis=-1)
    conv = jnp.einsum("nsk,kf->nsf", windows, kernel, precision="highest")
    valid = jnp.arange(n_starts)[:, None] <= jnp.asarray(last_start)[None, :]
    return jnp.max(jnp.where(valid, conv, -jnp.inf), axis=1)


def test_conv_blocks_are_sized_by_one_devices_tokens():
    """40,960 tokens at 24 starts: 960 blocks' worth of rows in all, 120 per device when split 8 ways;
    the block count is the largest divisor of the per-device token count within that."""
    assert char_cnn._n_blocks(40960, 24) == 640  # 64 tokens per block, 8 per device if 8 share them
    assert char_cnn._n_blocks(40960, 24, shards=8) == 80  # 5,120 tokens per device: 64 per block
    assert char_cnn._n_blocks(40960 + 1, 24, shards=8) == 1  # not divisible: the global count (prime)
    assert char_cnn._n_blocks(100, 4) == 1  # fewer rows than one block


@pytest.mark.parametrize(("block_rows", "token_shards"), [(1024, 1), (64, 1), (16, 4)])
@pytest.mark.parametrize("content_positions", [None, 8])
def test_token_embedding_gradient_equals_plain_autodiff(monkeypatch, content_positions, block_rows, token_shards):
    """Random words (repeated letters and all-PAD windows: ties) through the whole token layer, in one
    token block and in several (blocks sized for one device of 4 too)."""
    monkeypatch.setattr(char_cnn, "CONV_BLOCK_ROWS", block_rows)
    config = BiLMConfig(
        lstm_dim=16, projection_dim=8, n_highway=1, max_characters_per_token=12, filters=((1, 4), (2, 4), (3, 8))
    )
    weights = init_params(config, jax.random.key(0)).weights
    rng = np.random.default_rng(0)
    ids = np.full((24, 12), 261, np.int32)  # shifted PAD
    ids[:, 0] = 259  # shifted BOW
    for row, n in enumerate(rng.integers(1, 7, size=24)):
        ids[row, 1 : 1 + n] = rng.integers(98, 101, size=n)  # 3 letters only: many repeats
        ids[row, 1 + n] = 260  # shifted EOW
    ids = jnp.asarray(ids)
    g = jax.random.normal(jax.random.key(5), (24, config.projection_dim))

    c = content_positions

    def loss(w):
        return jnp.sum(
            char_cnn.token_embedding(w, config, ids, ComputeOptions(content_positions=c, token_shards=token_shards)) * g
        )

    ours = jax.grad(loss)(weights)
    monkeypatch.setattr(char_cnn, "_conv_max", _jnp_max_conv)
    reference = jax.grad(loss)(weights)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(reference)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5, err_msg=str(path))
