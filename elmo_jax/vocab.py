"""Word vocabulary in the bilm-tf file format, and building one from a corpus.

File format: UTF-8, one token per line; the line order gives the ids. `<S>`, `</S>` and `<UNK>` must
be present; bilm-tf writes them first (ids 0, 1, 2) followed by the words in descending frequency,
which the log-uniform negative sampler of the training softmax relies on. Files written by bilm-tf's
own tooling may contain a line `!!!MAXTERMID`; it is not a token, takes no id and is skipped.

    python -m elmo_jax.vocab --files='corpus/news.en-*' --output=vocab.txt --min_count=3

Reserved words in the text: a literal `<S>`, `</S>` or `<UNK>` token in the corpus is not counted as a
word (the three always sit at ids 0-2, whatever their frequency); `iter_sentences` reports how many
were seen and where. When encoded, such a token maps to the reserved id, as in bilm-tf.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Iterable, Sequence

import numpy as np
from absl import app, flags, logging

from elmo_jax import text_files

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIALS = (BOS, EOS, UNK)
MAX_TERM_ID = "!!!MAXTERMID"  # bilm-tf bookkeeping line, not a token


class Vocab:
    """An ordered word list with O(1) lookups; ids are positions in `words`.

    Attributes:
      words: the tokens in id order (V entries).
      bos_id, eos_id, unk_id: the ids of `<S>`, `</S>`, `<UNK>`.
    """

    def __init__(self, words: Sequence[str], *, source: str = "<vocab>", line_numbers: Sequence[int] | None = None):
        """Checks and indexes `words`.

        Args:
          words: the tokens in id order.
          source: names the origin in error messages (a file path when loaded).
          line_numbers: the file line of each word, for error messages; default 1..V.

        Raises:
          ValueError: an empty list, an empty token or one with whitespace inside, a duplicate
            (both places named), or a missing `<S>`/`</S>`/`<UNK>` (which one is named).
        """
        lines = list(line_numbers) if line_numbers is not None else list(range(1, len(words) + 1))
        if not words:
            raise ValueError(f"{source}: no tokens; expected one token per line, including {', '.join(SPECIALS)}")
        self._word_to_id: dict[str, int] = {}
        for index, (word, line) in enumerate(zip(words, lines)):
            if not isinstance(word, str) or not word or len(word.split()) != 1 or word != word.strip():
                raise ValueError(f"{source}:{line}: expected one token without whitespace, found {word!r}")
            first = self._word_to_id.setdefault(word, index)
            if first != index:
                raise ValueError(f"{source}:{line}: duplicate token {word!r}, first on line {lines[first]}")
        missing = [special for special in SPECIALS if special not in self._word_to_id]
        if missing:
            raise ValueError(f"{source}: missing {', '.join(missing)}; a vocabulary must contain "
                             f"{', '.join(SPECIALS)} (bilm-tf writes them as the first three lines)")
        self.words: list[str] = list(words)
        self.bos_id, self.eos_id, self.unk_id = (self._word_to_id[s] for s in SPECIALS)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocab:
        """Reads a bilm-tf vocabulary file (surrounding whitespace on a line is ignored, as in bilm-tf)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            raise IsADirectoryError(f"vocabulary {path} is a directory, expected a file with one token per line")
        if not os.path.exists(path):
            raise FileNotFoundError(f"vocabulary file {path} does not exist")
        words, lines = [], []
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    word = raw.decode("utf-8").strip()
                except UnicodeDecodeError as e:
                    raise ValueError(f"{path}:{number}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
                if word == MAX_TERM_ID:
                    continue
                words.append(word)
                lines.append(number)
        return cls(words, source=path, line_numbers=lines)

    def save(self, path: str | os.PathLike) -> None:
        """Writes one token per line; an existing file is only ever replaced by a complete new one."""
        text_files.write_text_atomic(path, "".join(word + "\n" for word in self.words))

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self._word_to_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.words == other.words

    def __repr__(self) -> str:
        return f"Vocab({len(self)} words: {' '.join(self.words[:6])}{' ...' if len(self) > 6 else ''})"

    def word_to_id(self, word: str) -> int:
        """The id of `word`; `unk_id` for a word not in the vocabulary."""
        return self._word_to_id.get(word, self.unk_id)

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Ids of `tokens` (T,) int32, OOV -> `unk_id`. No `<S>`/`</S>` are added."""
        lookup, unk = self._word_to_id.get, self.unk_id
        return np.fromiter((lookup(token, unk) for token in tokens), dtype=np.int32)


def count_tokens(files: text_files.Files, *, max_line_chars: int | None = text_files.DEFAULT_MAX_LINE_CHARS,
                 invalid_utf8: str = "replace", log_every: int = 1_000_000,
                 ) -> tuple[collections.Counter, text_files.ReadStats]:
    """Counts the tokens of a corpus in one streaming pass.

    Args:
      files: glob pattern(s) or paths (see `text_files.expand_glob`).
      max_line_chars, invalid_utf8: see `text_files.iter_sentences`.
      log_every: log progress (lines, lines/s) every this many lines.

    Returns:
      (counts, stats): token -> occurrences, without `<S>`, `</S>`, `<UNK>` (their literal
      occurrences are in `stats.reserved_tokens`); and what reading found.

    Raises:
      ValueError: bad arguments, or no sentence at all in the files.
    """
    stats = text_files.ReadStats()
    sentences = text_files.iter_sentences(files, max_line_chars=max_line_chars, invalid_utf8=invalid_utf8,
                                          stats=stats, reserved=SPECIALS)
    counts: collections.Counter = collections.Counter()
    start, next_log = time.perf_counter(), log_every
    for tokens in sentences:
        counts.update(tokens)
        if stats.lines >= next_log:
            elapsed = time.perf_counter() - start
            logging.info("counted %d lines, %d tokens, %d types (%.0f lines/s)", stats.lines, stats.tokens,
                         len(counts), stats.lines / max(elapsed, 1e-9))
            next_log += log_every
    for special in SPECIALS:
        counts.pop(special, None)
    if stats.sentences == 0:
        raise ValueError(f"no sentences in {files}: {stats.summary()}")
    return counts, stats


def build_vocab(counts: collections.Counter | dict[str, int], min_count: int = 1,
                max_size: int | None = None) -> Vocab:
    """`<S>`, `</S>`, `<UNK>`, then words by descending count, ties in Unicode code-point order.

    Args:
      counts: token -> count; entries for the three reserved words are ignored.
      min_count: keep words seen at least this often.
      max_size: total vocabulary size *including* the 3 reserved words (so it is the softmax size V),
        or None for no limit. Words tied at the cut are kept in code-point order until it is full.

    Returns:
      The vocabulary; deterministic for given counts.
    """
    check_size_args(min_count, max_size)
    kept = [(word, n) for word, n in counts.items() if n >= min_count and word not in SPECIALS]
    kept.sort(key=lambda item: (-item[1], item[0]))  # str order is code-point order
    words = list(SPECIALS) + [word for word, _ in kept]
    return Vocab(words[:max_size] if max_size is not None else words, source="build_vocab")


def check_size_args(min_count: int, max_size: int | None) -> None:
    """Raises ValueError unless min_count >= 1 and max_size is None or >= 3."""
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count={min_count!r}: expected an int >= 1")
    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int)
                                 or max_size < len(SPECIALS)):
        raise ValueError(f"max_size={max_size!r}: expected None or an int >= {len(SPECIALS)} "
                         f"(it counts the reserved {', '.join(SPECIALS)})")


# ----------------------------------------------------------------------------- CLI

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines the CLI flags; only when run as a program, so importing `Vocab` adds no global flags."""
    flags.DEFINE_string("files", None, "Glob of corpus files, one whitespace-tokenized sentence per line.")
    flags.DEFINE_string("output", None, "Vocabulary file to write (replaced atomically).")
    flags.DEFINE_integer("min_count", 1, "Keep words seen at least this often.")
    flags.DEFINE_integer("max_size", None, "Total vocabulary size including <S>, </S>, <UNK>.")
    flags.DEFINE_integer("max_line_chars", text_files.DEFAULT_MAX_LINE_CHARS, "Skip (and count) longer lines.")
    flags.DEFINE_enum("invalid_utf8", "replace", list(text_files.INVALID_UTF8_POLICIES),
                      "Lines with invalid UTF-8: keep with U+FFFD (replace) or drop (skip).")
    flags.DEFINE_integer("log_every", 1_000_000, "Log progress every this many lines.")


def run() -> None:
    for name in ("files", "output"):
        if not getattr(FLAGS, name):
            raise ValueError(f"--{name} is required")
    output = FLAGS.output
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):  # before the (long) count, not after it
        raise FileNotFoundError(f"--output={output}: directory {directory} does not exist")
    if os.path.isdir(output):
        raise IsADirectoryError(f"--output={output} is a directory")
    check_size_args(FLAGS.min_count, FLAGS.max_size)
    counts, stats = count_tokens(FLAGS.files, max_line_chars=FLAGS.max_line_chars,
                                 invalid_utf8=FLAGS.invalid_utf8, log_every=FLAGS.log_every)
    vocab = build_vocab(counts, FLAGS.min_count, FLAGS.max_size)
    vocab.save(output)
    kept = len(vocab) - len(SPECIALS)
    print(stats.summary())
    print(f"types: {len(counts)} seen, {kept} kept, {len(counts) - kept} dropped "
          f"(min_count={FLAGS.min_count}, max_size={FLAGS.max_size}); "
          f"wrote {len(vocab)} entries ({kept} + {', '.join(SPECIALS)}) to {output}")


def main(argv: Sequence[str]) -> None:
    from elmo_jax import cli

    cli.run_main(run, list(argv), hint="; pass the corpus with --files=GLOB")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with a bad flag reported like any other input error: one line, exit code 1."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=parse_flags)
