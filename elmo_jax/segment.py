"""Segment a text file written without spaces (Chinese, Japanese) into words separated by spaces: the
form training (`train.py`'s corpus, `python -m elmo_jax.vocab`) and `embed_file` read. One line out per
line in; the output appears whole or not at all.

    pip install rjieba          # Chinese; Japanese: sudachipy sudachidict-core (the segment extra)
    python -m elmo_jax.segment --language=zh --input=raw_zh.txt --output=corpus_zh.txt

Text that already has spaces between its words needs no segmenting (docs/SEGMENTATION.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from elmo_jax import cli

FLAGS = flags.FLAGS
LANGUAGES = ("zh", "ja")  # data.segmentation.SEGMENTERS (not imported before the flags are parsed)


def define_flags() -> None:
    """Defines the CLI flags; only when run as a program."""
    flags.DEFINE_string("input", None, "UTF-8 text file (local or gs://), one sentence or paragraph per line.")
    flags.DEFINE_string("output", None, "The segmented text file to write (replaced atomically).")
    flags.DEFINE_enum("language", None, list(LANGUAGES), "zh: Chinese (rjieba); ja: Japanese (SudachiPy).")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --output file.")


def check() -> None:
    """Refuses missing flags and a segmenter that is not installed, before any work."""
    cli.require("input", "output", "language")
    from elmo_jax.data.segmentation import find_segmenter

    find_segmenter(FLAGS.language)


def run() -> None:
    from elmo_jax.data.segmentation import segment_file

    print(segment_file(FLAGS.input, FLAGS.output, language=FLAGS.language, overwrite=FLAGS.overwrite))


def main(argv: Sequence[str]) -> None:
    cli.run_main(run, list(argv), hint="; pass the text with --input=FILE", check=check)


def start() -> None:
    """The command: `elmo-segment` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.segment`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
