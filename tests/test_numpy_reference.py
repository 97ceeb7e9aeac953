"""elmo-jax against NumPy re-derivations of the ELMo equations (/work/shared/ELMO.md).

The references below are written from the equations, in float64, with plain loops over tokens, time
steps and filter positions; they share no code with elmo_jax. Random weights are scaled so that the
LSTM cell clip is actually hit. Float32 tolerance: 1e-5 absolute.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import elmo_jax
import elmo_jax.model.char_cnn
import elmo_jax.model.lstm

ATOL = 1e-5

# Raw character ids of the specials (before the +1 shift that makes 0 mean "no token").
BOS, EOS, BOW, EOW, PAD = 256, 257, 258, 259, 260


# ----------------------------------------------------------------------------- NumPy references


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_lstm_step(W, B, W_P, x, c_prev, h_prev, cell_clip, proj_clip):
    """z = [x; h] W + B; gates i, j, f, o; forget bias +1; clip c; h = (sig(o) tanh(c)) W_P, clipped.

    As in TF's LSTMCell, the projection clip belongs to the projection: without W_P there is none.
    """
    z = np.concatenate([x, h_prev], axis=-1) @ W + B
    i, j, f, o = np.split(z, 4, axis=-1)
    c = np_sigmoid(f + 1.0) * c_prev + np_sigmoid(i) * np.tanh(j)
    if cell_clip is not None:
        c = np.clip(c, -cell_clip, cell_clip)
    h = np_sigmoid(o) * np.tanh(c)
    if W_P is not None:
        h = h @ W_P
        if proj_clip is not None:
            h = np.clip(h, -proj_clip, proj_clip)
    return c, h


def np_highway(x, layer):
    """g = sigmoid(x Wc + bc); y = g * relu(x Wt + bt) + (1 - g) * x."""
    g = np_sigmoid(x @ layer["W_carry"] + layer["b_carry"])
    return g * np.maximum(x @ layer["W_transform"] + layer["b_transform"], 0.0) + (1.0 - g) * x


def np_token_embedding(w, config, ids):
    """Shifted char ids (N, C) -> token vectors (N, P), one token and one window at a time."""
    table = np.concatenate([np.zeros((1, config.char_embed_dim)), w["char_embed"]])  # id 0 -> zero row
    out = []
    for token_ids in ids:
        chars = table[token_ids]  # (C, E)
        pooled = []
        for i, (width, num) in enumerate(config.filters):
            kernel = w["CNN"][f"W_cnn_{i}"][0]  # (width, E, num)
            positions = [np.einsum("ke,ken->n", chars[p : p + width], kernel)
                         for p in range(len(token_ids) - width + 1)]
            pooled.append(np.max(positions, axis=0) + w["CNN"][f"b_cnn_{i}"])
        x = np.concatenate(pooled)
        x = np.maximum(x, 0.0) if config.activation == "relu" else np.tanh(x)
        for k in range(config.n_highway):
            x = np_highway(x, w[f"CNN_high_{k}"])
        if "CNN_proj" in w:
            x = x @ w["CNN_proj"]["W_proj"] + w["CNN_proj"]["b_proj"]
        out.append(x)
    return np.stack(out)


def np_boundary_ids(char, C):
    ids = np.full((C,), PAD, np.int64)
    ids[:3] = (BOW, char, EOW)
    return ids + 1


def np_bilm_sentence(w, config, token_ids):
    """One sentence's ELMo layers (L+1, n, 2P) from its shifted ids (n, C), n >= 0.

    <S> and </S> are added, the forward stack reads tokens 0..n+1, the backward stack the same tokens
    reversed, each layer from a zero state; residual on layers > 0; boundaries removed at the end.
    Also returns how many cell values and projected outputs sat at their clip, to check the test setup.
    """
    C = config.max_characters_per_token
    ids = np.concatenate([np_boundary_ids(BOS, C)[None], token_ids.reshape(-1, C), np_boundary_ids(EOS, C)[None]])
    tokens = np_token_embedding(w, config, ids)  # (n+2, P)
    per_direction, n_clipped = [], {"cell": 0, "proj": 0}
    for d, sequence in enumerate([tokens, tokens[::-1]]):
        inputs, outputs = sequence, []
        for layer in range(config.n_layers):
            cell = w[f"RNN_{d}"]["RNN"]["MultiRNNCell"][f"Cell{layer}"]["LSTMCell"]
            c, h = np.zeros(config.lstm_dim), np.zeros(config.projection_dim)
            out = []
            for x in inputs:
                c, h = np_lstm_step(cell["W_0"], cell["B"], cell.get("W_P_0"), x, c, h,
                                    config.cell_clip, config.proj_clip)
                n_clipped["cell"] += int(np.sum(np.abs(c) == config.cell_clip))
                n_clipped["proj"] += int(np.sum(np.abs(h) == config.proj_clip))
                out.append(h)
            out = np.stack(out)
            if layer > 0 and config.use_skip_connections:
                out = out + inputs
            outputs.append(out if d == 0 else out[::-1])
            inputs = out
        per_direction.append(outputs)
    layers = [np.concatenate([tokens, tokens], -1)]
    layers += [np.concatenate([fw, bw], -1) for fw, bw in zip(*per_direction)]
    return np.stack(layers)[:, 1:-1], n_clipped


def np_scalar_mix_layer_norm(layers, s, gamma, mask):
    """layers (B, L, T, D): per layer one mean/variance over all unmasked elements, eps 1e-13."""
    m = mask[:, :, None].astype(np.float64)
    count = m.sum() * layers.shape[-1]
    weights = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    mixed = np.zeros(layers[:, 0].shape)
    for j in range(layers.shape[1]):
        x = layers[:, j]
        mean = (x * m).sum() / count
        var = (((x - mean) * m) ** 2).sum() / count
        mixed += weights[j] * (x - mean) / np.sqrt(var + 1e-13)
    return gamma * mixed * m


# ----------------------------------------------------------------------------- helpers


def to_numpy(tree):
    """A weights pytree as float64 NumPy (same nesting)."""
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def randomize(params, seed):
    """Replaces every weight with well-conditioned random values (std 1/sqrt(fan_in) for matrices), so
    that biases, b_carry and the char embedding are non-trivial. LSTM gate biases favour remembering
    (forget gate ~ +1.5) with a per-unit input direction, so cells accumulate over a few steps and hit
    the clip without large pre-activations (which would amplify float32 rounding past the tolerance)."""
    rng = np.random.default_rng(seed)

    def fresh(path, leaf):
        name = getattr(path[-1], "key", "")
        shape = leaf.shape
        if name == "B":  # gates i, j, f, o
            i, j, f, o = (rng.normal(0.5, 0.5, shape[0] // 4), rng.normal(0.0, 1.5, shape[0] // 4),
                          rng.normal(1.5, 0.5, shape[0] // 4), rng.normal(0.0, 1.0, shape[0] // 4))
            value = np.concatenate([i, j, f, o])
        elif len(shape) == 1:
            value = rng.normal(0.0, 0.5, shape)
        elif name == "char_embed":
            value = rng.uniform(-1.0, 1.0, shape)
        else:
            fan_in = int(np.prod(shape[:-1]))
            value = rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape)
        return jnp.asarray(value, jnp.float32)

    return params.replace(weights=jax.tree_util.tree_map_with_path(fresh, params.weights))


def random_char_ids(rng, lengths, C, max_bytes=None):
    """Shifted ids (B, T, C) of random-byte tokens: each row's first token has max_bytes bytes (default
    C - 2, the most that fits), the others cycle through shorter lengths; rows padded with all-zero tokens."""
    max_bytes = C - 2 if max_bytes is None else max_bytes
    ids = np.zeros((len(lengths), max(max(lengths), 1), C), np.int64)
    for b, n in enumerate(lengths):
        for t in range(n):
            n_bytes = max_bytes if t == 0 else (5 * b + 3 * t) % (max_bytes + 1)
            token = np.full((C,), PAD, np.int64)
            token[0], token[1 + n_bytes] = BOW, EOW
            token[1 : 1 + n_bytes] = rng.integers(0, 256, n_bytes)
            ids[b, t] = token + 1
    return ids


def tiny_config(**overrides):
    base = dict(char_embed_dim=4, filters=((1, 4), (2, 6), (3, 8)), n_highway=1, activation="relu",
                max_characters_per_token=50, lstm_dim=12, projection_dim=6, n_layers=2,
                cell_clip=3.0, proj_clip=1.0, use_skip_connections=True)
    base.update(overrides)
    return elmo_jax.BiLMConfig(**base)


# ----------------------------------------------------------------------------- LSTM step


def _random_cell(rng, P, H, projected, scale):
    cell = {"W_0": rng.normal(0, scale, (2 * P, 4 * H)), "B": rng.normal(0, scale, (4 * H,))}
    if projected:
        cell["W_P_0"] = rng.normal(0, scale, (H, P))
    return cell


@pytest.mark.parametrize("projected", [True, False], ids=["projection", "no_projection"])
def test_lstm_step_matches_numpy(projected):
    """One step of `lstm_step` equals the equations, with ~10% of cells hitting cell_clip and some
    projected outputs hitting proj_clip (so clipping and the carried clipped state are exercised)."""
    rng = np.random.default_rng(0)
    B, H = 64, 16
    P = 8 if projected else H
    config = tiny_config(lstm_dim=H, projection_dim=P, filters=((1, 8), (2, 8)), cell_clip=3.0, proj_clip=1.5)
    cell = _random_cell(rng, P, H, projected, scale=0.7)
    x, h_prev = rng.normal(0, 1.0, (B, P)), rng.normal(0, 1.0, (B, P))
    c_prev = rng.normal(0, 2.5, (B, H))

    c_ref, h_ref = np_lstm_step(cell["W_0"], cell["B"], cell.get("W_P_0"), x, c_prev, h_prev, 3.0, 1.5)
    clipped = np.mean(np.abs(c_ref) >= 3.0)
    assert 0.03 < clipped < 0.3, f"test setup should clip some cells, clipped {clipped:.1%}"
    if projected:
        assert np.mean(np.abs(h_ref) >= 1.5) > 0.02, "test setup should clip some projected outputs"

    f32 = lambda a: jnp.asarray(a, jnp.float32)
    c, h = elmo_jax.model.lstm.lstm_step({k: f32(v) for k, v in cell.items()}, config, f32(x), f32(c_prev), f32(h_prev))
    assert c.shape == (B, H) and h.shape == (B, P)
    np.testing.assert_allclose(np.asarray(c), c_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(h), h_ref, atol=ATOL, rtol=0)


def test_lstm_without_projection_ignores_proj_clip():
    """bilm-tf builds `LSTMCell(H, proj_clip=...)` without num_proj when P == H, and TF's LSTMCell applies
    proj_clip only to a projected output. So with no W_P_0 and proj_clip < 1, h = sig(o) tanh(c) unclipped."""
    rng = np.random.default_rng(1)
    B, H = 64, 8
    config = tiny_config(lstm_dim=H, projection_dim=H, filters=((1, 8),), proj_clip=0.25)
    cell = _random_cell(rng, H, H, projected=False, scale=0.7)
    x, h_prev, c_prev = rng.normal(0, 1, (B, H)), rng.normal(0, 1, (B, H)), rng.normal(0, 1, (B, H))
    c_ref, h_ref = np_lstm_step(cell["W_0"], cell["B"], None, x, c_prev, h_prev, 3.0, 0.25)
    assert np.mean(np.abs(h_ref) > 0.25) > 0.1, "test setup: some outputs must exceed proj_clip"

    f32 = lambda a: jnp.asarray(a, jnp.float32)
    c, h = elmo_jax.model.lstm.lstm_step({k: f32(v) for k, v in cell.items()}, config, f32(x), f32(c_prev), f32(h_prev))
    np.testing.assert_allclose(np.asarray(c), c_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(h), h_ref, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- char CNN


def test_highway_matches_numpy():
    """The gate from W_carry weights the relu branch (bilm-tf's naming), not the identity."""
    rng = np.random.default_rng(2)
    F = 24
    layer = {"W_carry": rng.normal(0, 0.5, (F, F)), "b_carry": rng.normal(0, 1, (F,)),
             "W_transform": rng.normal(0, 0.5, (F, F)), "b_transform": rng.normal(0, 1, (F,))}
    x = rng.normal(0, 1, (16, F))
    got = elmo_jax.model.char_cnn.highway(jnp.asarray(x, jnp.float32),
                                    {k: jnp.asarray(v, jnp.float32) for k, v in layer.items()})
    np.testing.assert_allclose(np.asarray(got), np_highway(x, layer), atol=ATOL, rtol=0)


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(activation="tanh"),
    dict(n_highway=0),
    dict(n_highway=2, activation="tanh"),
    dict(projection_dim=18, lstm_dim=18),  # sum(filters) == P: no CNN projection
], ids=["relu", "tanh", "no_highway", "two_highway_tanh", "no_projection"])
def test_token_embedding_matches_numpy(overrides):
    """Embedding (zero row for id 0), valid 1-D convolutions, max over positions, bias, activation,
    highway and projection, for random tokens of every length plus an all-padding token."""
    config = tiny_config(**overrides)
    assert config.has_cnn_projection == ("projection_dim" not in overrides)
    params = randomize(elmo_jax.init_params(config, jax.random.key(0)), seed=3)
    assert ("CNN_proj" in params.weights) == config.has_cnn_projection
    rng = np.random.default_rng(4)
    C = config.max_characters_per_token
    ids = random_char_ids(rng, [C + 2], C)[0]  # (C + 2, C)
    n_bytes = np.sum(ids != PAD + 1, axis=1) - 2  # all but BOW, EOW and PAD
    assert set(n_bytes) == set(range(C - 1)), "test setup: every token length 0..C-2 must appear"
    ids = np.concatenate([ids, np.zeros((1, C), np.int64), np_boundary_ids(BOS, C)[None]])
    got = elmo_jax.model.char_cnn.token_embedding(params.weights, config, jnp.asarray(ids, jnp.int32))
    expected = np_token_embedding(to_numpy(params.weights), config, ids)
    assert got.shape == (len(ids), config.projection_dim)
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------- full biLM


@pytest.mark.parametrize("overrides,max_bytes", [
    (dict(), 10),
    (dict(), 48),
    (dict(n_layers=3), 10),
    (dict(use_skip_connections=False), 10),
    (dict(projection_dim=18, lstm_dim=18, cell_clip=None, proj_clip=None), 10),
], ids=["two_layers", "two_layers_48_byte_tokens", "three_layers", "no_skip", "no_projections_no_clip"])
def test_bilm_matches_numpy(overrides, max_bytes):
    """`embed` equals a per-sentence, per-time-step NumPy biLM for a batch of different lengths incl. an
    empty sentence: padding must not leak into any row, and the backward stack must reverse each
    sentence within its own length. Short tokens (<= 10 bytes of 50 slots) and full-width ones
    (48 bytes) both appear, since only the all-PAD tail of a token may be skipped."""
    config = tiny_config(**overrides)
    params = randomize(elmo_jax.init_params(config, jax.random.key(1)), seed=5)
    weights = to_numpy(params.weights)
    lengths = [5, 1, 0, 7, 3]
    ids = random_char_ids(np.random.default_rng(6), lengths, config.max_characters_per_token, max_bytes)

    layers, mask = elmo_jax.embed(params, ids)
    layers, mask = np.asarray(layers), np.asarray(mask)
    B, T = ids.shape[:2]
    L = config.n_layers + 1
    assert layers.shape == (B, L, T, 2 * config.projection_dim)
    np.testing.assert_array_equal(mask, np.arange(T)[None, :] < np.array(lengths)[:, None])

    clipped = {"cell": 0, "proj": 0}
    for b, n in enumerate(lengths):
        expected, n_clipped = np_bilm_sentence(weights, config, ids[b, :n])  # (L, n, 2P)
        np.testing.assert_allclose(layers[b, :, :n], expected, atol=ATOL, rtol=0, err_msg=f"sentence {b}")
        assert np.all(layers[b, :, n:] == 0.0), f"sentence {b}: padding must be exact zeros"
        clipped = {k: clipped[k] + n_clipped[k] for k in clipped}
    if config.cell_clip is not None:
        assert clipped["cell"] > 0 and clipped["proj"] > 0, f"test setup should hit both clips, {clipped}"


# ----------------------------------------------------------------------------- layer-normalised mix


def test_layer_norm_scalar_mix_matches_numpy():
    """One mean and one variance per layer over all unmasked (B, T, D) elements (not per token);
    padding values must not enter the statistics; the output is zero at padding."""
    rng = np.random.default_rng(7)
    B, L, T, D = 3, 3, 6, 5
    lengths = np.array([6, 2, 4])
    mask = np.arange(T)[None, :] < lengths[:, None]
    layers = rng.normal(0, 1, (B, L, T, D)) * np.array([1.0, 3.0, 0.5])[None, :, None, None] + 2.0
    layers[~np.broadcast_to(mask[:, None], (B, L, T))] = 100.0  # garbage at padding must be ignored
    s, gamma = np.array([0.3, -1.0, 0.8]), 1.7

    got = elmo_jax.scalar_mix(jnp.asarray(layers, jnp.float32), jnp.asarray(s, jnp.float32),
                              jnp.asarray(gamma, jnp.float32), jnp.asarray(mask), layer_norm=True)
    expected = np_scalar_mix_layer_norm(layers, s, gamma, mask)
    np.testing.assert_allclose(np.asarray(got), expected, atol=ATOL, rtol=0)
    assert np.all(np.asarray(got)[~mask] == 0.0)
