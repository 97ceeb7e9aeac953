"""What a training config (`configs/default.py`) means: the biLM architecture, the static settings of
the jitted steps, the optimiser, and the checks its keys must pass before a run writes anything.
"""

from __future__ import annotations

import ml_collections
import optax

from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.training.train_step import StepConfig, make_optimizer


def model_config(config: ml_collections.ConfigDict) -> BiLMConfig:
    """The biLM architecture of `config.model` (its keys are `BiLMConfig`'s fields)."""
    return BiLMConfig(**config.model)


def step_config(config: ml_collections.ConfigDict, vocab_size: int) -> StepConfig:
    """The static settings of the train and eval steps for a vocabulary of `vocab_size` words."""
    return StepConfig(
        model=model_config(config),
        vocab_size=vocab_size,
        unroll_steps=config.unroll_steps,
        dropout=config.dropout,
        n_negative_samples=config.n_negative_samples,
        full_softmax=config.full_softmax,
        softmax_chunk=config.softmax_chunk,
        loss_scale_by_unroll=config.loss_scale_by_unroll,
        compute=ComputeOptions(dtype=config.compute_dtype, unroll=config.scan_unroll),
    )


def optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """bilm-tf's optimiser with the config's learning rate, Adagrad start and clipping norm."""
    return make_optimizer(config.learning_rate, config.adagrad_initial_accumulator, config.clip_norm)


def check_schedule(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the key unless the step counts and intervals can work."""
    for key in (
        "num_train_steps",
        "batch_size",
        "unroll_steps",
        "checkpoint_every_steps",
        "log_every_steps",
        "keep_checkpoints",
    ):
        if config[key] < 1:
            raise ValueError(f"--config.{key} must be at least 1, found {config[key]}")
    for key in ("eval_every_steps", "eval_max_batches", "max_nonfinite_steps"):
        if config[key] < 0:
            raise ValueError(f"--config.{key} must be 0 (off) or positive, found {config[key]}")
