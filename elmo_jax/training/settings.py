"""What a training config (`configs/default.py`) means: the biLM architecture, the static settings of
the jitted steps, the optimiser, and the checks every key must pass before a run writes anything.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import ml_collections

from elmo_jax import storage
from elmo_jax.data import char_vocabulary
from elmo_jax.data.text_files import INVALID_UTF8_POLICIES
from elmo_jax.data.training_corpus import data_problems
from elmo_jax.formats.model_source import names_published_model
from elmo_jax.formats.published_models import names_text
from elmo_jax.formats.vocab_file import SPECIALS
from elmo_jax.model.config import BiLMConfig, InvalidBiLMConfig
from elmo_jax.model.precision import COMPUTE_DTYPES, ComputeOptions
from elmo_jax.storage import compile_cache
from elmo_jax.training.optimizers import ADAGRAD, OPTIMIZERS, Optimizer
from elmo_jax.training.train_step import StepConfig


def model_config(config: ml_collections.ConfigDict) -> BiLMConfig:
    """The biLM architecture of `config.model` (its keys are `BiLMConfig`'s fields)."""
    return BiLMConfig(**config.model)


def step_config(config: ml_collections.ConfigDict, vocab_size: int, characters: list[str] | None = None) -> StepConfig:
    """The static settings of the train and eval steps for a vocabulary of `vocab_size` words, and for a
    model that reads its own `characters` (`data.characters` "corpus"; None: UTF-8 bytes): the model's
    character fields and its text -> ids (`data.char_vocabulary`)."""
    model, vocabulary = model_config(config), None
    if characters is not None:
        model = dataclasses.replace(model, **char_vocabulary.model_fields(characters))
        vocabulary = char_vocabulary.token_vocabulary(model, characters)
    return StepConfig(
        model=model,
        vocabulary=vocabulary,
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
        # Configs saved before the key existed evaluated and exported the last step's weights.
        weight_average_decay=config.get("weight_average_decay", 0.0),
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


def check_config(config: ml_collections.ConfigDict, *, sources: bool = True) -> None:
    """Every key of a training config, checked before a run creates anything: the numbers, switches
    and names, the architecture (by building the `BiLMConfig`), the files, datasets and directory the
    data section and init_from name (that they exist and are what they should be: cheap checks, not
    their contents).

    Args:
      config: a training config.
      sources: also check the files, dataset and directories it names (False: the values only, for a
        config meant for another machine).

    Raises:
      ValueError: one line naming the first key at fault (`--config.KEY`), its value and what is
        expected (tests/test_config_checks.py feeds every key of configs/default.py a bad value).
    """
    problem = next(_config_problems(config, sources), None)
    if problem is not None:
        raise ValueError(problem)


# The integer keys that must be at least 1, and those that may be 0 (a feature off, or none).
_POSITIVE_KEYS = (
    "num_train_steps",
    "batch_size",
    "unroll_steps",
    "checkpoint_every_steps",
    "log_every_steps",
    "keep_checkpoints",
    "n_negative_samples",
    "softmax_chunk",
    "scan_unroll",
    "data.min_count",
)
_ZERO_OR_MORE_KEYS = (
    "eval_every_steps",
    "eval_max_batches",
    "max_nonfinite_steps",
    "negative_sample_group_rows",
    "seed",
    "data.max_vocab_size",
    "data.max_line_chars",
)


def _config_problems(config, sources: bool = True) -> Iterator[str]:
    """One line per problem of a training config, in the order `check_config` reports the first: the
    integers, the other numbers, the choices, the architecture, then (with `sources`) the data section's
    files and dataset and init_from. Lazy, so that a later check may assume the keys an earlier one
    checked are well typed."""
    yield from _integer_problems(config)
    yield from _number_problems(config)
    yield from _choice_problems(config)
    yield from _model_problems(config)
    if sources:
        yield from data_problems(config.data)
        if config.init_from:
            yield from _init_from_problems(config.init_from)


def _bad(config, key: str, expected: str) -> str:
    """The line for a key whose value is not what is `expected`."""
    return f"--config.{key}={_value(config, key)!r}: expected {expected}"


def _integer_problems(config) -> Iterator[str]:
    """The integer keys that are not integers, or below their least value."""
    for keys, least, wording in (
        (_POSITIVE_KEYS, 1, "must be at least 1"),
        (_ZERO_OR_MORE_KEYS, 0, "must be 0 (off) or positive"),
    ):
        for key in keys:
            value = _value(config, key)
            if not _is_int(value):
                yield _bad(config, key, f"an integer >= {least}")
            elif value < least:
                yield f"--config.{key} {wording}, found {value}"


def _number_problems(config) -> Iterator[str]:
    """The rates, probabilities and the candidate draw's group size that are out of their range."""
    for key in ("learning_rate", "adagrad_initial_accumulator", "clip_norm"):
        if not _is_finite(_value(config, key)) or _value(config, key) <= 0:
            yield _bad(config, key, "a finite number > 0")
    if not _is_finite(config.dropout) or not 0.0 <= config.dropout < 1.0:
        yield _bad(config, "dropout", "a number in [0, 1) (the fraction of each LSTM input dropped)")
    if not _is_finite(config.state_reset_probability) or not 0.0 <= config.state_reset_probability <= 1.0:
        yield _bad(config, "state_reset_probability", "a probability in [0, 1]")
    decay = config.weight_average_decay
    if not _is_finite(decay) or not 0.0 <= decay < 1.0:
        yield _bad(
            config, "weight_average_decay", "a number in [0, 1) (0: evaluate and export the last step's weights)"
        )
    group = config.negative_sample_group_rows
    if _is_int(group) and group > 0 and _is_int(config.batch_size) and config.batch_size % group:
        yield _bad(
            config,
            "negative_sample_group_rows",
            f"0 (one candidate draw for the batch) or a divisor of --config.batch_size={config.batch_size}",
        )


def _choice_problems(config) -> Iterator[str]:
    """The switches, names and mesh axes that are not one of the values they take."""
    if not isinstance(config.init_from_optimizer, bool):
        yield _bad(config, "init_from_optimizer", "True (continue the source workdir's Adagrad accumulators) or False")
    if not isinstance(config.export_extractor, bool):
        yield _bad(config, "export_extractor", "True (the export includes extractor.jax) or False")
    for key in ("loss_scale_by_unroll", "full_softmax", "distinct_tokens"):
        if not isinstance(config[key], bool):
            yield _bad(config, key, "True or False")
    if config.optimizer not in OPTIMIZERS:
        yield _bad(config, "optimizer", f"one of {', '.join(OPTIMIZERS)}")
    if expected := compile_cache.setting_problem(config.get("compilation_cache")):
        yield _bad(config, "compilation_cache", expected)
    if config.compute_dtype not in COMPUTE_DTYPES:
        yield _bad(config, "compute_dtype", f"one of {', '.join(COMPUTE_DTYPES)}")
    if config.data.invalid_utf8 not in INVALID_UTF8_POLICIES:
        yield _bad(config, "data.invalid_utf8", f"one of {', '.join(INVALID_UTF8_POLICIES)}")
    if 0 < config.data.max_vocab_size < len(SPECIALS):
        yield _bad(
            config, "data.max_vocab_size", f"0 (all) or at least {len(SPECIALS)} (it counts {', '.join(SPECIALS)})"
        )
    for key in ("mesh.data", "mesh.model"):
        if not _is_int(_value(config, key)) or (_value(config, key) < 1 and _value(config, key) != -1):
            yield _bad(config, key, "a positive integer, or -1 (the devices left by the other axis)")


_MODEL_INTEGERS = ("char_embed_dim", "n_highway", "max_characters_per_token", "lstm_dim", "projection_dim", "n_layers")


def _model_problems(config) -> Iterator[str]:
    """The architecture's keys of the wrong type, then what building the `BiLMConfig` finds, each
    naming the key to change."""
    for key in _MODEL_INTEGERS:
        if not _is_int(config.model[key]):
            yield _bad(config, f"model.{key}", "an integer")
            return
    for key in ("cell_clip", "proj_clip"):
        if config.model[key] is not None and not _is_finite(config.model[key]):
            yield _bad(config, f"model.{key}", "a finite number > 0, or None (no clip)")
            return
    if not isinstance(config.model.use_skip_connections, bool):
        yield _bad(config, "model.use_skip_connections", "True or False")
    filters = config.model.filters
    if not isinstance(filters, (list, tuple)) or not all(
        isinstance(f, (list, tuple)) and len(f) == 2 and all(map(_is_int, f)) for f in filters
    ):
        yield _bad(config, "model.filters", "((width, n_filters), ...), integers, e.g. ((1, 32), (2, 32))")
        return
    try:
        model_config(config)
    except InvalidBiLMConfig as e:
        key, text = e.problems[0]
        yield f"--config.model.{key}={_value(config, f'model.{key}')!r}: {text}"
    except (TypeError, ValueError) as e:  # e.g. a key BiLMConfig does not have
        yield f"--config.model: {e}"


def init_from_problem(source: str) -> str | None:
    """Why `init_from` cannot be a start (it names no directory, nor a published model), or None."""
    if names_published_model(source):
        return None
    if not storage.isdir(source):
        return (
            f"--config.init_from={source}: not a directory (expected a training workdir, "
            f"a model directory with options.json and weights.hdf5, or a published model: {names_text()})"
        )
    return None


def _init_from_problems(source) -> Iterator[str]:
    if not isinstance(source, str):
        yield f"--config.init_from={source!r}: expected a string (a directory, or a published model's name)"
    elif (problem := init_from_problem(source)) is not None:
        yield problem


def _value(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
