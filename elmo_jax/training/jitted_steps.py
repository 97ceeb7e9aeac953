"""The training functions jitted for a device mesh (pjit): `jit_steps` compiles init, train and eval
steps with the shardings of `sharding.RULES`, and `skip_nonfinite_step` lets the train step drop a
step whose loss or gradient is not finite, on the device.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elmo_jax.model.lstm import stacked_weight_paths, zero_state
from elmo_jax.training.optimizers import Optimizer, declares_row_sparse
from elmo_jax.training.sharding import (
    RULES,
    batch_sharding,
    logical_shards,
    state_shardings,
    weight_gather,
    with_shardings,
)
from elmo_jax.training.train_step import StepConfig, eval_step_fn, init_train_state, train_step_fn


@dataclasses.dataclass(frozen=True)
class Steps:
    """The training functions jitted for one mesh (pjit), and the shardings they read and write.

    Attributes:
      mesh: the mesh.
      batch_size: B, global rows.
      state: NamedShardings of the `TrainState`.
      batch: NamedSharding of every batch array (D, B, ...).
      abstract_state: the `TrainState` as ShapeDtypeStructs carrying `state` (restore targets).
      init: (key, bilm: BiLMParams | None, softmax: dict | None) -> TrainState, created sharded.
      train: (state, batch, content_positions, distinct_tokens=None) -> (state, metrics); the state is donated.
      eval: (params, lstm, batch, content_positions) -> (loss sums (D,), counts (D,), lstm).
      (content_positions, distinct_tokens: the batch's static char CNN buckets, `batch_feed`.)
      local_token_shards: the blocks of the batch's rows this process's devices hold (`batch_feed.distinct_bucket`).
      zero_lstm: () -> the zero `LSTMState` (D, L, B, ·), sharded like the carried state.
      finite: state -> bool (): whether every parameter and optimiser value is finite (replicated).
    """

    mesh: Mesh
    batch_size: int
    state: Any
    batch: NamedSharding
    abstract_state: Any
    init: Any
    train: Any
    eval: Any
    zero_lstm: Any
    finite: Any
    local_token_shards: int = 1

    def abstract_batch(self, cfg: StepConfig) -> dict[str, jax.ShapeDtypeStruct]:
        """A training batch as ShapeDtypeStructs sharded like `batch`, for `train.lower(...)` without data
        (ahead-of-time compiles, e.g. for a TPU topology): char_ids int32 (D, B, T, C), targets int32
        (D, B, T), mask, reset bool (D, B, T), carry bool (D, B)."""
        D, B, T, C = 2, self.batch_size, cfg.unroll_steps, cfg.model.max_characters_per_token
        shapes = {
            "char_ids": ((D, B, T, C), jnp.int32),
            "targets": ((D, B, T), jnp.int32),
            "mask": ((D, B, T), jnp.bool_),
            "carry": ((D, B), jnp.bool_),
            "reset": ((D, B, T), jnp.bool_),
        }
        return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=self.batch) for k, (shape, dtype) in shapes.items()}


@functools.lru_cache(maxsize=16)  # the same jitted functions (and their compile cache) for the same run
def jit_steps(
    mesh: Mesh,
    cfg: StepConfig,
    optimizer: Optimizer | optax.GradientTransformation,
    batch_size: int,
    rules=RULES,
    skip_nonfinite: bool = False,
) -> Steps:
    """`init_train_state`, `train_step_fn` and `eval_step_fn` jitted with the shardings of `rules` on `mesh`.

    The state's shapes come from `jax.eval_shape` (no allocation); `init` then creates every array
    directly in its shards, so no device ever holds the whole softmax. With `skip_nonfinite` the train
    step is wrapped by `skip_nonfinite_step`. An optimiser that does not declare itself row-sparse gets
    the dense softmax update even when `cfg.sparse_softmax_update` asks for the sparse one (logged).
    """
    _log_dense_softmax_update(cfg, optimizer)
    cfg = _with_mesh_shards(cfg, mesh, rules)

    def init(key, bilm, softmax):
        return init_train_state(key, cfg, optimizer, batch_size, bilm, softmax)

    abstract = jax.eval_shape(init, jax.random.key(0), None, None)
    shardings = state_shardings(mesh, abstract, optimizer, rules)
    batch = batch_sharding(mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    gather = weight_gather(shardings.params["bilm"], stacked_weight_paths(cfg.model))
    return Steps(
        mesh=mesh,
        batch_size=batch_size,
        state=shardings,
        batch=batch,
        abstract_state=with_shardings(abstract, shardings),
        init=jax.jit(init, out_shardings=shardings),
        train=_jit_train(cfg, optimizer, skip_nonfinite, shardings, batch, replicated, gather),
        eval=_jit_eval(cfg, shardings, batch, replicated, gather),
        zero_lstm=jax.jit(lambda: zero_state(cfg.model, batch_size), out_shardings=shardings.lstm),
        finite=jax.jit(all_finite, in_shardings=(shardings,), out_shardings=replicated),
        local_token_shards=_local_row_blocks(batch, batch_size),
    )


def _local_row_blocks(batch: NamedSharding, batch_size: int) -> int:
    """How many distinct blocks of the batch's rows this process's devices hold: the blocks of its rows that
    the char CNN de-duplicates on their own (`batch_feed.distinct_bucket`)."""
    slices = batch.addressable_devices_indices_map((2, batch_size, 1)).values()
    return len({(index[1].start, index[1].stop) for index in slices})


def _log_dense_softmax_update(cfg: StepConfig, optimizer: Optimizer | optax.GradientTransformation) -> None:
    """Logs that the softmax is updated densely when the config asks for the sparse update but the
    optimiser does not declare itself row-sparse."""
    if cfg.sparse_softmax_update and not cfg.full_softmax and not declares_row_sparse(optimizer):
        logging.info(
            "the softmax is updated densely (every row, every step): optimizer %s is not known to leave a "
            "row with zero gradient and its state unchanged, so updating only the rows a step read would "
            "change the numbers",
            getattr(optimizer, "name", "(an optax transformation)"),
        )


def _with_mesh_shards(cfg: StepConfig, mesh: Mesh, rules) -> StepConfig:
    """`cfg` with `compute.token_shards` and `vocab_shards` set to the shards of the batch and vocabulary
    axes of `rules` on `mesh`."""
    # The char CNN's token blocks and the LSTM's input-product form are chosen by one device's rows
    # (the batch axis's shards), not the global batch's; the softmax update by one device's vocabulary rows.
    compute = dataclasses.replace(cfg.compute, token_shards=logical_shards(mesh, "batch", rules))
    return dataclasses.replace(cfg, compute=compute, vocab_shards=logical_shards(mesh, "vocab", rules))


def _jit_train(
    cfg: StepConfig,
    optimizer: Optimizer | optax.GradientTransformation,
    skip_nonfinite: bool,
    shardings: Any,
    batch: NamedSharding,
    replicated: NamedSharding,
    gather,
):
    """`train_step_fn` jitted: (state, batch, content_positions, distinct_tokens=None) -> (state, metrics), the
    state donated; the biLM's weights gathered by `gather` (`sharding.weight_gather`)."""

    def train(state, batch, content_positions, distinct_tokens=None):
        step = functools.partial(
            train_step_fn,
            cfg=cfg,
            optimizer=optimizer,
            content_positions=content_positions,
            distinct_tokens=distinct_tokens,
            gather_weights=gather,
        )
        return skip_nonfinite_step(step, state, batch) if skip_nonfinite else step(state, batch)

    # The char CNN's buckets (`batch_feed`) are static and positional: pjit takes no kwargs.
    return jax.jit(
        train,
        static_argnums=(2, 3),
        in_shardings=(shardings, batch),
        out_shardings=(shardings, replicated),
        donate_argnums=(0,),
    )


def _jit_eval(cfg: StepConfig, shardings: Any, batch: NamedSharding, replicated: NamedSharding, gather):
    """`eval_step_fn` jitted: (params, lstm, batch, content_positions) -> (loss sums (D,), counts (D,), lstm)."""

    def evaluate(params, lstm, batch, content_positions):
        return eval_step_fn(params, lstm, batch, cfg=cfg, content_positions=content_positions, gather_weights=gather)

    # content_positions is static and positional, as in the train step.
    return jax.jit(
        evaluate,
        static_argnums=(3,),
        in_shardings=(shardings.params, shardings.lstm, batch),
        out_shardings=(replicated, replicated, shardings.lstm),
    )


def all_finite(state) -> jax.Array:
    """bool (): every parameter, optimiser value and averaged weight of a `TrainState` is finite (no NaN,
    no Inf)."""
    leaves = jax.tree.leaves((state.params, state.opt_state, state.average))
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]))


def skip_nonfinite_step(step_fn, state, batch):
    """`step_fn(state, batch)`, except that a step whose loss or gradient norm is not finite leaves the
    parameters, their average and the optimiser state as they were (to be traced inside the jitted step).

    The choice is made on the device (`jnp.where`), so the host need not read the loss before the next
    step is dispatched; metrics gain "skipped" (1.0 for a skipped step, else 0.0), which the trainer
    counts when it reads them. A skipped step still advances the step counter (and so the RNG) and the
    data stream (its window is dropped), and its rows start the next window from a zero LSTM state,
    since the carried one may be what overflowed.
    """
    new, metrics = step_fn(state, batch)
    ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    keep = lambda updated, previous: jnp.where(ok, updated, previous)
    new = new.replace(
        params=jax.tree.map(keep, new.params, state.params),
        opt_state=jax.tree.map(keep, new.opt_state, state.opt_state),
        average=jax.tree.map(keep, new.average, state.average),
        lstm=jax.tree.map(lambda carried: jnp.where(ok, carried, jnp.zeros_like(carried)), new.lstm),
    )
    return new, {**metrics, "skipped": jnp.where(ok, 0.0, 1.0).astype(jnp.float32)}
