"""Heldout perplexity of a trained biLM, with the full softmax.

    python -m elmo_jax.evaluate --workdir=DIR --files='heldout/*.txt'
    python -m elmo_jax.evaluate --workdir=DIR --tfds_name=lm1b --split=test [--tfds_data_dir=...]
    python -m elmo_jax.evaluate --workdir=DIR                       # the run's own heldout data

Reads the newest checkpoint of a training workdir (its config and vocabulary come with it) and prints
one JSON line: forward_perplexity, backward_perplexity, perplexity (exp of the mean of the two
cross-entropies, as bilm-tf reports it), cross_entropy and tokens. Each of the `--batch_size` rows
reads its share of the sentences in order, from a zero LSTM state carried across windows.
"""

from __future__ import annotations

import json

from absl import flags

from elmo_jax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("workdir", None, "Training workdir with checkpoints and vocab.txt.")
    flags.DEFINE_list("files", None, "Glob(s) of heldout text, one tokenized sentence per line.")
    flags.DEFINE_string("tfds_name", None, "A prepared TFDS dataset with a 'text' feature, e.g. lm1b.")
    flags.DEFINE_string("split", "test", "TFDS split with --tfds_name.")
    flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir with --tfds_name.")
    flags.DEFINE_integer("batch_size", 0, "Rows per window (0: the training batch size).")
    flags.DEFINE_integer("max_batches", 0, "Stop after this many windows (0: all).")
    cli.define_compilation_cache_flag()


def run() -> dict:
    from elmo_jax.data.training_corpus import heldout_sentences
    from elmo_jax.formats.vocab_file import Vocab
    from elmo_jax.training.heldout import heldout_perplexity
    from elmo_jax.training.start import load_trained

    params, cfg, config, vocab_file, step = load_trained(FLAGS.workdir)
    vocab = Vocab.load(vocab_file)  # training.start gives the run's vocabulary as a path
    sentences = heldout_sentences(
        config.data,
        FLAGS.workdir,
        files=FLAGS.files,
        tfds_name=FLAGS.tfds_name,
        split=FLAGS.split,
        tfds_data_dir=FLAGS.tfds_data_dir,
    )
    batch_size = FLAGS.batch_size or config.batch_size
    result = {"step": step, **heldout_perplexity(params, cfg, sentences, vocab, batch_size, FLAGS.max_batches)}
    print(json.dumps(result))
    return result


def main(argv) -> None:
    cli.run_main(run, argv, check=lambda: cli.require("workdir"))


def start() -> None:
    """The command: `elmo-evaluate` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.evaluate`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
