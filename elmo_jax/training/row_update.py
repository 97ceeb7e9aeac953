"""The optimiser step with the softmax updated only at the rows the sampled softmax read (row-sparse).

A sampled-softmax step reads the G·S candidate rows of each direction and the rows of its targets: at
most K = D·G·S + D·B·T of the V' rows of W (86k of 793,600 for `bilm_large` at 512 rows). Every
other row has a zero gradient, and the project's optimiser leaves such a row exactly as it was:
global-norm clipping scales 0 to 0, and Adagrad adds 0² to the accumulator and moves the parameter by
0 · rsqrt(acc) = 0. So updating only the rows that were read gives the dense update's numbers without
building, all-reducing, clipping and updating a (V', P) gradient and reading and writing all of W and
its accumulator every step (bilm-tf's TensorFlow update was sparse too: `IndexedSlices`). What it
must get right:

- a word's gradient is the sum over all its uses (a candidate of either direction and of any group,
  the target of any token): the per-use rows are summed per distinct id before the update;
- global-norm clipping needs the norm of the whole gradient: the summed rows hold every non-zero
  entry of the softmax's gradient, so the norm of (biLM gradient, summed rows) is the dense norm (up to
  the order of the float32 sum);
- the optimiser's per-parameter state (Adagrad's accumulators) is read and written at the same rows.

The optimiser must be elementwise, with a zero gradient leaving a parameter and its state unchanged
(clip + Adagrad is; Adam's moments, for one, would decay everywhere). The optimiser declares it
(`optimizers.Optimizer.row_sparse`), and the train step uses this module only when it does.

Shapes: D directions, G candidate groups, S candidates per group, B rows, T steps, P projection,
V' padded vocabulary, U slots for distinct ids (min(K, vocabulary size)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from elmo_jax.training.optimizers import global_norm

SOFTMAX_KEYS = ("W", "b")


def row_uses(n_directions: int, groups: int, num_sampled: int, batch_size: int, unroll_steps: int, vocab_size: int):
    """How many softmax rows a step reads, repeats counted: D·G·S + D·B·T (S at most the vocabulary)."""
    return n_directions * (groups * min(num_sampled, vocab_size) + batch_size * unroll_steps)


def row_slots(n_directions: int, groups: int, num_sampled: int, batch_size: int, unroll_steps: int, vocab_size: int):
    """U: how many distinct softmax rows a step can read, min(`row_uses`, vocabulary size)."""
    return min(row_uses(n_directions, groups, num_sampled, batch_size, unroll_steps, vocab_size), vocab_size)


def distinct_rows(candidates: jax.Array, targets: jax.Array, slots: int, fill: int):
    """The distinct row ids a step reads, and the slot of each use among them.

    Args:
      candidates: int (D, G, S); targets: int (D, B, T).
      slots: U (`row_slots`), at least the number of distinct ids.
      fill: the id of unused slots, out of range (V'): gathers there give 0, scatters there are dropped.

    Returns:
      (ids int32 (U,) ascending then `fill`, candidate slots int32 (D, G, S), target slots int32 (D, B, T)).
    """
    flat = jnp.concatenate([candidates.reshape(-1), targets.reshape(-1)]).astype(jnp.int32)
    ids, inverse = jnp.unique(flat, size=slots, fill_value=fill, return_inverse=True)
    inverse = inverse.reshape(-1).astype(jnp.int32)
    n = candidates.size
    return ids.astype(jnp.int32), inverse[:n].reshape(candidates.shape), inverse[n:].reshape(targets.shape)


def sum_rows(row_grads: dict[str, jax.Array], candidate_slots: jax.Array, target_slots: jax.Array, slots: int):
    """Per-use gradient rows (`lm.softmax_rows`' keys) summed per distinct id: {"W": (U, P), "b": (U,)}."""

    def total(candidate, true):
        tail = true.shape[3:]  # (P,) or ()
        summed = jnp.zeros((slots, *tail), true.dtype)
        summed = summed.at[candidate_slots.reshape(-1)].add(candidate.reshape(-1, *tail))
        return summed.at[target_slots.reshape(-1)].add(true.reshape(-1, *tail))

    return {
        "W": total(row_grads["candidate_W"], row_grads["true_W"]),
        "b": total(row_grads["candidate_b"], row_grads["true_b"]),
    }


def _softmax_markers(optimizer: optax.GradientTransformation, params: dict, opt_state):
    """The optimiser state's tree with each leaf replaced by "W" / "b" (state of a softmax parameter)
    or "" (anything else: the biLM's state, counters)."""
    names = {"bilm": jax.tree.map(lambda _: "", params["bilm"]), "softmax": {k: k for k in params["softmax"]}}
    return optax.tree_map_params(
        optimizer,
        lambda _, name: name,
        opt_state,
        names,
        transform_non_params=lambda value: jax.tree.map(lambda _: "", value),
    )


def sparse_update(
    optimizer: optax.GradientTransformation,
    params: dict,
    opt_state,
    bilm_grads: dict,
    row_grads: dict[str, jax.Array],
    candidates: jax.Array,
    targets: jax.Array,
    slots: int,
):
    """One optimiser step: the biLM's parameters densely, the softmax's at the rows the step read.

    Args:
      optimizer: elementwise, a zero gradient leaving a parameter and its state unchanged (see above;
        `optimizers.declares_row_sparse`).
      params: {"bilm": ..., "softmax": {"W": (V', P), "b": (V',)}}; opt_state: its `optimizer` state.
      bilm_grads: the gradient of params["bilm"].
      row_grads: the gradient of `lm.softmax_rows(params["softmax"], candidates, targets)`.
      candidates: int (D, G, S); targets: int (D, B, T): where those rows were gathered.
      slots: U (`row_slots`).

    Returns:
      (new params, new opt_state, the global norm of the gradient before clipping).
    """
    W = params["softmax"]["W"]
    ids, candidate_slots, target_slots = distinct_rows(candidates, targets, slots, fill=W.shape[0])
    take = lambda x: x.at[ids].get(mode="fill", fill_value=0)  # noqa: E731 (unused slots: 0, dropped below)
    grads = {"bilm": bilm_grads, "softmax": sum_rows(row_grads, candidate_slots, target_slots, slots)}
    rows = {"bilm": params["bilm"], "softmax": {k: take(params["softmax"][k]) for k in SOFTMAX_KEYS}}
    markers = _softmax_markers(optimizer, params, opt_state)
    row_state = jax.tree.map(lambda s, m: take(s) if m else s, opt_state, markers)
    updates, new_row_state = optimizer.update(grads, row_state, rows)
    new_params = {
        "bilm": optax.apply_updates(params["bilm"], updates["bilm"]),
        "softmax": {k: params["softmax"][k].at[ids].add(updates["softmax"][k], mode="drop") for k in SOFTMAX_KEYS},
    }
    new_state = jax.tree.map(
        lambda new, old, m: old.at[ids].set(new, mode="drop") if m else new, new_row_state, opt_state, markers
    )
    return new_params, new_state, global_norm(grads)
