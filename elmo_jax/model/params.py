"""The biLM parameter pytree: weights named as in the published HDF5 files, plus the static config.

`BiLMParams.weights` is a plain nested dict whose paths are the weight file's dataset paths
(`"CNN/W_cnn_0"` is `weights["CNN"]["W_cnn_0"]`). `BiLMParams.config` is pytree metadata, not a leaf,
so `jax.jit(f)(params, ...)` specialises on it and `jax.tree.map` never touches it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.model.config import BiLMConfig

N_DIRECTIONS = 2  # RNN_0 forward, RNN_1 backward
OUTPUT_PROJECTION = "RNN_proj"  # `BiLMConfig.lstm_output_projection`'s weights


@flax.struct.dataclass
class BiLMParams:
    """Frozen biLM parameters.

    Attributes:
      weights: nested dict of float arrays; see `weight_shapes` for every path and shape.
      config: the static architecture (not a pytree leaf).
      vocabulary: the model's text -> ids (`vocabulary.TokenVocabulary`, not a pytree leaf), or None for
        UTF-8 bytes; read it through `vocabulary.token_vocabulary(params)`.
    """

    weights: dict[str, Any]
    config: BiLMConfig = flax.struct.field(pytree_node=False)
    vocabulary: Any = flax.struct.field(pytree_node=False, default=None)


def lstm_cell_path(direction: int, layer: int) -> str:
    """Weight-file group of one LSTM cell; direction 0 is forward, 1 backward."""
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def weight_shapes(config: BiLMConfig) -> dict[str, tuple[int, ...]]:
    """Every weight-file dataset path of this architecture and its shape, in file order."""
    E, P, H = config.char_embed_dim, config.projection_dim, config.lstm_dim
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (config.n_raw_characters, E)}
    if config.has_words:
        shapes["word_embed"] = (config.word_vocab_size, config.word_dim)
    for i, (width, num) in enumerate(config.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, width, E, num)
        shapes[f"CNN/b_cnn_{i}"] = (num,)
    F = config.n_filters
    for k in range(config.n_highway):
        for name in ("carry", "transform"):
            shapes[f"CNN_high_{k}/W_{name}"] = (F, F)
            shapes[f"CNN_high_{k}/b_{name}"] = (F,)
    if config.has_cnn_projection:
        shapes["CNN_proj/W_proj"] = (config.word_dim + F, P)  # rows: the word vector's, then the filters'
        shapes["CNN_proj/b_proj"] = (P,)
    for d in range(N_DIRECTIONS):
        for layer in range(config.n_layers):
            cell = lstm_cell_path(d, layer)
            shapes[f"{cell}/W_0"] = (P + config.state_dim, 4 * H)
            shapes[f"{cell}/B"] = (4 * H,)
            if config.has_lstm_projection:
                shapes[f"{cell}/W_P_0"] = (H, P)
    if config.lstm_output_projection:  # one map for both directions' outputs
        shapes[f"{OUTPUT_PROJECTION}/W_proj"] = (H, P)
        shapes[f"{OUTPUT_PROJECTION}/b_proj"] = (P,)
    return shapes


def count_parameters(config: BiLMConfig) -> int:
    """Number of biLM parameters (no softmax), e.g. 93,600,848 for the original model."""
    return sum(int(np.prod(s)) for s in weight_shapes(config).values())


def get_path(tree: dict[str, Any], path: str):
    """`tree["a"]["b"]` for path "a/b"."""
    for part in path.split("/"):
        tree = tree[part]
    return tree


def from_flat(flat: dict[str, Any]) -> dict[str, Any]:
    """{"a/b": x} -> {"a": {"b": x}}."""
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        *groups, leaf = path.split("/")
        node = tree
        for g in groups:
            node = node.setdefault(g, {})
        node[leaf] = value
    return tree


def iter_flat(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yields ("a/b", leaf) for every leaf of a nested dict."""
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else key
        if isinstance(value, dict):
            yield from iter_flat(value, path)
        else:
            yield path, value


def nonfinite_weight(weights: dict[str, Any]) -> str | None:
    """A description of the first weight holding NaN or Inf ("RNN_0/.../W_0: 12 of 16384 values are NaN
    or Inf, first at index (0, 3)"), or None when every value is finite. Concrete arrays only."""
    for path, array in iter_flat(weights):
        bad = ~np.isfinite(np.asarray(array))
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            return f"{path}: {int(bad.sum()):,} of {bad.size:,} values are NaN or Inf, first at index {first}"
    return None


def check_finite(weights: dict[str, Any], source: str) -> None:
    """Raises ValueError naming `source` and the array when a weight holds NaN or Inf (a diverged run or a
    damaged file would otherwise give NaN vectors without a word)."""
    problem = nonfinite_weight(weights)
    if problem is not None:
        raise ValueError(f"{source}: non-finite weights: {problem}; refusing to use a diverged or damaged model")


def init_params(config: BiLMConfig, key: jax.Array) -> BiLMParams:
    """Fresh parameters with bilm-tf's initialisers, for training from scratch.

    char_embed U(-1, 1); convolutions U(-0.05, 0.05) for relu, N(0, 1/(width*E)) for tanh, bias 0;
    highway weights N(0, 1/F) with carry bias -2 and transform bias 0; CNN projection N(0, 1/F), bias 0;
    LSTM kernels and projections Glorot-uniform (TF's default), gate biases 0.
    """
    shapes = weight_shapes(config)
    keys = dict(zip(shapes, jax.random.split(key, len(shapes))))
    flat = {path: _init_one(path, shape, keys[path], config) for path, shape in shapes.items()}
    return BiLMParams(weights=from_flat(flat), config=config)


def _init_one(path: str, shape: tuple[int, ...], key: jax.Array, config: BiLMConfig) -> jax.Array:
    name = path.rsplit("/", 1)[-1]
    # The barrier keeps a jitted (sharded) initialisation bit-identical to an eager one (see init_softmax).
    normal = lambda var: jnp.sqrt(var) * jax.lax.optimization_barrier(jax.random.normal(key, shape, jnp.float32))
    uniform = lambda lim: jax.random.uniform(key, shape, jnp.float32, -lim, lim)
    if name in ("char_embed", "word_embed"):
        return uniform(1.0)
    if name.startswith("W_cnn_"):
        width = shape[1]
        return uniform(0.05) if config.activation == "relu" else normal(1.0 / (width * config.char_embed_dim))
    if name in ("W_carry", "W_transform", "W_proj"):
        return normal(1.0 / shape[0])
    if name == "b_carry":
        return jnp.full(shape, -2.0, jnp.float32)
    if name in ("W_0", "W_P_0"):
        fan_in, fan_out = shape
        return uniform(float(np.sqrt(6.0 / (fan_in + fan_out))))
    return jnp.zeros(shape, jnp.float32)  # every bias but b_carry
