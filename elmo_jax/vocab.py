"""Count a corpus into a vocabulary file in bilm-tf's format (`<S>`, `</S>`, `<UNK>`, then words by
descending frequency; see `elmo_jax.formats.vocab_file`).

    python -m elmo_jax.vocab --files='corpus/news.en-*' --output=vocab.txt --min_count=3
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from elmo_jax import cli
from elmo_jax.data import text_files

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines the CLI flags; only when run as a program, so importing `Vocab` adds no global flags."""
    flags.DEFINE_string("files", None, "Glob of corpus files, one whitespace-tokenized sentence per line.")
    flags.DEFINE_string("output", None, "Vocabulary file to write (replaced atomically).")
    flags.DEFINE_integer("min_count", 1, "Keep words seen at least this often.")
    flags.DEFINE_integer("max_size", None, "Total vocabulary size including <S>, </S>, <UNK>.")
    flags.DEFINE_integer("max_line_chars", text_files.DEFAULT_MAX_LINE_CHARS, "Skip (and count) longer lines.")
    flags.DEFINE_enum(
        "invalid_utf8",
        "replace",
        list(text_files.INVALID_UTF8_POLICIES),
        "Lines with invalid UTF-8: keep with U+FFFD (replace) or drop (skip).",
    )
    flags.DEFINE_integer("log_every", 1_000_000, "Log progress every this many lines.")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --output, if it is a vocabulary file.")


def run() -> None:
    from elmo_jax.data.vocab_builder import write_vocab_file

    summary = write_vocab_file(
        FLAGS.files,
        FLAGS.output,
        min_count=FLAGS.min_count,
        max_size=FLAGS.max_size,
        max_line_chars=FLAGS.max_line_chars,
        invalid_utf8=FLAGS.invalid_utf8,
        log_every=FLAGS.log_every,
        overwrite=FLAGS.overwrite,
    )
    print(summary)


def main(argv: Sequence[str]) -> None:
    cli.run_main(run, list(argv), hint="; pass the corpus with --files=GLOB")


def start() -> None:
    """The command: `elmo-vocab` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.vocab`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
