"""The pure, jittable parts of training: state, optimiser, one training step, one evaluation step.

`TrainState` holds everything that changes during training — parameters, Adagrad accumulators, the
step, the base RNG key and each row's carried LSTM state — as one pytree, so a checkpoint of it plus
the data stream's position resumes a run exactly. Per-step randomness is `fold_in(key, step)`:
nothing random depends on how often the process was restarted.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.lstm import LSTMState, zero_state
from elmo_jax.model.params import BiLMParams, init_params
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.training.lm import lm_losses, lm_outputs, reset_state
from elmo_jax.training.softmax import padded_vocab_size


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
    compute: ComputeOptions = ComputeOptions()  # its content_positions is set per batch (`train_step_fn`)


@flax.struct.dataclass
class TrainState:
    """Everything a training step reads and writes.

    Attributes:
      step: int32 () steps taken.
      params: {"bilm": BiLMParams.weights, "softmax": {"W": (V', P), "b": (V',)}}, V' the padded vocabulary.
      opt_state: the optimiser's state for params.
      key: uint32 (2,) raw base key (raw, so that checkpoints hold plain arrays).
      lstm: the carried `LSTMState` (D, L, B, ·) of every row of the global batch.
    """

    step: jax.Array
    params: dict
    opt_state: optax.OptState
    key: jax.Array
    lstm: LSTMState


@functools.lru_cache(maxsize=8)
def make_optimizer(learning_rate: float, initial_accumulator: float, clip_norm: float) -> optax.GradientTransformation:
    """bilm-tf's optimiser: global-norm clipping, then Adagrad (TF's: no epsilon).

    Cached: the jitted step takes the optimiser as a static argument, so the same settings must give the
    same object, or every run would compile the step again.
    """
    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adagrad(learning_rate, initial_accumulator_value=initial_accumulator, eps=0.0),
    )


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
    optimizer: optax.GradientTransformation,
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
    )


def step_keys(base_key: jax.Array, step: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """(dropout key, candidate key) of a training step: `split(fold_in(base_key, step))`.

    base_key: `TrainState.key` (raw uint32 (2,)). The candidate key is split once more per direction
    and folded with each group's index (`lm.lm_losses`).
    """
    k_dropout, k_sample = jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(base_key), step))
    return k_dropout, k_sample


def _lm_pass(params, cfg: StepConfig, batch, lstm: LSTMState, keys, *, train: bool, content_positions):
    """Outputs and per-direction (loss sums, counts) of one window; keys: (dropout key, candidate key)."""
    bilm = BiLMParams(weights=params["bilm"], config=cfg.model)
    k_dropout, k_sample = keys
    outputs, final = lm_outputs(
        bilm,
        batch["char_ids"],
        batch["mask"],
        reset_state(lstm, batch["carry"]),
        key=k_dropout,
        dropout_rate=cfg.dropout if train else 0.0,
        compute=cfg.compute.with_positions(content_positions),
        resets=batch.get("reset"),
    )
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
    )
    return sums, counts, final


def train_step_fn(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    cfg: StepConfig,
    optimizer: optax.GradientTransformation,
    content_positions: int | None = None,
):
    """One optimisation step on one window of both directions (pure; `train_step` is it jitted on one
    device, `jitted_steps.jit_steps` jitted for a mesh).

    Args:
      state: donated; the new state replaces it.
      batch: {"char_ids": int (D, B, T, C) raw, "targets": int (D, B, T), "mask": bool (D, B, T),
        "carry": bool (D, B), optionally "reset": bool (D, B, T)}.

    Returns:
      (new state, metrics): loss (mean of the directions' mean cross-entropies), forward_loss,
      backward_loss, grad_norm (before clipping), tokens (targets scored in both directions).
    """
    keys = step_keys(state.key, state.step)

    def loss_fn(params):
        sums, counts, final = _lm_pass(
            params, cfg, batch, state.lstm, keys, train=True, content_positions=content_positions
        )
        per_direction = sums / jnp.maximum(counts, 1.0)
        loss = jnp.mean(per_direction)
        # bilm-tf differentiates loss * unroll_steps, which matters with clipping and Adagrad.
        scaled = loss * cfg.unroll_steps if cfg.loss_scale_by_unroll else loss
        return scaled, (loss, per_direction, counts, final)

    grads, (loss, per_direction, counts, final) = jax.grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state, lstm=jax.lax.stop_gradient(final)
    )
    metrics = {
        "loss": loss,
        "forward_loss": per_direction[0],
        "backward_loss": per_direction[1],
        "grad_norm": optax.tree.norm(grads),
        "tokens": jnp.sum(counts),
    }
    return new_state, metrics


def eval_step_fn(
    params: dict, lstm: LSTMState, batch: dict[str, jax.Array], *, cfg: StepConfig, content_positions: int | None = None
):
    """Full-softmax cross-entropy sums and token counts (D,) of one heldout window, and the carried state."""
    sums, counts, final = _lm_pass(
        params, cfg, batch, lstm, (None, None), train=False, content_positions=content_positions
    )
    return sums, counts, final


# Jitted on whatever device their arguments are on (one device); the trainer uses `jitted_steps.jit_steps`.
train_step = jax.jit(train_step_fn, static_argnames=("cfg", "optimizer", "content_positions"), donate_argnums=(0,))
eval_step = jax.jit(eval_step_fn, static_argnames=("cfg", "content_positions"))
