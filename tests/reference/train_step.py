"""One bilm-tf training step, re-derived: the loss of both language models written from the ELMo
equations in jax.numpy (so that JAX's autodiff gives its gradient), and the update in NumPy float64 in
the order bilm-tf's `train` applies it: the gradient of `loss * unroll_steps`, `tf.clip_by_global_norm`
over every variable at once, then `tf.train.AdagradOptimizer` (accumulators from 1.0, no epsilon).

Written from docs/ELMO.md and TF's documented semantics, as plain code: the char CNN as a loop over
filter positions, the LSTM as a loop over time steps and layers, one sampled softmax per group of rows.
It shares no code with elmo_jax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tests.reference.sampled_softmax import np_log_q


def _cell(w, d, layer):
    return w[f"RNN_{d}"]["RNN"]["MultiRNNCell"][f"Cell{layer}"]["LSTMCell"]


def jnp_token_embedding(w, config, ids):
    """Shifted char ids (N, C) (0 = no character) -> token vectors (N, P)."""
    table = jnp.concatenate([jnp.zeros((1, config.char_embed_dim)), w["char_embed"]])
    chars = table[ids]  # (N, C, E)
    C = ids.shape[1]
    pooled = []
    for i, (width, _) in enumerate(config.filters):
        kernel = w["CNN"][f"W_cnn_{i}"][0]  # (width, E, F)
        starts = np.arange(C - width + 1)
        windows = chars[:, starts[:, None] + np.arange(width)[None, :]]  # (N, positions, width, E)
        conv = jnp.einsum("nqke,kef->nqf", windows, kernel)  # every position's window, then the max
        pooled.append(jnp.max(conv, axis=1) + w["CNN"][f"b_cnn_{i}"][None, :])
    x = jnp.concatenate(pooled, axis=-1)
    x = jax.nn.relu(x) if config.activation == "relu" else jnp.tanh(x)
    for k in range(config.n_highway):
        layer = w[f"CNN_high_{k}"]
        gate = jax.nn.sigmoid(x @ layer["W_carry"] + layer["b_carry"][None, :])
        x = gate * jax.nn.relu(x @ layer["W_transform"] + layer["b_transform"][None, :]) + (1.0 - gate) * x
    return x @ w["CNN_proj"]["W_proj"] + w["CNN_proj"]["b_proj"][None, :]


def jnp_lstm_step(cell, config, x, c, h):
    """[x; h] W + B -> gates i, j, f, o; forget bias +1; cell clip; projected, clipped output."""
    i, j, f, o = jnp.split(jnp.concatenate([x, h], axis=-1) @ cell["W_0"] + cell["B"][None, :], 4, axis=-1)
    c = jnp.clip(jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(j), -config.cell_clip, config.cell_clip)
    h = jnp.clip((jax.nn.sigmoid(o) * jnp.tanh(c)) @ cell["W_P_0"], -config.proj_clip, config.proj_clip)
    return c, h


def jnp_lm_outputs(w, config, batch, c0, h0):
    """Top-layer outputs (D, B, T, P) of both LMs, each reading its window left to right from the carried
    state (zeros where `carry` is false, and before positions where `reset` is true); masked positions
    keep the state and output zeros. No dropout."""
    D, B, T, C = batch["char_ids"].shape
    tokens = jnp_token_embedding(w, config, jnp.asarray(batch["char_ids"]).reshape(-1, C) + 1)
    tokens = tokens.reshape(D, B, T, -1)
    outputs = []
    for d in range(D):
        keep = jnp.asarray(batch["carry"][d])[:, None]
        state = [(c0[d, layer] * keep, h0[d, layer] * keep) for layer in range(config.n_layers)]
        steps = []
        for t in range(T):
            fresh = jnp.asarray(batch["reset"][d, :, t])[:, None]
            live = jnp.asarray(batch["mask"][d, :, t])[:, None]
            x = tokens[d, :, t]
            for layer in range(config.n_layers):
                c, h = (jnp.where(fresh, 0.0, s) for s in state[layer])
                c_new, h_new = jnp_lstm_step(_cell(w, d, layer), config, x, c, h)
                state[layer] = (jnp.where(live, c_new, state[layer][0]), jnp.where(live, h_new, state[layer][1]))
                x = h_new + x if layer > 0 and config.use_skip_connections else h_new
            steps.append(jnp.where(live, x, 0.0))
        outputs.append(jnp.stack(steps, axis=1))
    return jnp.stack(outputs)


def jnp_scaled_loss(params, config, batch, c0, h0, candidates, vocab_size, unroll_steps):
    """bilm-tf's differentiated loss: unroll_steps x the mean of the two directions' mean sampled-softmax
    cross-entropies, where rows of group k of direction d are scored against candidates[d][k] (TF's
    sampled_softmax_loss: logits minus log expected counts, accidental hits removed).

    Returns (scaled loss, the unscaled loss)."""
    outputs = jnp_lm_outputs(params["bilm"], config, batch, c0, h0)
    W, b = params["softmax"]["W"], params["softmax"]["b"]
    D, B, T, P = outputs.shape
    per_direction = []
    for d in range(D):
        groups = len(candidates[d])
        rows = B // groups
        total = 0.0
        for k, cand in enumerate(candidates[d]):
            S = len(cand)
            h = outputs[d, k * rows : (k + 1) * rows].reshape(-1, P)
            y = np.asarray(batch["targets"][d, k * rows : (k + 1) * rows]).reshape(-1)
            m = np.asarray(batch["mask"][d, k * rows : (k + 1) * rows]).reshape(-1)
            true = jnp.sum(h * W[y], axis=-1) + b[y] - np_log_q(y, vocab_size, S)
            sampled = h @ W[cand].T + (b[cand] - np_log_q(cand, vocab_size, S))[None, :]
            sampled = jnp.where(cand[None, :] == y[:, None], -jnp.inf, sampled)
            losses = jax.nn.logsumexp(jnp.concatenate([true[:, None], sampled], axis=1), axis=1) - true
            total = total + jnp.sum(jnp.where(m, losses, 0.0))
        per_direction.append(total / np.sum(batch["mask"][d]))
    loss = (per_direction[0] + per_direction[1]) / 2.0
    return loss * unroll_steps, loss


def np_tf_update(params, grads, learning_rate, clip_norm, initial_accumulator):
    """TF's clip_by_global_norm then Adagrad, in float64: g <- g * clip / max(||g||, clip) over all
    variables; accumulator <- initial + g^2; variable <- variable - lr * g / sqrt(accumulator).

    Returns (new params, accumulators, the global norm before clipping)."""
    grads = jax.tree.map(lambda g: np.asarray(g, np.float64), grads)
    norm = float(np.sqrt(sum(np.sum(g * g) for g in jax.tree.leaves(grads))))
    scale = clip_norm / max(norm, clip_norm)
    clipped = jax.tree.map(lambda g: g * scale, grads)
    accumulators = jax.tree.map(lambda g: initial_accumulator + g * g, clipped)
    new = jax.tree.map(
        lambda p, g, a: np.asarray(p, np.float64) - learning_rate * g / np.sqrt(a), params, clipped, accumulators
    )
    return new, accumulators, norm
