"""The LSTM's time loop, with a backward pass written out to keep a TPU's memory traffic low.

`recurrence` runs one layer of both directions over time. On a TPU each step computes its own
input-to-gate product inside the loop (`input_gates`): the loop's kernels stay in on-chip memory, so this moves
less than one product over all steps before the loop, whose (D, T, B, 4H) float32 result is written to
HBM and read back step by step. Elsewhere that one product is kept: on a CPU it is the faster of the
two. Its gradient is the autodiff gradient of the same computation, organised differently. Autodiff of a
`lax.scan` saves every intermediate of every step (the four activations, the cell, its tanh, masks: ~8
arrays of (D, B, H) per step), zero-fills a stacked buffer for each, and accumulates the gradients of
the recurrent and projection kernels inside the reverse loop, reading and writing a kernel-sized
accumulator at every step: a large share of the `bilm_large` step's HBM traffic on a TPU (measured:
bench/RESULTS_tpu_compile.md, "The LSTM time loop"). Here:

- the forward loop saves only the gate pre-activations z (D, B, 4H), the cell and output state it read
  (after resets) and the projection before its clip, per step;
- the reverse loop recomputes the activations from z (elementwise, the same function as the forward,
  differentiated by `jax.vjp`), carries only the state's gradients (and the bias's, except on a TPU:
  there the bias's is one sum of the stored dz after the loop), and emits each step's dz and projection
  gradient (on a TPU dz gate by gate, each gate stored into its columns of the stack: `_reverse_loop`);
- the kernel's gradient (input and recurrent halves together) and the inputs' are then one product
  each over all steps and rows (T·B rows): dz is read twice, instead of once for each of the input
  kernel, the recurrent kernel, the inputs and the bias. The stacks that only these products read
  (dz, h_prev, the projection's input and gradient) are stored in the matmul dtype, to which the
  products cast them anyway: the same numbers (on a TPU, in bfloat16, the bias's sum reads that rounded
  dz too, accumulating in float32), and in bfloat16 half the bytes (dz alone, written once and read
  twice, is a large array per layer of the `bilm_large` step: bench/RESULTS_tpu_compile.md, "The LSTM
  time loop").
  (Computing the inputs' gradient inside the loop instead made the TPU compiler read the input kernel
  from HBM at every step, which moved more, the more so when dz's product takes the whole kernel at
  once: bench/RESULTS_tpu_compile.md, "The LSTM time loop".)

The forward values are the same operations as before; gradients equal autodiff's up to the order of
float32 sums (tests/test_recurrence.py). Shapes: T steps, D = 2 directions, B rows, H cell, P projection.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from elmo_jax.model.precision import einsum, summing_columns

# `lax.empty` came after jax 0.6, the dependency floor; there, zeros (what it gives on the CPU anyway).
_empty = getattr(lax, "empty", jnp.zeros)

FORGET_BIAS = 1.0  # TF LSTMCell's default, added at run time and never stored in weight files.


@dataclasses.dataclass(frozen=True)
class Settings:
    """Static settings of one layer's loop: clips (None: no clip), matmul dtype, scan unroll."""

    cell_clip: float | None
    proj_clip: float | None
    dtype: str = "float32"
    unroll: int = 1
    token_shards: int = 1  # devices the rows are split over (`ComputeOptions.token_shards`)


def cell(z: jax.Array, c_prev: jax.Array, cell_clip: float | None) -> tuple[jax.Array, jax.Array]:
    """The elementwise half of a step: gate pre-activations z (..., 4H) (i, j, f, o) and c_prev (..., H)
    to the new cell c and sigmoid(o) * tanh(c), both (..., H)."""
    i, j, f, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f + FORGET_BIAS) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(j)
    if cell_clip is not None:
        c = jnp.clip(c, -cell_clip, cell_clip)
    return c, jax.nn.sigmoid(o) * jnp.tanh(c)


def _clip_projection(h: jax.Array, s: Settings) -> jax.Array:
    return h if s.proj_clip is None else jnp.clip(h, -s.proj_clip, s.proj_clip)


def _step(s: Settings, W_h, W_P, carry, z_x, live, fresh):
    """One step: (new carry, output, residuals (z, c_prev, h_prev, projection before its clip))."""
    c_prev, h_prev = carry
    if fresh is not None:
        c_prev = jnp.where(fresh[..., None], 0.0, c_prev)
        h_prev = jnp.where(fresh[..., None], 0.0, h_prev)
    z = z_x + einsum("dbp,dpg->dbg", h_prev, W_h, s.dtype)
    c, h = cell(z, c_prev, s.cell_clip)
    h_projected = h
    if W_P is not None:  # as TF's LSTMCell: proj_clip applies only to a projected output
        h_projected = einsum("dbh,dhp->dbp", h, W_P, s.dtype)
        h = _clip_projection(h_projected, s)
    live = live[..., None]
    new = (jnp.where(live, c, c_prev), jnp.where(live, h, h_prev))
    # h_prev is saved in the matmul dtype: its one use is dW_0's product, which casts it to that anyway.
    return new, jnp.where(live, h, 0.0), (z, c_prev, h_prev.astype(s.dtype), h_projected)


class SideBySide(tuple):
    """Arrays of one dtype and leading shape that `stacked_scan` stacks as one array, joined along the last
    axis, each written by its own store into its columns: joining them first (a concatenate) cost a TPU
    several passes over the joined width (the LSTM backward loop's dz, bench/RESULTS_tpu_compile.md, "The
    backward loop's dz stored gate by gate")."""


jax.tree_util.register_pytree_node(SideBySide, lambda pieces: (tuple(pieces), None), lambda _, xs: SideBySide(xs))


def _is_side_by_side(x) -> bool:
    return isinstance(x, SideBySide)


def _stack_buffer(length: int, y) -> jax.Array:
    """The uninitialised (length, ...) stack of a step output's shape (`SideBySide`: joined)."""
    if isinstance(y, SideBySide):
        return _empty((length, *y[0].shape[:-1], sum(piece.shape[-1] for piece in y)), y[0].dtype)
    return _empty((length, *y.shape), y.dtype)


def _store(buffer: jax.Array, y, t) -> jax.Array:
    """buffer[t] = y (`SideBySide`: each piece into its columns of buffer[t])."""
    if not isinstance(y, SideBySide):
        return lax.dynamic_update_index_in_dim(buffer, y, t, 0)
    column = 0
    for piece in y:
        buffer = lax.dynamic_update_slice(buffer, piece[None], (t,) + (0,) * (piece.ndim - 1) + (column,))
        column += piece.shape[-1]
    return buffer


def stacked_scan(step, carry, length: int, *, unroll: int = 1, reverse: bool = False):
    """`lax.scan` over t = 0 .. length - 1 (or back) of `step(carry, t) -> (carry, y)`, the ys stacked (T, ...).

    The stacks are carried buffers allocated with `lax.empty` and written step by step, where
    `lax.scan` fills its output buffers with zeros first: on a TPU `lax.empty` is an uninitialised
    allocation, and the zero fill of the residual stacks was a measurable part of the `bilm_large` step's
    traffic (bench/RESULTS_tpu_compile.md, "The LSTM time loop"; on the CPU `lax.empty` is zeros, as before;
    the GPU compiler of jax 0.10.2 allocates it uninitialised too, and unsharded: every GPU of a mesh holds the
    global batch's stacks, bench/RESULTS_gpu_compile.md).
    A `SideBySide` output is stacked joined: (T, ..., sum of the pieces' widths).
    """
    y_shapes = jax.eval_shape(lambda c: step(c, jnp.int32(0))[1], carry)
    stacks = jax.tree.map(lambda y: _stack_buffer(length, y), y_shapes, is_leaf=_is_side_by_side)

    def body(state, i):
        carry, stacks = state
        t = length - 1 - i if reverse else i
        carry, y = step(carry, t)
        stacks = jax.tree.map(lambda buffer, v: _store(buffer, v, t), stacks, y, is_leaf=_is_side_by_side)
        return (carry, stacks), None

    (carry, stacks), _ = lax.scan(body, (carry, stacks), jnp.arange(length), unroll=unroll)
    return carry, stacks


def _scan(s: Settings, inputs, W_0, bias, W_P, mask, resets, c0, h0, keep_residuals: bool):
    """The time loop; `z_x(t)` is step t's input half of z. On a TPU each step computes it (`input_gates`);
    elsewhere one product over all steps before the loop does, which is faster on a CPU (larger products)."""

    def loop(z_x, W_h, W_P, mask, resets, c0, h0):
        def body(carry, t):
            fresh = None if resets is None else resets[t]
            new, out, residuals = _step(s, W_h, W_P, carry, z_x(t), mask[t], fresh)
            return new, (out, residuals) if keep_residuals else out

        if keep_residuals:
            return stacked_scan(body, (c0, h0), mask.shape[0], unroll=s.unroll)
        return lax.scan(body, (c0, h0), jnp.arange(mask.shape[0]), unroll=s.unroll)

    def each_step(inputs, W_0, bias, *rest):
        W_x, W_h = W_0[:, : inputs.shape[-1]], W_0[:, inputs.shape[-1] :]
        return loop(lambda t: input_gates(s, inputs[t], W_x, bias), W_h, *rest)

    def all_steps(inputs, W_0, bias, *rest):
        P_in = inputs.shape[-1]
        x_gates = einsum("tdbp,dpg->dtbg", inputs, W_0[:, :P_in], s.dtype) + bias[:, None, None, :]
        return loop(lambda t: lax.dynamic_index_in_dim(x_gates, t, axis=1, keepdims=False), W_0[:, P_in:], *rest)

    args = (inputs, W_0, bias, W_P, mask, resets, c0, h0)
    rows = inputs.shape[2]  # symbolic in a `jax.export` with a symbolic batch: left to the platform
    if isinstance(rows, int) and rows // s.token_shards > IN_LOOP_MAX_ROWS:
        return all_steps(*args)
    return lax.platform_dependent(*args, tpu=each_step, default=all_steps)


# Rows per device up to which a TPU computes each step's input product inside the loop. On v5e
# (bench/tpu_compile.py) it moved less at 128 rows (the `bilm_large` train step, 8 x 1 and 1 x 1) and at
# 64 (feature extraction), more at 512 (feature extraction, where the loop's kernels no longer stay in
# on-chip memory beside its activations). Measured: bench/RESULTS_tpu_compile.md, "The LSTM time loop".
IN_LOOP_MAX_ROWS = 128


def input_gates(s: Settings, x: jax.Array, W_x: jax.Array, bias: jax.Array) -> jax.Array:
    """The input half of one step's z on a TPU: x (D, B, P_in), W_x (D, P_in, 4H) -> (D, B, 4H), bias added.

    One product over all steps before the loop writes a (D, T, B, 4H) float32 result and reads it back
    step by step, while the loop's kernels stay in on-chip memory. On a CPU that one product is faster (a
    step of the small model is slower with per-step products, bench/ab_revisions.py), so `_scan` uses
    this only on TPU (`lax.platform_dependent`, decided when the program is lowered for its platform),
    and only up to `IN_LOOP_MAX_ROWS` rows per device. Measured: bench/RESULTS_tpu_compile.md, "The LSTM
    time loop".
    """
    return einsum("dbp,dpg->dbg", x, W_x, s.dtype) + bias[:, None, :]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def recurrence(s: Settings, inputs, W_0, bias, W_P, mask, resets, c0, h0):
    """One LSTM layer of both directions over time.

    Args:
      s: the layer's static `Settings`.
      inputs: (T, D, B, P_in) the layer's inputs, time-major.
      W_0: (D, P_in + P, 4H) kernel of [x ; h_prev]; bias: (D, 4H).
      W_P: (D, H, P) projection, or None (then P == H).
      mask: bool (T, D, B): where a row has a token; elsewhere the state is held and the output is 0.
      resets: None or bool (T, D, B): zero the state before the token at that position.
      c0, h0: (D, B, H), (D, B, P) initial state.

    Returns:
      (outputs (T, D, B, P), final c, final h).
    """
    (c, h), outputs = _scan(s, inputs, W_0, bias, W_P, mask, resets, c0, h0, keep_residuals=False)
    return outputs, c, h


def _forward(s: Settings, inputs, W_0, bias, W_P, mask, resets, c0, h0):
    (c, h), (outputs, residuals) = _scan(s, inputs, W_0, bias, W_P, mask, resets, c0, h0, keep_residuals=True)
    return (outputs, c, h), (residuals, inputs, W_0, W_P, mask, resets)


def _backward(s: Settings, saved, cotangents):
    (z, c_prev, h_prev, h_projected), inputs, W_0, W_P, mask, resets = saved  # residuals (T, D, B, ·)
    d_outputs, dc_final, dh_final = cotangents
    P_in = inputs.shape[-1]
    args = (z, c_prev, h_projected, d_outputs, mask, resets, W_0[:, P_in:], W_P, dc_final, dh_final)
    # The loop in the TPU's form and elsewhere (`_reverse_loop`'s `tpu`); a CPU runs the form it ran before
    # each TPU change, as fast or faster there (bench/RESULTS_tpu_compile.md, "The compiler's estimate").
    (dc0, dh0), (dz, d_projected, h), d_bias = lax.platform_dependent(
        *args,
        tpu=functools.partial(_reverse_loop, s, True),
        default=functools.partial(_reverse_loop, s, False),
    )
    # One product over every step and row for each gradient that needs dz, instead of per-step
    # accumulators: the kernel's (inputs and state together) and the inputs'.
    dW_0 = einsum("tdbp,tdbg->dpg", jnp.concatenate([inputs, h_prev], axis=-1), dz, s.dtype)
    d_inputs = einsum("tdbg,dpg->tdbp", dz, W_0[:, :P_in], s.dtype)
    dW_P = None if W_P is None else einsum("tdbh,tdbp->dhp", h, d_projected, s.dtype)
    return d_inputs, dW_0, d_bias, dW_P, None, None, dc0, dh0


def _reverse_loop(s: Settings, tpu: bool, z, c_prev, h_projected, d_outputs, mask, resets, W_h, W_P, dc, dh):
    """The backward time loop: ((dc0, dh0), stacked (dz, d_projected, h) in the matmul dtype, d_bias (D, 4H)).

    tpu: the loop in the form the TPU compiler estimates faster (bench/RESULTS_tpu_compile.md, "The
    compiler's estimate"), the same numbers up to the order of float32 sums:
    - the bias's gradient is one sum of the stored dz after the loop, not a sum step by step in it (where
      the compiler recomputed dz from z to sum it over the rows; float32 accumulation either way, and in
      bfloat16 the stored dz is the rounded one the products read), as a product (`_summed_over_rows`);
    - dz is computed gate by gate (i, j, f, o, (D, B, H) each), materialised once in the matmul dtype, and
      stored into its columns of the (T, D, B, 4H) stack by one store per gate (`SideBySide`), while the
      state's gradient is one product of the gates stacked on a leading axis: joined along 4H first,
      dz's concatenate made four passes over the whole width at every step.
    """

    def body(carry, t):
        dc, dh, d_bias = carry  # gradients of the state this step hands on; of the bias so far (or None)
        z_t, c_prev_t, h_projected_t, d_out, live = z[t], c_prev[t], h_projected[t], d_outputs[t], mask[t]
        fresh = None if resets is None else resets[t]
        live = live[..., None]
        d_h = jnp.where(live, dh + d_out, 0.0)  # of the step's (clipped, projected) output
        d_c = jnp.where(live, dc, 0.0)
        if tpu:  # differentiated with respect to each gate's pre-activations, so dz comes out in pieces
            gates = tuple(jnp.split(z_t, 4, axis=-1))
            cell_of_gates = lambda g, cc: cell(jnp.concatenate(g, axis=-1), cc, s.cell_clip)  # noqa: E731
            (_, h_t), cell_vjp = jax.vjp(cell_of_gates, gates, c_prev_t)
        else:
            (_, h_t), cell_vjp = jax.vjp(lambda zz, cc: cell(zz, cc, s.cell_clip), z_t, c_prev_t)
        d_projected = d_h
        if W_P is not None:
            d_projected = jax.vjp(lambda x: _clip_projection(x, s), h_projected_t)[1](d_h)[0]
            d_h = einsum("dbp,dhp->dbh", d_projected, W_P, s.dtype)
        dz, dc_cell = cell_vjp((d_c, d_h))
        if tpu:
            # Computed once (the barrier) for both the products and the stores, which otherwise each
            # recomputed the cell from z.
            dz = lax.optimization_barrier(tuple(g.astype(s.dtype) for g in dz))
            # One product over the gates stacked on a leading axis (k) and the kernel's columns viewed
            # as (4, H): one per gate read four column slices of the kernel, which the compiler
            # materialised before the loop.
            gates_first = W_h.reshape(*W_h.shape[:-1], 4, dz[0].shape[-1])  # (D, P, 4, H)
            d_state = einsum("kdbh,dpkh->dbp", jnp.stack(dz), gates_first, s.dtype)
            dz = SideBySide(dz)
        else:
            d_state = einsum("dbg,dpg->dbp", dz, W_h, s.dtype)
        dc_prev = jnp.where(live, 0.0, dc) + dc_cell
        dh_prev = jnp.where(live, 0.0, dh) + d_state
        if fresh is not None:
            dc_prev = jnp.where(fresh[..., None], 0.0, dc_prev)
            dh_prev = jnp.where(fresh[..., None], 0.0, dh_prev)
        # The stacked outputs feed only the products after the loop, which cast them to the matmul
        # dtype: casting here instead gives the same numbers and, in bfloat16, halves the bytes the
        # loop writes and the products read (dz is the largest, (D, B, 4H) per step).
        stored = (dz if tpu else dz.astype(s.dtype), d_projected.astype(s.dtype), h_t.astype(s.dtype))
        return (dc_prev, dh_prev, None if d_bias is None else d_bias + jnp.sum(dz, axis=1)), stored

    d_bias = None if tpu else jnp.zeros((z.shape[1], z.shape[-1]), jnp.float32)
    (dc0, dh0, d_bias), stacks = stacked_scan(body, (dc, dh, d_bias), z.shape[0], unroll=s.unroll, reverse=True)
    if tpu:
        d_bias = _summed_over_rows(stacks[0], mask, s.dtype)
    return (dc0, dh0), stacks, d_bias


def _summed_over_rows(dz: jax.Array, mask: jax.Array, dtype: str) -> jax.Array:
    """The bias's gradient on a TPU: the stacked dz (T, D, B, 4H) summed over steps and rows -> float32 (D, 4H).

    A product with the mask (dz is zero where it is false, so the same sum) on the matrix unit
    (`summing_columns`): the compiler's reduction over the rows of the stack was estimated much slower
    than the product (measured: bench/RESULTS_tpu_compile.md, "The LSTM time loop").
    """
    return einsum("tdbg,tdbk->dkg", dz, summing_columns(mask, dz.dtype), dtype)[:, 0]


recurrence.defvjp(_forward, _backward)
