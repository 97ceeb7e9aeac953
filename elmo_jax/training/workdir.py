"""A training run's working directory: created only once the settings that can be checked cheaply have
passed, so a mistake leaves nothing behind.

    WORKDIR/
      checkpoints/<step>/   orbax checkpoints (state, data stream position, meta)
      metrics.jsonl         one JSON object per logged step and evaluation
      tensorboard/          TensorBoard event files
      vocab.txt             the vocabulary the run trains with (unless config.data.vocab_file)
      data/                 prepared corpora (unless config.data.cache_dir)
      export/               the model directory written when training ends
"""

from __future__ import annotations

import os

import ml_collections

from elmo_jax.data.training_corpus import check_data


def make_workdir(workdir: str, config: ml_collections.ConfigDict) -> None:
    """Creates `workdir` once the data settings have passed their cheap checks; errors name --workdir."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(f"--workdir={workdir}: is a file, expected a directory")
    check_data(config.data)
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise type(e)(e.errno, f"cannot create --workdir={workdir}: {e.strerror}") from None
