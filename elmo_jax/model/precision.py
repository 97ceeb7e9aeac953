"""Matrix products at the precision a caller asks for.

float32 results must match AllenNLP on every backend, but GPUs and TPUs default to reduced-precision
passes (TF32, bf16x1) for float32 matmuls. So float32 compute asks for `Precision.HIGHEST` explicitly;
bfloat16 compute casts the operands and accumulates in float32.

`ComputeOptions` bundles the static settings of how the biLM computes (matmul dtype, LSTM scan unroll,
the char CNN's position bound), so they travel through the model as one hashable value.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

COMPUTE_DTYPES = ("float32", "bfloat16")


def check_compute_dtype(compute_dtype) -> jnp.dtype:
    """Normalises a compute dtype name or dtype; only float32 and bfloat16 are supported."""
    dtype = jnp.dtype(compute_dtype)
    if dtype.name not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}, found {dtype.name}")
    return dtype


@dataclasses.dataclass(frozen=True)
class ComputeOptions:
    """How the biLM computes; static (hashable), so a jitted function specialises on it.

    Attributes:
      dtype: "float32" (full precision on every backend) or "bfloat16" (bfloat16 operands, float32
        accumulation; states and outputs stay float32).
      unroll: `lax.scan` unroll factor of the LSTM time loop (speed only: results differ by float32
        rounding at most).
      content_positions: a bound S on the character positions holding anything but PAD in every real
        token (`char_cnn.content_bucket`); the char CNN then computes S start positions instead of C.
        None computes all C (needed when the ids are not known at trace time).
      token_shards: how many devices the tokens are split over (the data axis of a training mesh). The
        char CNN sizes its convolution's token blocks, and the LSTM chooses where a TPU computes its
        input product (`recurrence.IN_LOOP_MAX_ROWS`), by one device's rows (speed only: results
        differ by float32 rounding at most).
      distinct_tokens: None, or slots per device for its distinct tokens (`distinct_tokens.
        distinct_capacity`, set per batch): training's char CNN then runs once per distinct token of
        each device's share (`distinct_tokens.distinct_token_embedding`; results differ by float32
        rounding at most).
    """

    dtype: str = "float32"
    unroll: int = 1
    content_positions: int | None = None
    token_shards: int = 1
    distinct_tokens: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", check_compute_dtype(self.dtype).name)
        for name in ("unroll", "token_shards"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, found {value!r}")
        for name in ("content_positions", "distinct_tokens"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))

    def with_positions(self, content_positions: int | None, distinct_tokens: int | None = None) -> ComputeOptions:
        """The same options with another char-CNN position bound and distinct-token slots (both change
        from batch to batch)."""
        return dataclasses.replace(self, content_positions=content_positions, distinct_tokens=distinct_tokens)


def matmul(x: jax.Array, w: jax.Array, compute_dtype=jnp.float32) -> jax.Array:
    """x (..., I) @ w in `compute_dtype`, accumulated and returned in float32.

    With a 2-D w, the leading axes of x are flattened into one row axis first. The product is the same,
    but its autodiff is not: for a 3-D x the weight gradient comes out as (O, I) and XLA:CPU transposes
    the whole (rows, O) output gradient to get it, the largest single cost of the small model's train step
    (the char CNN's (N*S, O) gradient; measured: bench/RESULTS.md, "The train step, issue #8"); from a 2-D
    x it is one (I, rows) x (rows, O) product.
    """
    if w.ndim == 2 and x.ndim > 2:
        y = matmul(x.reshape(-1, x.shape[-1]), w, compute_dtype)
        return y.reshape(*x.shape[:-1], w.shape[-1])
    if jnp.dtype(compute_dtype) == jnp.float32:
        return jnp.matmul(x, w, precision=lax.Precision.HIGHEST)
    return jnp.matmul(x.astype(compute_dtype), w.astype(compute_dtype), preferred_element_type=jnp.float32)


def einsum(spec: str, x: jax.Array, w: jax.Array, compute_dtype=jnp.float32) -> jax.Array:
    """`jnp.einsum(spec, x, w)` with the same precision rules as `matmul`."""
    if jnp.dtype(compute_dtype) == jnp.float32:
        return jnp.einsum(spec, x, w, precision=lax.Precision.HIGHEST)
    return jnp.einsum(spec, x.astype(compute_dtype), w.astype(compute_dtype), preferred_element_type=jnp.float32)


def summing_columns(weights: jax.Array, dtype) -> jax.Array:
    """weights (...,) as the first of 8 columns (..., 8), the others zero: the right operand of a product
    that sums rows on a TPU's matrix unit (`einsum("r...,rk->k...", x, summing_columns(w, ...))[0]` is
    w @ x). The TPU compiler estimates a reduction over many rows at 2-3x such a product's time, and it
    turns a product with one column (or with a `jnp.ones` operand) back into that reduction
    (bench/RESULTS_tpu_compile.md, "Distinct tokens")."""
    return jnp.zeros((*weights.shape, 8), dtype).at[..., 0].set(weights.astype(dtype))


def summed(x: jax.Array, axis: int) -> jax.Array:
    """`jnp.sum(x, axis)` of a float32 matrix x (R, C): (C,) for axis 0, (R,) for axis 1. On a TPU it is
    `sum_by_product` (a reduction over the many columns or rows of the sampled softmax's (N, S) logits
    was estimated at ~3x that product's time: bench/RESULTS_tpu_compile.md, "What the goal needs");
    elsewhere `jnp.sum`. Its gradient is the broadcast of the sum's in either form: the product's own
    transpose would be another product, writing every element of x's gradient from the matrix unit."""
    return _summed(x, axis, x.shape[axis])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _summed(x: jax.Array, axis: int, length: int) -> jax.Array:
    return lax.platform_dependent(
        x, tpu=functools.partial(sum_by_product, axis=axis), default=functools.partial(jnp.sum, axis=axis)
    )


def _summed_fwd(x, axis, length):
    return _summed(x, axis, length), None


def _summed_bwd(axis, length, _, g):
    shape = list(g.shape)
    shape.insert(axis, length)
    return (jnp.broadcast_to(jnp.expand_dims(g, axis), shape),)


_summed.defvjp(_summed_fwd, _summed_bwd)


def sum_by_product(x: jax.Array, axis: int) -> jax.Array:
    """x (R, C) summed along `axis` on the matrix unit: a product with `summing_columns` of ones, float32
    at HIGHEST (the same sum up to the order of float32 additions)."""
    ones = summing_columns(jnp.ones(x.shape[axis], jnp.float32), jnp.float32)
    spec = "rc,rk->kc" if axis == 0 else "cr,rk->ck"
    return jnp.take(einsum(spec, x, ones, jnp.float32), 0, axis=axis)


def linear(x: jax.Array, w: jax.Array, b: jax.Array | None = None, compute_dtype=jnp.float32) -> jax.Array:
    """x (..., I) @ w (I, O) + b (O,), the bias broadcast explicitly (rank promotion stays strict)."""
    y = matmul(x, w, compute_dtype)
    return y if b is None else y + broadcast_trailing(b, y.ndim)


def broadcast_trailing(v: jax.Array, ndim: int) -> jax.Array:
    """v (..., N) reshaped to rank `ndim` with leading 1s, for explicit broadcasting against (..., N)."""
    return jnp.reshape(v, (1,) * (ndim - v.ndim) + v.shape)
