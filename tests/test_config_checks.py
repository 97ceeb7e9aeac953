"""Every key of configs/default.py given a value that cannot work: `train.py` refuses it in one line naming
`--config.KEY`, exit 1, before anything is created on disk (not the workdir, its lock, data/ or a cache).

The runs use configs/tiny.py (default.py's keys, a tiny model) on a one-line corpus for 2 steps, so a
value that slips through costs a test seconds, not a 4096-cell training run.

The table below must hold a bad value for every key the default config has, so a key added without a
check (or without a row here) fails `test_every_key_has_a_bad_value`. Each run is in-process
(`tests/support/inprocess.py`); the refusals come from `elmo_jax/training/settings.py:check_config`.
"""

from __future__ import annotations

import os

import pytest

from configs import default
from tests.support.commands import error_line
from tests.support.inprocess import run_in_process

# A sentence file and an empty vocabulary are made in the test's directory: {dir} is replaced by it.
TRAIN_FILE = "{dir}/inputs/train.txt"
BASE_FLAGS = {"data.train_files": TRAIN_FILE, "num_train_steps": "2"}

# key -> (the bad value on the command line, other flags it needs to be read at all)
BAD_VALUES: dict[str, tuple[str, dict[str, str]]] = {
    "seed": ("-1", {}),
    "model.char_embed_dim": ("0", {}),
    "model.filters": ("((0, 4),)", {}),
    "model.n_highway": ("-1", {}),
    "model.activation": ("sigmoid", {}),
    "model.max_characters_per_token": ("2", {}),
    "model.lstm_dim": ("0", {}),
    "model.projection_dim": ("32", {}),  # more than tiny's lstm_dim 16
    "model.n_layers": ("0", {}),
    "model.cell_clip": ("-1", {}),
    "model.proj_clip": ("0", {}),
    "model.use_skip_connections": ("maybe", {}),
    "data.train_files": ("{dir}/inputs/none-*.txt", {}),
    "data.heldout_files": ("{dir}/inputs/none-*.txt", {}),
    "data.tfds_name": ("no_such_dataset", {"data.train_files": ""}),
    "data.tfds_data_dir": ("{dir}/tfds", {}),  # set without a dataset to read from it
    "data.tfds_train_split": ("validation", {}),  # the same
    "data.tfds_heldout_split": ("validation", {}),
    "data.vocab_file": ("{dir}/inputs/empty_vocab.txt", {}),
    "data.min_count": ("0", {}),
    "data.max_vocab_size": ("2", {}),  # fewer than <S>, </S>, <UNK>
    "data.max_line_chars": ("-1", {}),
    "data.invalid_utf8": ("ignore", {}),
    "data.characters": ("unicode", {}),  # bytes or corpus
    "data.cache_dir": (TRAIN_FILE, {}),  # a file
    "batch_size": ("0", {}),
    "unroll_steps": ("0", {}),
    "num_train_steps": ("0", {}),
    "optimizer": ("sgd", {}),
    "learning_rate": ("nan", {}),
    "adagrad_initial_accumulator": ("0", {}),
    "clip_norm": ("-1", {}),
    "dropout": ("1.0", {}),
    "loss_scale_by_unroll": ("maybe", {}),
    "state_reset_probability": ("1.5", {}),
    "weight_average_decay": ("1.0", {}),  # 1 would never move from the initial weights
    "n_negative_samples": ("0", {}),
    "negative_sample_group_rows": ("3", {}),  # does not divide tiny's batch_size 8
    "full_softmax": ("maybe", {}),
    "softmax_chunk": ("0", {}),
    "compute_dtype": ("float16", {}),
    "scan_unroll": ("0", {}),
    "distinct_tokens": ("maybe", {}),
    "max_nonfinite_steps": ("-1", {}),
    "compilation_cache": ("off", {}),  # "none" turns it off: "off" would be taken for a directory
    "checkpoint_every_steps": ("0", {}),
    "keep_checkpoints": ("0", {}),
    "eval_every_steps": ("-1", {}),
    "eval_max_batches": ("-1", {}),
    "log_every_steps": ("0", {}),
    "export_extractor": ("maybe", {}),
    "init_from": ("{dir}/no_such_run", {}),
    "init_from_optimizer": ("maybe", {}),
    "mesh.data": ("0", {}),
    "mesh.model": ("-2", {}),
}

# More bad values for some keys (issue #50, item 4): name -> (key, bad value, other flags). Both were
# refused only after the workdir and its lock existed, the cache_dir as a raw errno naming no key.
MORE_BAD_VALUES: dict[str, tuple[str, str, dict[str, str]]] = {
    "data.cache_dir under a file": ("data.cache_dir", TRAIN_FILE + "/cache", {}),
    "data.heldout_files the training file": ("data.heldout_files", TRAIN_FILE, {}),
    "data.heldout_files a glob matching a training file": ("data.heldout_files", "{dir}/inputs/t*.txt", {}),
}


def _keys(config, prefix="") -> list[str]:
    """The dotted names of every leaf of a ConfigDict."""
    keys = []
    for name, value in config.items():
        if hasattr(value, "items"):
            keys += _keys(value, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def test_every_key_has_a_bad_value():
    assert sorted(BAD_VALUES) == sorted(_keys(default.get_config()))


def _tree(top) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, dirs, files in os.walk(top) for f in dirs + files)


CASES = {**{key: (key, *bad) for key, bad in BAD_VALUES.items()}, **MORE_BAD_VALUES}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_value_is_refused_naming_its_key_before_anything_is_created(case, tmp_path):
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "train.txt").write_text("a sentence to train on .\n", encoding="utf-8")
    (tmp_path / "inputs" / "empty_vocab.txt").write_text("", encoding="utf-8")
    before = _tree(tmp_path)
    key, value, context = CASES[case]
    flags = {**BASE_FLAGS, **context, key: value}
    result = run_in_process(
        "train.py",
        "--config=configs/tiny.py",
        f"--workdir={tmp_path / 'workdir'}",
        *(f"--config.{k}={v.format(dir=tmp_path)}" for k, v in flags.items()),
    )
    line = error_line(result)
    assert line.startswith(f"error: --config.{key}"), line
    assert _tree(tmp_path) == before
