"""Download and prepare the 1B Word Benchmark (TFDS's `lm1b`) for training, without TensorFlow or TFDS.

    python -m elmo_jax.prepare_lm1b --data_dir=/data/lm1b
    elmo-train --config=bilm_large:/data/lm1b --workdir=... --config.data.vocab_file=VOCAB

Downloads the archive from statmt.org (~1.7 GB; `--source` takes a downloaded copy or another URL),
extracts its 99 training and 50 heldout files (~4.2 GB) and writes them as ArrayRecord shards (their
size: bench/RESULTS.md, "Design figures") in bounded memory (`elmo_jax.data.lm1b`), then prints the
training flags that read them. Each step is skipped when already complete, so re-running after an
interruption continues. `--data_dir` may be gs://BUCKET/DIR: the work is done on local disk ($TMPDIR)
and the text and the shards uploaded (`elmo_jax.data.lm1b`); train once the command has finished.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from elmo_jax import cli, storage
from elmo_jax.data import lm1b, text_files

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string(
        "data_dir", None, "Directory (or gs://BUCKET/DIR) for the archive, the text files and the prepared shards."
    )
    flags.DEFINE_string("source", lm1b.URL, "URL of the archive, or the path of a downloaded copy.")
    flags.DEFINE_integer(
        "max_line_chars", 100_000, "Skip (and count) longer lines; as config.data.max_line_chars of the training run."
    )
    flags.DEFINE_enum(
        "invalid_utf8",
        "replace",
        list(text_files.INVALID_UTF8_POLICIES),
        "Lines with invalid UTF-8: keep with U+FFFD (replace) or drop (skip); as config.data.invalid_utf8.",
    )


def check_flags() -> None:
    """--data_dir is given, and is (or can become) a directory: refused before anything is downloaded."""
    cli.require("data_dir")
    data_dir = FLAGS.data_dir
    if storage.lexists(data_dir) and not storage.isdir(data_dir):
        raise NotADirectoryError(f"--data_dir={data_dir}: a file, not a directory")
    if not storage.lexists(data_dir) and (problem := storage.creation_problem(data_dir, parents=True)):
        raise type(problem)(f"--data_dir={data_dir}: cannot create it: {problem}")


def run() -> None:
    corpus = lm1b.prepare_lm1b(
        FLAGS.data_dir,
        source=FLAGS.source,
        max_line_chars=FLAGS.max_line_chars or None,
        invalid_utf8=FLAGS.invalid_utf8,
    )
    print(lm1b.report(FLAGS.data_dir, corpus))


def main(argv: Sequence[str]) -> None:
    cli.run_main(run, list(argv), check=check_flags)


def start() -> None:
    """The command: `elmo-prepare-lm1b` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.prepare_lm1b`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
