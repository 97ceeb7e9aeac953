"""Building a bilm-tf vocabulary from a corpus: count the tokens in one streaming pass, then keep
`<S>`, `</S>`, `<UNK>` followed by the words in descending frequency.

    counts, stats = count_tokens("corpus/news.en-*")
    vocab = build_vocab(counts, min_count=3)
    print(write_vocab_file("corpus/news.en-*", "vocab.txt", min_count=3))   # both, as python -m elmo_jax.vocab

Reserved words in the text: a literal `<S>`, `</S>` or `<UNK>` token in the corpus is not counted as a
word (the three always sit at ids 0-2, whatever their frequency); `iter_sentences` reports how many
were seen and where.
"""

from __future__ import annotations

import collections

from elmo_jax.data import text_files
from elmo_jax.formats.output_paths import check_output
from elmo_jax.formats.vocab_file import SPECIALS, VOCABULARY, Vocab
from elmo_jax.runtime.progress import Progress


def write_vocab_file(
    files: text_files.Files | None,
    output: str | None,
    *,
    min_count: int = 1,
    max_size: int | None = None,
    max_line_chars: int | None = text_files.DEFAULT_MAX_LINE_CHARS,
    invalid_utf8: str = "replace",
    log_every: int = 1_000_000,
    overwrite: bool = False,
) -> str:
    """Counts the corpus `files` and writes its vocabulary to `output` (`count_tokens`, `build_vocab`;
    replaced atomically). The output rules (`output_paths`, the corpus files as inputs) and the sizes are
    checked before the (long) count.

    Returns:
      what `python -m elmo_jax.vocab` prints: what reading found, then the types seen, kept and dropped.
    """
    for flag, value in (("files", files), ("output", output)):
        if not value:
            raise ValueError(f"{flag} is required (the command's --{flag})")
    check_output(output, VOCABULARY, overwrite=overwrite, inputs=text_files.expand_glob(files))
    check_size_args(min_count, max_size)
    counts, stats = count_tokens(files, max_line_chars=max_line_chars, invalid_utf8=invalid_utf8, log_every=log_every)
    vocab = build_vocab(counts, min_count, max_size)
    vocab.save(output)
    kept = len(vocab) - len(SPECIALS)
    return (
        f"{stats.summary()}\n"
        f"types: {len(counts)} seen, {kept} kept, {len(counts) - kept} dropped "
        f"(min_count={min_count}, max_size={max_size}); "
        f"wrote {len(vocab)} entries ({kept} + {', '.join(SPECIALS)}) to {output}"
    )


def count_tokens(
    files: text_files.Files,
    *,
    max_line_chars: int | None = text_files.DEFAULT_MAX_LINE_CHARS,
    invalid_utf8: str = "replace",
    log_every: int = 1_000_000,
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
    sentences = text_files.iter_sentences(
        files, max_line_chars=max_line_chars, invalid_utf8=invalid_utf8, stats=stats, reserved=SPECIALS
    )
    counts: collections.Counter = collections.Counter()
    progress = Progress({"lines": None}, every=log_every, log=True)
    for tokens in sentences:
        counts.update(tokens)
        progress.done["lines"] = stats.lines  # the reader counts them (blank and skipped lines too)
        if progress.due():
            rate = progress.rate()
            progress.write(
                f"counted {stats.lines} lines, {stats.tokens} tokens, {len(counts)} types ({rate:.0f} lines/s)"
            )
    for special in SPECIALS:
        counts.pop(special, None)
    if stats.sentences == 0:
        raise ValueError(f"no sentences in {files}: {stats.summary()}")
    return counts, stats


def build_vocab(counts: collections.Counter | dict[str, int], min_count: int = 1, max_size: int | None = None) -> Vocab:
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
    if max_size is not None and (
        isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < len(SPECIALS)
    ):
        raise ValueError(
            f"max_size={max_size!r}: expected None or an int >= {len(SPECIALS)} "
            f"(it counts the reserved {', '.join(SPECIALS)})"
        )
