"""Random biLMs and inputs for the model tests: well-conditioned random weights that hit the clips,
random character ids of every length up to C, and a tiny architecture."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import elmo_jax
from tests.reference.elmo_equations import BOW, EOW, PAD


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
            i, j, f, o = (
                rng.normal(0.5, 0.5, shape[0] // 4),
                rng.normal(0.0, 1.5, shape[0] // 4),
                rng.normal(1.5, 0.5, shape[0] // 4),
                rng.normal(0.0, 1.0, shape[0] // 4),
            )
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


def tiny_bilm_config(**overrides):
    base = dict(
        char_embed_dim=4,
        filters=((1, 4), (2, 6), (3, 8)),
        n_highway=1,
        activation="relu",
        max_characters_per_token=50,
        lstm_dim=12,
        projection_dim=6,
        n_layers=2,
        cell_clip=3.0,
        proj_clip=1.0,
        use_skip_connections=True,
    )
    base.update(overrides)
    return elmo_jax.BiLMConfig(**base)
