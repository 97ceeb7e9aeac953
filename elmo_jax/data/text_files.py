"""Plain-text corpora: one whitespace-tokenized sentence per line (the 1B Word Benchmark format).

Reading them with every odd line accounted for.

    files = expand_glob("corpus/news.en-*")
    stats = ReadStats()
    for tokens in iter_sentences(files, stats=stats):   # tokens: list[str], file order, constant memory
        ...
    print(stats.summary())
    for block in iter_record_blocks(files, stats=stats):  # the same sentences as b"tok tok\\n..." blocks
        ...

Every line is accounted for: it is either yielded as a sentence or counted under the reason it was
skipped (blank, longer than `max_line_chars`, invalid UTF-8 with `invalid_utf8="skip"`), so
`lines == sentences + blank_lines + long_lines + invalid_utf8_skipped`. Oddities that are kept
(invalid bytes replaced by U+FFFD, NUL characters, a UTF-8 byte-order mark, reserved words such as a
literal `<S>`) are counted too, and the first few places of each are kept as "file:line" strings.

Line and token conventions (the same as bilm-tf, which reads each line with `line.strip().split()`):
- Files are read as bytes and a line ends at b"\\n"; each line is decoded on its own, so one bad byte
  affects one line (files are read in blocks, `text_blocks`, which applies these rules in bulk). A
  trailing "\\r" is whitespace and disappears with the split.
- Tokens are `str.split()` of the decoded line: any Unicode whitespace separates tokens, including
  U+00A0 (no-break space), U+2028 and the ASCII separators \\x1c-\\x1f.
- NUL (U+0000) is not whitespace: it stays inside its token, and lines holding one are counted
  (`nul_lines`) because a NUL in a text corpus usually means a binary file slipped into the glob.
- A UTF-8 byte-order mark at the start of a file is removed (it is not whitespace, so it would
  otherwise glue itself to the first token) and counted (`bom_files`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence

from elmo_jax import storage
from elmo_jax.data import text_blocks

DEFAULT_MAX_LINE_CHARS = 10_000  # far above real sentences; bounds the memory one line can take
INVALID_UTF8_POLICIES = ("replace", "skip")
MAX_EXAMPLES = 5  # offending "file:line" locations kept per kind


Files = str | os.PathLike | Sequence[str | os.PathLike]


def expand_glob(patterns: Files) -> list[str]:
    """The files a glob (or a list of globs and paths) names: each pattern sorted, in pattern order.

    Args:
      patterns: one pattern (`"data/news.en-*"`, `~` and `**` allowed) or a sequence of them; also in
        Cloud Storage (`"gs://bucket/corpus/*.txt"`). A path that exists is taken literally, so file names
        containing `[` or `*` work.

    Returns:
      The matched file paths, as glob spells them.

    Raises:
      FileNotFoundError: a pattern matches nothing (the pattern is named).
      IsADirectoryError: a match is a directory (a pattern like `data/*` that also picks up a folder).
      ValueError: no patterns; a file matched by two patterns (it would be read twice); every matched
        file is empty (0 bytes). Some empty files among others are fine: they are counted when read.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    if not patterns:
        raise ValueError("no file patterns given: expected a glob such as 'corpus/news.en-*'")
    files: list[str] = []
    matched_by: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for pattern in map(os.fspath, patterns):
        expanded = storage.expand_user(pattern)
        matches = [expanded] if storage.exists(expanded) else storage.glob(expanded)
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern!r}")
        stats = storage.stat_many(matches)  # in a bucket one listing per directory, not requests per object
        sizes.update((path, stats[path][0]) for path in matches)
        for path in matches:
            if stats[path][2]:
                raise IsADirectoryError(f"{path} (matched by {pattern!r}) is a directory, expected a text file")
            key = storage.real(path)
            if key in matched_by:
                raise ValueError(
                    f"{path} is matched by both {matched_by[key]!r} and {pattern!r}; it would be read twice"
                )
            matched_by[key] = pattern
            files.append(path)
    if all(sizes[path] == 0 for path in files):
        raise ValueError(
            f"all {len(files)} file(s) matched by {list(map(os.fspath, patterns))} are empty "
            f"(0 bytes): {', '.join(files[:MAX_EXAMPLES])}"
        )
    return files


@dataclasses.dataclass
class ReadStats:
    """What reading a corpus found. Pass one to `iter_sentences`; it is updated as lines are read.

    Attributes:
      files: files opened. empty_files: those of 0 bytes. bom_files: those starting with a UTF-8 BOM.
      lines: physical lines read (a last line without "\\n" counts).
      sentences: lines yielded. tokens: tokens in them.
      blank_lines: skipped, nothing but whitespace.
      long_lines: skipped, more than `max_line_chars` characters.
      invalid_utf8_replaced: kept, bad bytes replaced by U+FFFD (invalid_utf8="replace").
      invalid_utf8_skipped: skipped because of bad bytes (invalid_utf8="skip").
      nul_lines: kept, contain U+0000.
      reserved_tokens: occurrences of the `reserved` words passed to `iter_sentences` (kept).
      examples: kind -> the first `MAX_EXAMPLES` places, "file:line" (or "file" for file-level kinds).
    """

    files: int = 0
    empty_files: int = 0
    bom_files: int = 0
    lines: int = 0
    sentences: int = 0
    tokens: int = 0
    blank_lines: int = 0
    long_lines: int = 0
    invalid_utf8_replaced: int = 0
    invalid_utf8_skipped: int = 0
    nul_lines: int = 0
    reserved_tokens: int = 0
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def wants_example(self, kind: str) -> bool:
        """Whether a place of `kind` would still be kept by `note` (fewer than MAX_EXAMPLES so far)."""
        return len(self.examples.get(kind, ())) < MAX_EXAMPLES

    def note(self, kind: str, path: str, line: int | None = None, count: int = 1) -> None:
        """Adds `count` to the counter `kind`; remembers "path:line" while few places are kept."""
        setattr(self, kind, getattr(self, kind) + count)
        places = self.examples.setdefault(kind, [])
        if len(places) < MAX_EXAMPLES:
            places.append(path if line is None else f"{path}:{line}")

    @property
    def skipped_lines(self) -> int:
        return self.blank_lines + self.long_lines + self.invalid_utf8_skipped

    def summary(self) -> str:
        """One line with every count and the first offending places, e.g. for a CLI or a log."""
        text = (
            f"files={self.files} (empty={self.empty_files}, bom={self.bom_files}) lines={self.lines} "
            f"sentences={self.sentences} tokens={self.tokens} | skipped: blank={self.blank_lines} "
            f"too_long={self.long_lines} invalid_utf8={self.invalid_utf8_skipped} | kept: "
            f"invalid_utf8_replaced={self.invalid_utf8_replaced} nul={self.nul_lines} "
            f"reserved_tokens={self.reserved_tokens}"
        )
        places = [f"{kind}: {' '.join(where)}" for kind, where in sorted(self.examples.items()) if where]
        return text + (" | first at " + "; ".join(places) if places else "")

    def to_dict(self) -> dict:
        """The counts and examples as plain JSON-ready values."""
        return dataclasses.asdict(self)


def iter_sentences(
    files: Files,
    *,
    max_line_chars: int | None = DEFAULT_MAX_LINE_CHARS,
    invalid_utf8: str = "replace",
    stats: ReadStats | None = None,
    reserved: Iterable[str] = (),
) -> Iterator[list[str]]:
    """Streams the sentences of text files, one token list per non-blank line, in file order.

    Memory stays bounded: a block of the input (`text_blocks.BLOCK_BYTES`) and at most about
    4 * max_line_chars bytes of an unfinished line are held at a time.
    Arguments are checked and the files listed before this returns, so a bad glob fails here and not
    at the first `next()`.

    Args:
      files: glob pattern(s) or paths, as for `expand_glob`.
      max_line_chars: lines with more characters (after decoding, newline excluded) are skipped and
        counted; None for no limit (then one line may take any amount of memory).
      invalid_utf8: "replace" keeps the line with each bad byte as U+FFFD; "skip" drops the line.
      stats: updated while reading; read it after the iterator is exhausted.
      reserved: words to count when they occur as tokens (e.g. `<S>`, `</S>`, `<UNK>`); still yielded.

    Returns:
      An iterator of token lists (list[str], never empty).
    """
    blocks = iter_record_blocks(
        files, max_line_chars=max_line_chars, invalid_utf8=invalid_utf8, stats=stats, reserved=reserved
    )
    return _tokens_of(blocks)


def check_read_options(max_line_chars: int | None, invalid_utf8: str) -> None:
    """Raises ValueError unless the options are valid for `iter_sentences`."""
    if invalid_utf8 not in INVALID_UTF8_POLICIES:
        raise ValueError(f"invalid_utf8={invalid_utf8!r}: expected one of {INVALID_UTF8_POLICIES}")
    if max_line_chars is not None and (
        isinstance(max_line_chars, bool) or not isinstance(max_line_chars, int) or max_line_chars < 1
    ):
        raise ValueError(f"max_line_chars={max_line_chars!r}: expected a positive int or None")


def iter_record_blocks(
    files: Files,
    *,
    max_line_chars: int | None = DEFAULT_MAX_LINE_CHARS,
    invalid_utf8: str = "replace",
    stats: ReadStats | None = None,
    reserved: Iterable[str] = (),
    block_bytes: int = text_blocks.BLOCK_BYTES,
) -> Iterator[bytes]:
    """The sentences of text files as blocks of records, the fast way to read a large corpus.

    The same sentences, order and counts as `iter_sentences`, each as its record: the tokens joined by
    single spaces, UTF-8, followed by b"\\n" (`block.split(b"\\n")[:-1]` are a block's records). A block
    holds the kept lines of about `block_bytes` of one file; memory stays bounded by a few blocks.
    Arguments are checked and the files listed before this returns.
    """
    check_read_options(max_line_chars, invalid_utf8)
    paths = expand_glob(files)
    stats = stats if stats is not None else ReadStats()
    options = dict(max_line_chars=max_line_chars, invalid_utf8=invalid_utf8, stats=stats, block_bytes=block_bytes)
    return _read_all(paths, frozenset(reserved), options)


def _read_all(paths: list[str], reserved: frozenset[str], options: dict) -> Iterator[bytes]:
    for path in paths:
        yield from text_blocks.read_record_blocks(path, reserved=reserved, **options)


def _tokens_of(blocks: Iterator[bytes]) -> Iterator[list[str]]:
    for block in blocks:
        # A record is its tokens joined by single spaces, and no token holds whitespace.
        for record in block.decode("utf-8").split("\n")[:-1]:
            yield record.split(" ")
