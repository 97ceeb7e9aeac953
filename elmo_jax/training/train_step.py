"""The pure, jittable parts of training: state, one training step, one evaluation step.

`TrainState` holds everything that changes during training — parameters, the optimiser's state
(`optimizers.Optimizer`; Adagrad's accumulators by default), the step, the base RNG key and each row's
carried LSTM state, and the average of the biLM's weights that evaluations and the export read
(`weight_average`) — as one pytree, so a checkpoint of it plus the data stream's position resumes a run
exactly. Per-step randomness is `fold_in(key, step)`: nothing random depends on how often the process
was restarted.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.lstm import LSTMState, zero_state
from elmo_jax.model.params import BiLMParams, init_params
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.model.vocabulary import TokenVocabulary
from elmo_jax.training.lm import (
    candidate_groups,
    draw_candidates,
    lm_losses,
    lm_outputs,
    reset_state,
    sampled_lm_losses,
    softmax_rows,
)
from elmo_jax.training.optimizers import Optimizer, declares_row_sparse, global_norm
from elmo_jax.training.row_update import row_slots, row_uses, sparse_update
from elmo_jax.training.softmax import padded_vocab_size
from elmo_jax.training.weight_average import fresh, updated


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static settings of the train and eval steps (hashable, so jit specialises on them)."""

    model: BiLMConfig
    vocab_size: int
    unroll_steps: int
    dropout: float = 0.1
    n_negative_samples: int = 8192
    negative_sample_group_rows: int = 0  # rows per candidate draw (0: one draw for the whole batch)
    full_softmax: bool = False
    softmax_chunk: int = 8192
    loss_scale_by_unroll: bool = True
    # Its content_positions (and in training distinct_tokens) are set per batch (`train_step_fn`, `eval_step_fn`).
    compute: ComputeOptions = ComputeOptions()
    # Update only the softmax rows the sampled softmax read (`row_update`): the dense update's numbers
    # without a (V', P) gradient. Used when a step's reads (repeats counted) are fewer than V' and the
    # optimiser declares that this is exact (`optimizers.declares_row_sparse`: Adagrad, not Adam);
    # ignored with full_softmax.
    sparse_softmax_update: bool = True
    # How many devices the softmax's vocabulary is split over (`jitted_steps` sets it from the mesh):
    # the dense update's work per device is V' / vocab_shards rows (`softmax_row_slots`).
    vocab_shards: int = 1
    # Decay of the biLM weights' moving average that evaluations and the export read (`weight_average`);
    # 0 keeps none (they read the last step's parameters, as bilm-tf does).
    weight_average_decay: float = 0.0
    # The model's text -> ids when it reads its own character vocabulary (`data.characters` "corpus": the
    # batch stream's char ids, the export's vocabulary.json); None: UTF-8 bytes.
    vocabulary: TokenVocabulary | None = None


@flax.struct.dataclass
class TrainState:
    """Everything a training step reads and writes.

    Attributes:
      step: int32 () steps taken.
      params: {"bilm": BiLMParams.weights, "softmax": {"W": (V', P), "b": (V',)}}, V' the padded vocabulary.
      opt_state: the optimiser's state for params.
      key: uint32 (2,) raw base key (raw, so that checkpoints hold plain arrays).
      lstm: the carried `LSTMState` (D, L, B, ·) of every row of the global batch.
      average: the moving average of params["bilm"] (`weight_average`; the biLM the run stands for), or None
        when the run keeps none (`StepConfig.weight_average_decay` 0).
    """

    step: jax.Array
    params: dict
    opt_state: optax.OptState
    key: jax.Array
    lstm: LSTMState
    average: dict | None = None


def init_softmax(key: jax.Array, vocab_size: int, dim: int) -> dict[str, jax.Array]:
    """bilm-tf's softmax initialisation: W ~ N(0, 1/dim), b = 0.

    Returns {"W": (V', dim), "b": (V',)} with V' = `padded_vocab_size(vocab_size)`; the padding rows
    are zero (no id ever reaches them, so they never change).
    """
    rows = padded_vocab_size(vocab_size)
    # The barrier keeps XLA from folding the scale into the sampler's own constants, so the jitted,
    # sharded initialisation gives the same bits as an eager one.
    W = jax.lax.optimization_barrier(jax.random.normal(key, (rows, dim), jnp.float32)) * np.float32(1 / np.sqrt(dim))
    real = (jnp.arange(rows) < vocab_size)[:, None]  # (V', 1)
    return {"W": jnp.where(real, W, 0.0), "b": jnp.zeros((rows,), jnp.float32)}


def init_train_state(
    key: jax.Array,
    cfg: StepConfig,
    optimizer: Optimizer | optax.GradientTransformation,
    batch_size: int,
    bilm: BiLMParams | None = None,
    softmax: dict[str, jax.Array] | None = None,
) -> TrainState:
    """A fresh state; `bilm` / `softmax` start from given weights (fine-tuning) instead of random ones."""
    k_bilm, k_softmax, k_run = jax.random.split(key, 3)
    weights = (bilm if bilm is not None else init_params(cfg.model, k_bilm)).weights
    if softmax is None:
        softmax = init_softmax(k_softmax, cfg.vocab_size, cfg.model.projection_dim)
    params = {"bilm": weights, "softmax": softmax}
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        key=jax.random.key_data(k_run),
        lstm=zero_state(cfg.model, batch_size),
        average=fresh(params["bilm"]) if cfg.weight_average_decay > 0 else None,
    )


def step_keys(base_key: jax.Array, step: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """(dropout key, candidate key) of a training step: `split(fold_in(base_key, step))`.

    base_key: `TrainState.key` (raw uint32 (2,)). The candidate key is split once more per direction
    and folded with each group's index (`lm.lm_losses`).
    """
    k_dropout, k_sample = jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(base_key), step))
    return k_dropout, k_sample


def _outputs(bilm_weights, cfg: StepConfig, batch, lstm: LSTMState, key, *, train: bool, gather):
    """Top-layer outputs (D, B, T, P) and the final LSTM state of one window; `gather` (or None) is applied
    to the weights first (`sharding.weight_gather`)."""
    return lm_outputs(
        BiLMParams(weights=bilm_weights if gather is None else gather(bilm_weights), config=cfg.model),
        batch["char_ids"],
        batch["mask"],
        reset_state(lstm, batch["carry"]),
        key=key,
        dropout_rate=cfg.dropout if train else 0.0,
        compute=cfg.compute,
        resets=batch.get("reset"),
    )


def _lm_pass(params, cfg: StepConfig, batch, lstm: LSTMState, keys, *, train: bool, gather):
    """Outputs and per-direction (loss sums, counts) of one window; keys: (dropout key, candidate key)."""
    k_dropout, k_sample = keys
    outputs, final = _outputs(params["bilm"], cfg, batch, lstm, k_dropout, train=train, gather=gather)
    sampled = train and not cfg.full_softmax
    sums, counts = lm_losses(
        params["softmax"],
        outputs,
        batch["targets"],
        batch["mask"],
        vocab_size=cfg.vocab_size,
        num_sampled=cfg.n_negative_samples if sampled else None,
        key=k_sample,
        chunk=cfg.softmax_chunk,
        group_rows=cfg.negative_sample_group_rows,
        compute_dtype=cfg.compute.dtype,
    )
    return sums, counts, final


def _scaled_loss(cfg: StepConfig, sums, counts, final):
    """(the differentiated loss, (loss, per-direction losses, counts, final state))."""
    per_direction = sums / jnp.maximum(counts, 1.0)
    loss = jnp.mean(per_direction)
    # bilm-tf differentiates loss * unroll_steps, which matters with clipping and Adagrad.
    scaled = loss * cfg.unroll_steps if cfg.loss_scale_by_unroll else loss
    return scaled, (loss, per_direction, counts, final)


# What the sparse softmax update costs per row it handles, in rows of the dense update: derived from
# two v5e-8 compiles of bilm_large with the vocabulary split over all 8 chips (4 x 2 / 512 rows and
# 8 x 1 / 1,024 rows, each with the sparse and the dense update), whose two differences, each a per-row
# cost times the rows of its update with no fixed part, give the sparse update about twice the dense
# one's cost per row (measured: bench/RESULTS_tpu_compile.md, "The compiler's estimate", paragraph "The
# softmax over every chip"): every device handles every read row (gathered across the vocabulary's
# shards, summed per id, updated and scattered back), the dense update only its own rows, in plain passes.
SPARSE_ROW_COST = 2


def softmax_row_slots(cfg: StepConfig, batch_size: int, optimizer) -> int | None:
    """U, the rows a sparse softmax update handles (`row_update.row_slots`), or None for a dense update:
    with the full softmax, with `sparse_softmax_update` off, with an optimiser that does not declare
    itself row-sparse (`optimizers.declares_row_sparse`), or when `SPARSE_ROW_COST` times the rows a
    step reads, repeats counted (`row_update.row_uses`), is not below the rows of one vocabulary shard,
    V' / `cfg.vocab_shards`.

    The sparse update's work per device grows with the reads (every read row's gradient is gathered
    and summed per id on every device), the dense update's with the device's share of V' (one gradient
    of its rows, summed across the data axis, one pass of the optimiser). U alone (at most V) would
    miss that: bilm_large on 64 data-parallel chips reads 1.38M rows of 793,600 per step, and compiled
    for v5e the sparse update moved more HBM bytes per chip per step than the dense one (measured:
    bench/RESULTS_tpu_compile.md, "What a row means", paragraph "Large slices: v5e-32 and v5e-64")."""
    if cfg.full_softmax or not cfg.sparse_softmax_update or not declares_row_sparse(optimizer):
        return None
    groups = candidate_groups(batch_size, cfg.negative_sample_group_rows)
    sizes = (2, groups, cfg.n_negative_samples, batch_size, cfg.unroll_steps, cfg.vocab_size)
    shard_rows = padded_vocab_size(cfg.vocab_size) // cfg.vocab_shards
    return row_slots(*sizes) if SPARSE_ROW_COST * row_uses(*sizes) < shard_rows else None


def _dense_step(state: TrainState, batch, keys, cfg: StepConfig, optimizer, gather):
    """The gradient of every parameter (the softmax's a (V', P) matrix), then the optimiser on all of them."""

    def loss_fn(params):
        sums, counts, final = _lm_pass(params, cfg, batch, state.lstm, keys, train=True, gather=gather)
        return _scaled_loss(cfg, sums, counts, final)

    grads, aux = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), opt_state, global_norm(grads), aux


def _sparse_step(state: TrainState, batch, keys, cfg: StepConfig, optimizer, gather, slots):
    """The gradient of the biLM and of the softmax rows the step reads, then `row_update.sparse_update`."""
    k_dropout, k_sample = keys
    D, B = batch["targets"].shape[:2]
    sampler = {"vocab_size": cfg.vocab_size, "num_sampled": cfg.n_negative_samples}
    candidates = draw_candidates(k_sample, D, candidate_groups(B, cfg.negative_sample_group_rows), **sampler)

    def loss_fn(bilm, rows):
        outputs, final = _outputs(bilm, cfg, batch, state.lstm, k_dropout, train=True, gather=gather)
        sums, counts = sampled_lm_losses(
            rows, candidates, outputs, batch["targets"], batch["mask"], compute_dtype=cfg.compute.dtype, **sampler
        )
        return _scaled_loss(cfg, sums, counts, final)

    rows = softmax_rows(state.params["softmax"], candidates, batch["targets"])
    (bilm_grads, row_grads), aux = jax.grad(loss_fn, argnums=(0, 1), has_aux=True)(state.params["bilm"], rows)
    params, opt_state, grad_norm = sparse_update(
        optimizer, state.params, state.opt_state, bilm_grads, row_grads, candidates, batch["targets"], slots
    )
    return params, opt_state, grad_norm, aux


def train_step_fn(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    cfg: StepConfig,
    optimizer: Optimizer | optax.GradientTransformation,
    content_positions: int | None = None,
    distinct_tokens: int | None = None,
    gather_weights=None,
):
    """One optimisation step on one window of both directions (pure; `train_step` is it jitted on one
    device, `jitted_steps.jit_steps` jitted for a mesh).

    With the sampled softmax the softmax is updated only at the rows the step read when its reads,
    repeats counted, are fewer than its V' rows and the optimiser declares that exact
    (`softmax_row_slots`, `row_update`): the same numbers as the dense update.

    Args:
      state: donated; the new state replaces it.
      optimizer: static (hashable): the run's `optimizers.Optimizer`, or any optax transformation
        (which gets the dense softmax update).
      batch: {"char_ids": int (D, B, T, C) raw, "targets": int (D, B, T), "mask": bool (D, B, T),
        "carry": bool (D, B), optionally "reset": bool (D, B, T)}.
      content_positions, distinct_tokens: static, the batch's char CNN buckets
        (`batch_feed.device_batch`, `batch_feed.distinct_bucket`; `ComputeOptions`); None: every position, every token.
      gather_weights: None, or `sharding.weight_gather(...)`: applied to the biLM's weights where the
        model reads them, so that weights split between steps are gathered whole once per step.

    Returns:
      (new state, metrics): loss (mean of the directions' mean cross-entropies), forward_loss,
      backward_loss, grad_norm (before clipping), tokens (targets scored in both directions).
    """
    cfg = dataclasses.replace(cfg, compute=cfg.compute.with_positions(content_positions, distinct_tokens))
    keys = step_keys(state.key, state.step)
    slots = softmax_row_slots(cfg, batch["targets"].shape[1], optimizer)
    if slots is None:
        step = _dense_step(state, batch, keys, cfg, optimizer, gather_weights)
    else:
        step = _sparse_step(state, batch, keys, cfg, optimizer, gather_weights, slots)
    params, opt_state, grad_norm, (loss, per_direction, counts, final) = step
    average = state.average
    if average is not None:
        average = updated(average, params["bilm"], cfg.weight_average_decay, state.step)
    new_state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state, lstm=jax.lax.stop_gradient(final), average=average
    )
    metrics = {
        "loss": loss,
        "forward_loss": per_direction[0],
        "backward_loss": per_direction[1],
        "grad_norm": grad_norm,
        "tokens": jnp.sum(counts),
    }
    return new_state, metrics


def eval_step_fn(
    params: dict,
    lstm: LSTMState,
    batch: dict[str, jax.Array],
    *,
    cfg: StepConfig,
    content_positions: int | None = None,
    gather_weights=None,
):
    """Full-softmax cross-entropy sums and token counts (D,) of one heldout window, and the carried state
    (the keyword arguments as for `train_step_fn`; the char CNN runs over every token)."""
    cfg = dataclasses.replace(cfg, compute=cfg.compute.with_positions(content_positions))
    sums, counts, final = _lm_pass(params, cfg, batch, lstm, (None, None), train=False, gather=gather_weights)
    return sums, counts, final


# Jitted on whatever device their arguments are on (one device); the trainer uses `jitted_steps.jit_steps`.
train_step = jax.jit(
    train_step_fn, static_argnames=("cfg", "optimizer", "content_positions", "distinct_tokens"), donate_argnums=(0,)
)
eval_step = jax.jit(eval_step_fn, static_argnames=("cfg", "content_positions"))
