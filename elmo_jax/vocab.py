"""Count a corpus into a vocabulary file in bilm-tf's format (`<S>`, `</S>`, `<UNK>`, then words by
descending frequency; see `elmo_jax.formats.vocab_file`).

    python -m elmo_jax.vocab --files='corpus/news.en-*' --output=vocab.txt --min_count=3
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from elmo_jax import cli
from elmo_jax.data import text_files
from elmo_jax.data.vocab_builder import build_vocab, check_size_args, count_tokens
from elmo_jax.formats.output_paths import check_output
from elmo_jax.formats.vocab_file import SPECIALS, VOCABULARY

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
    for name in ("files", "output"):
        if not getattr(FLAGS, name):
            raise ValueError(f"--{name} is required")
    output = FLAGS.output
    # Before the (long) count, not after it: the output rules, with the corpus files as inputs.
    check_output(output, VOCABULARY, overwrite=FLAGS.overwrite, inputs=text_files.expand_glob(FLAGS.files))
    check_size_args(FLAGS.min_count, FLAGS.max_size)
    counts, stats = count_tokens(
        FLAGS.files, max_line_chars=FLAGS.max_line_chars, invalid_utf8=FLAGS.invalid_utf8, log_every=FLAGS.log_every
    )
    vocab = build_vocab(counts, FLAGS.min_count, FLAGS.max_size)
    vocab.save(output)
    kept = len(vocab) - len(SPECIALS)
    print(stats.summary())
    print(
        f"types: {len(counts)} seen, {kept} kept, {len(counts) - kept} dropped "
        f"(min_count={FLAGS.min_count}, max_size={FLAGS.max_size}); "
        f"wrote {len(vocab)} entries ({kept} + {', '.join(SPECIALS)}) to {output}"
    )


def main(argv: Sequence[str]) -> None:
    cli.run_main(run, list(argv), hint="; pass the corpus with --files=GLOB")


if __name__ == "__main__":
    cli.start(main, define_flags)
