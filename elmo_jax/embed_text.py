"""Embed a few sentences from the command line with a published-format ELMo model.

    python -m elmo_jax.embed_text --model=runs/demo/export "The bank of the river ." ...
    python -m elmo_jax.embed_text --model=small "The bank of the river ." ...    # a published model by name
    python -m elmo_jax.embed_text --options=OPTIONS.json --weights=WEIGHTS.hdf5 "The bank of the river ." ...
    echo "one sentence per line" | python -m elmo_jax.embed_text --model=MODEL_DIR

Tokens are split on whitespace. Prints the layers' shapes and what ELMo adds to a word vector: for each
word that occurs more than once, how similar its vectors are across its occurrences, layer by layer (the
token layer gives a word one vector wherever it occurs; the LSTM layers one per context:
`analysis/word_contexts.py`). With --output it writes `layers` (B, L+1, T, 2P) float32 and `mask` (B, T)
to an .npz file (written to a temporary name and renamed; an existing file is replaced only with
--overwrite, and only if it is such an .npz). --model and --output may be gs://BUCKET/PATH (the output is
written locally, then uploaded). For whole files (AllenNLP-style HDF5 output, length bucketing), use
`python -m elmo_jax.embed_file`.
"""

from __future__ import annotations

import sys

from absl import flags

from elmo_jax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    cli.define_model_flags()
    flags.DEFINE_string("output", None, "Optional .npz file for the layers and mask.")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --output, if it is an .npz of layers and mask.")
    flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "Matmul precision.")


def read_sentences(argv: list[str]) -> list[list[str]]:
    lines = argv if argv else sys.stdin.read().splitlines()
    sentences = [line.split() for line in lines if line.strip()]
    if not sentences:
        raise ValueError("no sentences: pass them as arguments or one per line on standard input")
    return sentences


def run(argv: list[str]) -> None:
    import numpy as np

    import elmo_jax  # after flag parsing, so --help is fast
    from elmo_jax.analysis import word_contexts
    from elmo_jax.formats import layers_npz
    from elmo_jax.formats.model_source import ModelSource

    model = ModelSource(FLAGS.model, FLAGS.options, FLAGS.weights)
    if FLAGS.output:  # checked before the model is loaded
        layers_npz.check_target(FLAGS.output, FLAGS.overwrite, inputs=model.paths)
    sentences = read_sentences(argv[1:])
    params = model.load()
    from elmo_jax.model.vocabulary import token_vocabulary

    ids = token_vocabulary(params).batch_ids(sentences)  # the model's text -> ids
    layers, mask = elmo_jax.embed(params, ids, compute_dtype=FLAGS.compute_dtype)
    layers, mask = np.asarray(layers), np.asarray(mask)
    print(word_contexts.describe(sentences, layers, mask))
    if FLAGS.output:
        layers_npz.write_npz(FLAGS.output, layers, mask)
        print(f"wrote {FLAGS.output}")


def main(argv: list[str]) -> None:
    cli.run_main(lambda: run(argv))  # the arguments are the sentences


def start() -> None:
    """The command: `elmo-embed-text` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.embed_text`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
