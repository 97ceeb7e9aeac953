"""NumPy re-derivations of the ELMo equations (docs/ELMO.md), in float64 with plain loops over tokens,
time steps and filter positions. They share no code with elmo_jax: tests compare elmo_jax to them.

Weights are the nested weight-file dicts (`BiLMParams.weights` as NumPy, `to_numpy`); character ids
are shifted (0 = no token) unless a function says raw.
"""

from __future__ import annotations

import numpy as np

# Raw character ids of the specials (before the +1 shift that makes 0 mean "no token").
BOS, EOS, BOW, EOW, PAD = 256, 257, 258, 259, 260


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
        for i, (width, _) in enumerate(config.filters):
            kernel = w["CNN"][f"W_cnn_{i}"][0]  # (width, E, n_filters)
            positions = [
                np.einsum("ke,ken->n", chars[p : p + width], kernel) for p in range(len(token_ids) - width + 1)
            ]
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
                c, h = np_lstm_step(
                    cell["W_0"], cell["B"], cell.get("W_P_0"), x, c, h, config.cell_clip, config.proj_clip
                )
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


def np_lm_outputs(w, config, char_ids, mask, c0, h0, carry, rate=0.0, keep=None):
    """Top-layer outputs (D, B, T, P) and the final state, one direction, row, step and layer at a time.

    char_ids raw (D, B, T, C); mask (D, B, T); c0 (D, L, B, H), h0 (D, L, B, P); carry (D, B).
    keep: None, or L + 1 boolean masks (T, D, B, P): each layer's input, then the top output.
    """
    D, B, T, C = char_ids.shape
    P, L = config.projection_dim, config.n_layers
    tokens = np_token_embedding(w, config, char_ids.reshape(-1, C) + 1).reshape(D, B, T, P)
    scale = lambda x, k, d, b, t: x if keep is None else x * keep[k][t, d, b] / (1.0 - rate)
    out = np.zeros((D, B, T, P))
    c_final, h_final = np.zeros(c0.shape), np.zeros(h0.shape)
    for d in range(D):
        for b in range(B):
            state = [
                (c0[d, l, b], h0[d, l, b]) if carry[d, b] else (np.zeros(c0.shape[-1]), np.zeros(P)) for l in range(L)
            ]
            for t in range(T):
                if not mask[d, b, t]:
                    continue  # state held, output zero
                x = tokens[d, b, t]
                for l in range(L):
                    x_in = scale(x, l, d, b, t)
                    cell = w[f"RNN_{d}"]["RNN"]["MultiRNNCell"][f"Cell{l}"]["LSTMCell"]
                    c, h = np_lstm_step(
                        cell["W_0"], cell["B"], cell.get("W_P_0"), x_in, *state[l], config.cell_clip, config.proj_clip
                    )
                    state[l] = (c, h)
                    x = h + x_in if (l > 0 and config.use_skip_connections) else h
                out[d, b, t] = scale(x, L, d, b, t)
            for l in range(L):
                c_final[d, l, b], h_final[d, l, b] = state[l]
    return out, c_final, h_final


def np_scalar_mix(layers, s, gamma):
    """gamma * sum_j softmax(s)_j * layers[j], float64; layers (L, ...)."""
    w = np.exp(np.asarray(s, np.float64) - np.max(s))
    w = w / w.sum()
    return gamma * np.tensordot(w, np.asarray(layers, np.float64), axes=1)


def np_sentence_mean(layers, s, gamma):
    """The pooled sentence vector: the mean over the n real tokens of the scalar mix; layers (L, n, D) -> (D,).
    A sentence of no tokens pools to zeros."""
    mixed = np_scalar_mix(layers, s, gamma)  # (n, D)
    return mixed.mean(axis=0) if mixed.shape[0] else np.zeros(mixed.shape[1:])
