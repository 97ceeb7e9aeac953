"""The tiny training config of the tests: configs/tiny.py on a test corpus, as a ConfigDict for
`train_and_evaluate` or as `train.py` flags."""

from __future__ import annotations

import ml_collections

from configs import tiny

# Tracing and serializing the export's extractor.jax costs a training run in a test about 2 CPU-seconds;
# runs leave it out unless a test reads it (`export_extractor=True`).
TEST_DEFAULTS = {"export_extractor": False}


def tiny_config(corpus: dict, **overrides) -> ml_collections.ConfigDict:
    """configs/tiny.py reading `corpus` (see `corpora.write_agreement_corpus`), with `TEST_DEFAULTS`;
    `overrides` use dotted keys ("model.lstm_dim")."""
    config = tiny.get_config()
    config.data.train_files = corpus["train"]
    config.data.heldout_files = corpus["heldout"]
    config.data.cache_dir = corpus["cache_dir"]
    config.update_from_flattened_dict({**TEST_DEFAULTS, **overrides})
    return config


def tiny_flags(corpus: dict, workdir, **overrides) -> list[str]:
    """The `train.py` arguments of the same run: --config=configs/tiny.py, --workdir and --config.KEY flags."""
    values = {
        "data.train_files": corpus["train"],
        "data.heldout_files": corpus["heldout"],
        "data.cache_dir": corpus["cache_dir"],
        **TEST_DEFAULTS,
        **overrides,
    }
    return ["--config=configs/tiny.py", f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in values.items()]


def with_overrides(config: ml_collections.ConfigDict, **overrides) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted-key `overrides` (the original is left as it is)."""
    copy = config.copy_and_resolve_references()
    copy.update_from_flattened_dict(overrides)
    return copy


# The session's trained run (conftest's `trained_run`): N + M steps of configs/tiny.py, checkpoints at N, N + M.
TRAINED_STEPS = (160, 80)
