"""What a training config (`configs/default.py`) means: the biLM architecture, the static settings of
the jitted steps, the optimiser, and the checks every key must pass before a run writes anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import ml_collections

from elmo_jax.data.text_files import INVALID_UTF8_POLICIES
from elmo_jax.formats.vocab_file import SPECIALS
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.precision import COMPUTE_DTYPES, ComputeOptions
from elmo_jax.training.optimizers import ADAGRAD, OPTIMIZERS, Optimizer
from elmo_jax.training.train_step import StepConfig


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
        # Configs saved before the key existed drew one set per batch.
        negative_sample_group_rows=config.get("negative_sample_group_rows", 0),
        full_softmax=config.full_softmax,
        softmax_chunk=config.softmax_chunk,
        loss_scale_by_unroll=config.loss_scale_by_unroll,
        compute=ComputeOptions(dtype=config.compute_dtype, unroll=config.scan_unroll),
    )


def optimizer(config: ml_collections.ConfigDict) -> Optimizer:
    """The optimiser `config.optimizer` names, with the config's learning rate, clipping norm and Adagrad
    start: the only reading of these keys (`optimizers` builds the transformation). Configs saved before
    the key existed trained with Adagrad."""
    return Optimizer(
        name=config.get("optimizer", ADAGRAD),
        learning_rate=config.learning_rate,
        clip_norm=config.clip_norm,
        initial_accumulator=config.adagrad_initial_accumulator,
    )


def check_config(config: ml_collections.ConfigDict) -> None:
    """Every numeric and enum key of a training config, checked before a run creates anything.

    Raises:
      ValueError: one line naming the first key at fault (`--config.KEY`), its value and what is
        expected. The architecture is checked by building the `BiLMConfig`.
    """
    problem = next(_config_problems(config), None)
    if problem is not None:
        raise ValueError(problem)


def _config_problems(config) -> Iterator[str]:
    def bad(key: str, expected: str) -> str:
        return f"--config.{key}={_value(config, key)!r}: expected {expected}"

    positive = (
        "num_train_steps",
        "batch_size",
        "unroll_steps",
        "checkpoint_every_steps",
        "log_every_steps",
        "keep_checkpoints",
        "n_negative_samples",
        "softmax_chunk",
        "scan_unroll",
    )
    zero_or_more = (
        "eval_every_steps",
        "eval_max_batches",
        "max_nonfinite_steps",
        "negative_sample_group_rows",
        "seed",
        "data.min_count",
        "data.max_vocab_size",
        "data.max_line_chars",
    )
    for keys, least, wording in ((positive, 1, "must be at least 1"), (zero_or_more, 0, "must be 0 (off) or positive")):
        for key in keys:
            value = _value(config, key)
            if not _is_int(value):
                yield bad(key, f"an integer >= {least}")
            elif value < least:
                yield f"--config.{key} {wording}, found {value}"
    for key in ("learning_rate", "adagrad_initial_accumulator", "clip_norm"):
        if not _is_finite(_value(config, key)) or _value(config, key) <= 0:
            yield bad(key, "a finite number > 0")
    if not _is_finite(config.dropout) or not 0.0 <= config.dropout < 1.0:
        yield bad("dropout", "a number in [0, 1) (the fraction of each LSTM input dropped)")
    if not _is_finite(config.state_reset_probability) or not 0.0 <= config.state_reset_probability <= 1.0:
        yield bad("state_reset_probability", "a probability in [0, 1]")
    group = config.negative_sample_group_rows
    if _is_int(group) and group > 0 and _is_int(config.batch_size) and config.batch_size % group:
        yield bad(
            "negative_sample_group_rows",
            f"0 (one candidate draw for the batch) or a divisor of --config.batch_size={config.batch_size}",
        )
    if not isinstance(config.init_from_optimizer, bool):
        yield bad("init_from_optimizer", "True (continue the source workdir's Adagrad accumulators) or False")
    if not isinstance(config.export_extractor, bool):
        yield bad("export_extractor", "True (the export includes extractor.jax) or False")
    if config.optimizer not in OPTIMIZERS:
        yield bad("optimizer", f"one of {', '.join(OPTIMIZERS)}")
    if config.compute_dtype not in COMPUTE_DTYPES:
        yield bad("compute_dtype", f"one of {', '.join(COMPUTE_DTYPES)}")
    if config.data.invalid_utf8 not in INVALID_UTF8_POLICIES:
        yield bad("data.invalid_utf8", f"one of {', '.join(INVALID_UTF8_POLICIES)}")
    if 0 < config.data.max_vocab_size < len(SPECIALS):
        yield bad("data.max_vocab_size", f"0 (all) or at least {len(SPECIALS)} (it counts {', '.join(SPECIALS)})")
    for key in ("mesh.data", "mesh.model"):
        if not _is_int(_value(config, key)) or (_value(config, key) < 1 and _value(config, key) != -1):
            yield bad(key, "a positive integer, or -1 (the devices left by the other axis)")
    try:
        model_config(config)
    except (TypeError, ValueError) as e:
        yield f"--config.model: {e}"


def _value(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
