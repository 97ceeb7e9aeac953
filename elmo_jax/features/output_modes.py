"""What each sentence's vectors become: the output modes of `embed_sentences`, `embed_file` (their
`layers` argument, embed_file's --layers) and the service's requests (`serving`), one object each.

    mode           a batch on the device           a sentence of n tokens   what it is
    all            (B, L+1, T, 2P)                 (L+1, n, 2P)              every layer
    top            (B, T, 2P)                      (n, 2P)                   the last LSTM layer
    average        (B, T, 2P)                      (n, 2P)                   the mean of the L+1 layers
    mix            (B, T, 2P)                      (n, 2P)                   gamma * sum_j softmax(s)_j * layer_j
    sentence_mean  (B, 2P), float32 token sums     (2P,)                     the mean over its tokens of that mix
    j (0..L)       (B, T, 2P)                      (n, 2P)                   layer j itself (an index mode)

The named modes are embed_file's --layers choices (`NAMES`); a layer index is an int (`layers=2`), for
`embed_sentences` and the service (embed_file's --layers keeps its names: an index there would change
the flag's values and help).

A mode owns everything that depends on it: the reduction of the layers on the device (`reduce`, inside
the batch program; `reduce_packed` for rows that hold several sentences, `packing`), what a fetched batch
row holds for one piece of a sentence (`piece`, `packed_piece`; the sums for sentence_mean) and its shape
(`shape`), how the pieces of a split sentence are joined into its vectors
(`sentence`: the token axis of a layer mode; for sentence_mean the sums added up and divided by the
sentence's token count, `pooled`), the vectors of a sentence of no tokens (`empty`), its dtypes
(`dtype`, what the device returns: `batch_dtype`) and which flags go with it (`takes_mix`). A caller
that keeps every layer of a sentence and picks its mode afterwards (the service: one batch serves
requests of every mode) asks `from_layers`: the same reduction, run by NumPy on the host, then
`sentence`. `output_mode` checks the choices (errors name the flags) and returns the mode. Callers
(batch_runner, sentences, file_output, file_embedding, the embed_file command's flags, the service's
requests) ask the mode; none of them tests its name.

A module of its own rather than a part of `batch_runner`: the spool's reader (`file_output`) and the
command's flags need the modes without the device code. JAX is imported where the reduction is traced
(a reduction of NumPy arrays runs in NumPy), so importing this module costs NumPy alone (the command's
`--help` lists the modes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

# The flag help texts of embed_file, written here, where the modes are.
LAYERS_HELP = (
    "all: (L+1, n, 2P) per sentence; top, average, mix: (n, 2P); sentence_mean: (2P,), the mean over tokens of the mix."
)
MIX_SCALARS_HELP = (
    "--layers=mix or sentence_mean: the L+1 mix scalars s_j (softmax-normalised), e.g. a trained ScalarMix's; "
    "default all 0 (the average)."
)
GAMMA_HELP = "--layers=mix or sentence_mean: the scale gamma."


@dataclasses.dataclass(frozen=True)
class OutputMode:
    """One output mode for one biLM (see the module doc); subclasses are the modes.

    Attributes:
      n_layers: L+1, the biLM's output layers.
      dim: 2P, the width of a layer's vectors.
      mix: (L+1,) layer weights gamma * softmax(s) (all modes carry them; those that `takes_mix` use them);
        an index mode's are one-hot at its layer, which its reduction takes.
      float16: sentence vectors in float16 instead of float32.
    """

    n_layers: int
    dim: int
    mix: tuple[float, ...]
    float16: bool = False

    name: ClassVar[str]
    takes_mix: ClassVar[bool] = False  # --mix_scalars and --gamma go with it
    token_axis: ClassVar[int] = 0  # of a sentence's vectors (a sentence_mean piece has none)

    @property
    def dtype(self) -> type:
        """A sentence's vectors' dtype."""
        return np.float16 if self.float16 else np.float32

    @property
    def batch_dtype(self) -> type:
        """What the device returns (and the spool keeps): the sentence dtype, unless the mode pools."""
        return self.dtype

    @staticmethod
    def reduce(layers, mix, dtype: str):
        """(B, L+1, T, 2P) layers with zeros at padding, (L+1,) mix weights -> a batch's output (traced
        inside the batch program; run by NumPy for NumPy arrays, `from_layers`; `dtype` is the name of
        `batch_dtype`)."""
        raise NotImplementedError

    @classmethod
    def reduce_packed(cls, layers, segments, mix, dtype: str):
        """`reduce` for rows of several sentences (`packing`): layers (B, L+1, T2, 2P) with the sentences'
        boundaries in place, segments int32 (B, T2) (k at the tokens of a row's k-th sentence, -1
        elsewhere). The token modes reduce each position on its own, so `packed_piece` cuts a
        sentence's tokens out of the same result."""
        return cls.reduce(layers, mix, dtype)

    def shape(self, n_tokens: int) -> tuple[int, ...]:
        """The shape of the vectors of `n_tokens` tokens: a sentence's, and a piece's of a split sentence
        (`piece`; sentence_mean's pieces are (2P,) sums whatever their count). A batch's is in the module doc."""
        return (n_tokens, self.dim)

    def piece(self, result: np.ndarray, row: int, n_tokens: int) -> np.ndarray:
        """One piece's part of a fetched batch result: its `n_tokens` real tokens in batch row `row`."""
        return result[row, :n_tokens]

    def packed_piece(self, result: np.ndarray, place: tuple[int, int, int], n_tokens: int) -> np.ndarray:
        """`piece` of a `reduce_packed` result: the piece at `place` (row, position of its first token, k)."""
        row, start, _ = place
        index = (row,) + (slice(None),) * self.token_axis + (slice(start, start + n_tokens),)
        return result[index]

    def sentence(self, pieces: Sequence[np.ndarray], n_tokens: int) -> np.ndarray:
        """A sentence's vectors from its pieces in order (one piece unless it was split), a new array."""
        return np.concatenate(pieces, axis=self.token_axis).astype(self.dtype, copy=False)

    def empty(self) -> np.ndarray:
        """The vectors of a sentence of no tokens (a blank line)."""
        return np.zeros(self.shape(0), self.dtype)

    def from_layers(self, layers: np.ndarray) -> np.ndarray:
        """A sentence's vectors from its float32 (L+1, n, 2P) layers (the "all" mode's vectors), on the
        host: the mode's reduction of a batch of that one row, run by NumPy, then `piece` and `sentence`,
        so they are what a batch reduced on the device gives, up to the order of float32 sums."""
        n_tokens = layers.shape[1]
        if not n_tokens:
            return self.empty()
        batch = np.asarray(layers, np.float32)[None]
        result = self.reduce(batch, np.asarray(self.mix, np.float32), np.dtype(self.batch_dtype).name)
        return self.sentence([self.piece(result, 0, n_tokens)], n_tokens)


class AllLayers(OutputMode):
    name = "all"
    token_axis = 1

    @staticmethod
    def reduce(layers, mix, dtype: str):
        return layers.astype(dtype)

    def shape(self, n_tokens: int) -> tuple[int, ...]:
        return (self.n_layers, n_tokens, self.dim)

    def piece(self, result: np.ndarray, row: int, n_tokens: int) -> np.ndarray:
        return result[row, :, :n_tokens]


class TopLayer(OutputMode):
    name = "top"

    @staticmethod
    def reduce(layers, mix, dtype: str):
        return layers[:, -1].astype(dtype)


class Average(OutputMode):
    name = "average"

    @staticmethod
    def reduce(layers, mix, dtype: str):
        return _numpy(layers).mean(layers, axis=1).astype(dtype)


class Mix(OutputMode):
    name = "mix"
    takes_mix = True

    @staticmethod
    def reduce(layers, mix, dtype: str):
        return _mixed(layers, mix).astype(dtype)


class SentenceMean(OutputMode):
    name = "sentence_mean"
    takes_mix = True

    @property
    def batch_dtype(self) -> type:
        return np.float32  # token sums; the host divides by the token count

    @staticmethod
    def reduce(layers, mix, dtype: str):
        return _numpy(layers).sum(_mixed(layers, mix), axis=1).astype(dtype)  # padding is exactly zero

    @classmethod
    def reduce_packed(cls, layers, segments, mix, dtype: str):
        """(B, K, 2P) token sums of each row's K = T2 // 3 possible sentences (a sentence takes at least
        three steps), zeros where a row has fewer."""
        import jax
        import jax.numpy as jnp

        B, T2 = segments.shape
        K = T2 // 3
        mixed = _mixed(layers, mix)  # (B, T2, 2P)
        ids = jnp.where(segments >= 0, segments + K * jnp.arange(B)[:, None], B * K)  # elsewhere: dropped
        sums = jax.ops.segment_sum(mixed.reshape(B * T2, -1), ids.reshape(-1), num_segments=B * K)
        return sums.reshape(B, K, -1).astype(dtype)

    def shape(self, n_tokens: int) -> tuple[int, ...]:
        return (self.dim,)

    def piece(self, result: np.ndarray, row: int, n_tokens: int) -> np.ndarray:
        return result[row]

    def packed_piece(self, result: np.ndarray, place: tuple[int, int, int], n_tokens: int) -> np.ndarray:
        row, _, k = place
        return result[row, k]

    def sentence(self, pieces: Sequence[np.ndarray], n_tokens: int) -> np.ndarray:
        """The sums of the pieces (float64) divided by the sentence's token count."""
        return pooled(sum(np.asarray(p, np.float64) for p in pieces), n_tokens, self.dtype)


class LayerIndex(OutputMode):
    """Layer j of the L+1 itself (`output_mode` of the int j): its `mix` is one-hot at j, and the
    reduction takes that layer, no arithmetic, so one program serves every index."""

    name = "index"

    @property
    def index(self) -> int:
        return int(np.argmax(self.mix))

    @staticmethod
    def reduce(layers, mix, dtype: str):
        xp = _numpy(layers)
        return xp.take(layers, xp.argmax(mix), axis=1).astype(dtype)


def pooled(sums: np.ndarray, n_tokens: int, dtype) -> np.ndarray:
    """`sentence_mean`: token sums divided by the token count (zeros for an empty sentence)."""
    return (sums / max(n_tokens, 1)).astype(dtype)


def _numpy(layers):
    """The array module of `layers`: NumPy for a host array (`OutputMode.from_layers`), else jax.numpy
    (traced in the batch program; imported here, so that importing this module costs NumPy alone)."""
    if isinstance(layers, np.ndarray):
        return np
    import jax.numpy as jnp

    return jnp


def _mixed(layers, mix):
    """gamma * sum_j softmax(s)_j * layer_j: (B, L+1, T, D) -> (B, T, D), in float32."""
    if isinstance(layers, np.ndarray):
        return np.einsum("l,bltd->btd", np.asarray(mix, np.float32), layers)
    import jax
    import jax.numpy as jnp

    return jnp.einsum("l,bltd->btd", mix, layers, precision=jax.lax.Precision.HIGHEST)


NAMED = (AllLayers, TopLayer, Average, Mix, SentenceMean)
NAMES = tuple(mode.name for mode in NAMED)  # "all", "top", "average", "mix", "sentence_mean": --layers
MODES: dict[str, type[OutputMode]] = {mode.name: mode for mode in (*NAMED, LayerIndex)}  # the programs' keys


def output_mode(
    layers: str | int,
    n_layers: int,
    dim: int,
    mix_scalars: Sequence[float] | None = None,
    gamma: float = 1.0,
    float16: bool = False,
) -> OutputMode:
    """Checks the --layers / --mix_scalars / --gamma choices (errors name the flags) and returns the mode.

    `layers` is one of `NAMES`, or an int j in 0..n_layers-1: layer j itself (`LayerIndex`). Without
    `mix_scalars` the mix is the plain average of the `n_layers` layers (s = 0), so `sentence_mean` is
    then the mean over tokens of `average`'s vectors.
    """
    index = isinstance(layers, (int, np.integer)) and not isinstance(layers, bool)
    if index and not 0 <= layers < n_layers:
        raise ValueError(f"--layers={layers}: a layer index of this model is 0 to {n_layers - 1}")
    if not index and layers not in NAMES:
        raise ValueError(f"--layers must be one of {NAMES} or a layer index 0 to {n_layers - 1}, found {layers!r}")
    mode = LayerIndex if index else MODES[layers]
    if mix_scalars is not None and not mode.takes_mix:
        mixed = " or ".join(f"--layers={name}" for name, m in MODES.items() if m.takes_mix)
        raise ValueError(f"--mix_scalars goes with {mixed}")
    scalars = (0.0,) * n_layers if mix_scalars is None else tuple(mix_scalars)
    if len(scalars) != n_layers:
        raise ValueError(f"--mix_scalars: expected {n_layers} values (one per layer), found {len(scalars)}")
    s = np.asarray(scalars, np.float64)
    if not np.all(np.isfinite(s)) or not np.isfinite(gamma):
        raise ValueError("--mix_scalars and --gamma must be finite numbers")
    weights = np.eye(n_layers)[layers] if index else mix_weights(s, gamma)
    return mode(n_layers, dim, tuple(float(w) for w in weights), bool(float16))


def mix_weights(scalars: Sequence[float], gamma: float) -> np.ndarray:
    """float32 (L+1,) weights gamma * softmax(s) of the scalar mix, the softmax in float64."""
    s = np.asarray(scalars, np.float64)
    weights = np.exp(s - s.max())
    return (gamma * weights / weights.sum()).astype(np.float32)


def efml_output_layer(output_layer: int, n_layers: int) -> str | int:
    """The output mode of ELMoForManyLangs' `Embedder.sents2elmo(sents, output_layer)`: -1 the average of
    the `n_layers` layers ("average"), -2 all of them ("all"), 0 .. n_layers - 1 that layer (0 the token
    layer, then the LSTM layers). ValueError naming the argument otherwise."""
    if isinstance(output_layer, bool) or not isinstance(output_layer, (int, np.integer)):
        raise ValueError(f"output_layer must be an integer, found {output_layer!r}")
    if output_layer == -1:
        return Average.name
    if output_layer == -2:
        return AllLayers.name
    if not 0 <= output_layer < n_layers:
        raise ValueError(
            f"output_layer must be -2 (all layers), -1 (their average) or a layer 0..{n_layers - 1}, "
            f"found {output_layer}"
        )
    return int(output_layer)
