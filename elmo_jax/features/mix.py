"""The task-specific ELMo combination: `gamma * sum_j softmax(s)_j * layer_j`.

Pure functions for the arithmetic, and Flax (linen) modules a task model includes: `ScalarMix` learns
one mix; `ElmoRepresentations` learns several independent mixes of one biLM pass (the paper used two,
at the input and the output of the task RNN). Layer normalisation, when on, uses one mean and one
variance over all unmasked elements of each layer's (B, T, D) tensor, as AllenNLP does. To reproduce
AllenNLP exactly with layer normalisation, mix the layers returned by `embed(..., keep_boundaries=True)`
(AllenNLP's statistics include `<S>`/`</S>`) and then call `remove_boundaries`.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

# AllenNLP's "tiny value" for float32 variance, so that a constant layer does not divide by zero.
LAYER_NORM_EPSILON = 1e-13


def masked_layer_norm(layer: jax.Array, mask: jax.Array) -> jax.Array:
    """Normalises a (B, T, D) tensor by the mean and variance of all its unmasked elements.

    mask: bool (B, T). Statistics are scalars over B*T'*D elements (T' the true tokens), not per token.
    """
    m = mask[..., None].astype(layer.dtype)
    count = jnp.maximum(jnp.sum(m) * layer.shape[-1], 1.0)  # an all-padding batch: zeros, not 0/0
    mean = jnp.sum(layer * m) / count
    variance = jnp.sum(((layer - mean) * m) ** 2) / count
    return (layer - mean) / jnp.sqrt(variance + LAYER_NORM_EPSILON)


def mix_weights(scalars: jax.Array) -> jax.Array:
    """The layer weights w = softmax(s) (L,) of unnormalised scalars s (L,); an entry of s at -inf
    gives its layer weight exactly 0, so a fixed choice of layers (one layer, the average) is a mix too."""
    return jax.nn.softmax(scalars)


def scalar_mix(
    layers: jax.Array, scalars: jax.Array, gamma: jax.Array, mask: jax.Array | None = None, *, layer_norm: bool = False
) -> jax.Array:
    """Mixes biLM layers.

    Args:
      layers: float (B, L, T, D), as returned by `embed`.
      scalars: (L,) unnormalised layer weights s.
      gamma: scalar (or (1,)) scale.
      mask: bool (B, T); required for layer_norm. Where given, the result is zero at padding.
      layer_norm: normalise each layer first.

    Returns:
      float32 (B, T, D).
    """
    if layers.ndim != 4 or scalars.shape != (layers.shape[1],):
        raise ValueError(
            f"scalar_mix: expected layers (B, L, T, D) and scalars (L,), found {layers.shape} and {scalars.shape}"
        )
    if layer_norm:
        if mask is None:
            raise ValueError("scalar_mix: layer_norm=True needs the token mask")
        layers = jnp.stack([masked_layer_norm(layers[:, j], mask) for j in range(layers.shape[1])], axis=1)
    weights = mix_weights(scalars)
    mixed = jnp.reshape(gamma, ()) * jnp.einsum("l,bltd->btd", weights, layers, precision=jax.lax.Precision.HIGHEST)
    if mask is not None:
        mixed = jnp.where(mask[..., None], mixed, 0.0)
    return mixed


def mix_l2_penalty(scalars: jax.Array, coef: float) -> jax.Array:
    """coef * ||s||^2, the regulariser on the layer weights (the paper's lambda; 0.001 in AllenNLP's tutorial)."""
    return coef * jnp.sum(scalars**2)


class ScalarMix(nn.Module):
    """One learned mix of the biLM layers, with optional layer norm, dropout and L2 on s.

    Attributes:
      num_layers: L (3 for the published models).
      layer_norm: normalise each layer over its unmasked elements first.
      dropout: dropout rate on the mixed output (needs a "dropout" rng when not deterministic).
      l2_coef: if > 0, `coef * ||s||^2` is sown into the "losses" collection as "scalar_mix_l2";
        apply with `mutable=["losses"]` and add it to the task loss.
    """

    num_layers: int = 3
    layer_norm: bool = False
    dropout: float = 0.0
    l2_coef: float = 0.0

    @nn.compact
    def __call__(self, layers: jax.Array, mask: jax.Array, *, deterministic: bool = True) -> jax.Array:
        """layers (B, L, T, D), mask bool (B, T) -> (B, T, D)."""
        scalars = self.param("scalar_parameters", nn.initializers.zeros, (self.num_layers,), jnp.float32)
        gamma = self.param("gamma", nn.initializers.ones, (), jnp.float32)
        if self.l2_coef > 0:
            self.sow("losses", "scalar_mix_l2", mix_l2_penalty(scalars, self.l2_coef))
        mixed = scalar_mix(layers, scalars, gamma, mask, layer_norm=self.layer_norm)
        return nn.Dropout(rate=self.dropout)(mixed, deterministic=deterministic)


class ElmoRepresentations(nn.Module):
    """Several independent `ScalarMix`es of one biLM pass.

    Attributes:
      num_output_representations: how many mixes (e.g. 2: task RNN input and output).
      num_layers, layer_norm, dropout, l2_coef: as for `ScalarMix`, shared by all mixes.
    """

    num_output_representations: int = 1
    num_layers: int = 3
    layer_norm: bool = False
    dropout: float = 0.0
    l2_coef: float = 0.0

    @nn.compact
    def __call__(self, layers: jax.Array, mask: jax.Array, *, deterministic: bool = True) -> Sequence[jax.Array]:
        """layers (B, L, T, D), mask (B, T) -> a list of (B, T, D), one per mix."""
        return [
            ScalarMix(self.num_layers, self.layer_norm, self.dropout, self.l2_coef, name=f"scalar_mix_{i}")(
                layers, mask, deterministic=deterministic
            )
            for i in range(self.num_output_representations)
        ]
