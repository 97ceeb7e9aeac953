"""Reading one text file as blocks of normalized sentence records, at the speed of bulk bytes operations.

A record is what a corpus stores per sentence: the line's tokens (`str.split()` of the decoded line)
joined by single spaces, UTF-8. `read_record_blocks` yields, per block of about `block_bytes` of input,
the records of its kept lines, each followed by b"\\n":

    for block in read_record_blocks("news.txt", max_line_chars=10_000, invalid_utf8="replace", stats=stats):
        records = block.split(b"\\n")[:-1]      # list[bytes], file order

Why blocks: reading, decoding and splitting a line at a time costs interpreter work per line, which
bounded how fast a corpus was prepared (measured: bench/RESULTS.md, "Design figures"). Here a block that
holds nothing unusual is checked and normalized by a handful of C-level passes over its bytes (a UTF-8
check, a search for the few characters that need a line's own attention, and one `bytes.split`/`join`
per line), and only a block that has such a character, or a line that is too long, goes through the
line-at-a-time rules. Both give the same records and the same counts (`tests/test_text_blocks.py` checks
them against a plain line-at-a-time reference at block sizes from 1 byte up).

The line rules (the same as bilm-tf's `line.strip().split()`, with every skipped line counted):
- a line ends at b"\\n"; a UTF-8 byte-order mark at the start of the file is dropped and counted;
- a line of `byte_limit(max_line_chars)` bytes or more, or of more than `max_line_chars` characters once
  its trailing "\\r\\n" is gone, is skipped (`long_lines`); the byte test bounds the memory one line takes
  (the rest of such a line is read past in chunks, never held);
- invalid UTF-8: the line is kept with U+FFFD for each bad byte (`invalid_utf8_replaced`), or skipped
  (`invalid_utf8_skipped`) with invalid_utf8="skip";
- tokens are `str.split()`: any Unicode whitespace separates them (`UNICODE_SPACES`); a line without a
  token is skipped (`blank_lines`); NUL is not whitespace and lines holding one are counted (`nul_lines`);
- occurrences of the `reserved` words as tokens are counted (`reserved_tokens`), and kept.

`stats` is a `text_files.ReadStats` (any object with its counters and `note(kind, path, line, count)`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from elmo_jax import storage
from elmo_jax.formats.text_lines import BOM  # the text-file rule: a BOM at the start is no text

BLOCK_BYTES = 1 << 20  # 1 MiB of input per block: the per-block passes cost nothing next to the lines'
_SKIP_CHUNK = 1 << 16  # bytes read at a time while reading past the rest of an over-long line

# The characters `str.split()` splits on beyond ASCII's b" \\t\\n\\r\\x0b\\x0c" (which `bytes.split()` knows
# too): the separators U+001C-U+001F and the non-ASCII spaces, as Python's Unicode database has them
# (tests/test_text_blocks.py checks this against `str.isspace` over every code point).
UNICODE_SPACES = (
    "\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
# A block holding NUL or one of these goes line by line: NUL lines are counted, and `bytes.split()` would
# not split on these. In an ASCII block only NUL and U+001C-U+001F can occur.
_NEEDS_LINE_RULES = re.compile("[\x00" + UNICODE_SPACES + "]")
_NEWLINE, _SPACE = ord("\n"), ord(" ")


def byte_limit(max_line_chars: int | None) -> int:
    """Bytes from which a line is too long whatever it decodes to (-1: no limit). A character takes at
    most 4 bytes, and a line may end in "\\r\\n", so 4 * max_line_chars + 2 bytes are always enough for a
    line that is not too long; the margin keeps it clear of any rounding."""
    return -1 if max_line_chars is None else 4 * max_line_chars + 5


def read_record_blocks(
    path: str,
    *,
    max_line_chars: int | None,
    invalid_utf8: str,
    stats,
    reserved: frozenset[str] = frozenset(),
    block_bytes: int = BLOCK_BYTES,
) -> Iterator[bytes]:
    """The records of the file `path`, block by block, each record followed by b"\\n" (see the module doc).

    Memory stays bounded: one block, plus at most `byte_limit(max_line_chars)` bytes of an unfinished line.
    Blocks without a kept line are not yielded. `stats.files` and the other counters are updated as the
    file is read.
    """
    stats.files += 1
    limit = byte_limit(max_line_chars)
    reader = _BlockReader(path, max_line_chars, invalid_utf8, stats, reserved)
    with storage.open_file(path, "rb") as f:
        data = f.read(max(block_bytes, len(BOM)))
        bom = data.startswith(BOM)
        if bom:
            data = data[len(BOM) :]
            stats.note("bom_files", path)
        while True:
            end = data.rfind(b"\n") + 1
            block, carry = data[:end], data[end:]  # carry: the start of an unfinished line
            del data  # one copy of the input at a time
            if block:
                block = reader.records(block)
                if block:
                    yield block
            if limit > 0 and len(carry) >= limit:  # the unfinished line is too long already: read past it
                reader.skip_long_line()
                carry = _rest_after_line(f)
            chunk = f.read(block_bytes)
            if not chunk:
                # A last line without b"\n"; a file holding nothing but a byte-order mark has one blank
                # line, as its first line is the mark's.
                if carry or (bom and reader.number == 0):
                    block = reader.records(carry)
                    if block:
                        yield block
                break
            data = carry + chunk if carry else chunk
            del chunk, carry
        if reader.number == 0:
            stats.note("empty_files", path)


def _rest_after_line(f) -> bytes:
    """Reads past the end of the current line; returns what follows its b"\\n" in the last chunk read."""
    while True:
        chunk = f.read(_SKIP_CHUNK)
        if not chunk:
            return b""
        end = chunk.find(b"\n")
        if end >= 0:
            return chunk[end + 1 :]


class _BlockReader:
    """Turns blocks of whole lines of one file into records, counting as it goes (`number`: lines so far)."""

    def __init__(self, path: str, max_line_chars: int | None, invalid_utf8: str, stats, reserved: frozenset[str]):
        self.path, self.max_line_chars, self.invalid_utf8 = path, max_line_chars, invalid_utf8
        self.stats, self.reserved = stats, reserved
        self.reserved_bytes = [word.encode("utf-8") for word in reserved]
        self.limit = byte_limit(max_line_chars)
        self.number = 0

    def skip_long_line(self) -> None:
        self.number += 1
        self.stats.lines += 1
        self.stats.note("long_lines", self.path, self.number)

    def records(self, block: bytes) -> bytes:
        """The records of `block` (whole lines; the last may lack its b"\\n" at the end of the file)."""
        codes = np.frombuffer(block, np.uint8)
        ends = np.flatnonzero(codes == _NEWLINE)
        lengths = np.diff(ends, prepend=-1) - 1  # of each line, without its b"\\n"
        if not block.endswith(b"\n"):
            lengths = np.append(lengths, len(block) - 1 - (ends[-1] if len(ends) else -1))
        first = self.number + 1
        self.number += len(lengths)
        self.stats.lines += len(lengths)
        plain = self._plain(block, codes, int(lengths.max()))
        if plain and self._regular(codes):  # the common case: no Python object per line
            self.stats.sentences += len(lengths)
            self.stats.tokens += int(np.count_nonzero(codes == _SPACE)) + len(lengths)
            return block if block.endswith(b"\n") else block + b"\n"
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()
        return self._plain_records(lines, first) if plain else self._line_by_line(lines, first)

    def _plain(self, block: bytes, codes: np.ndarray, longest: int) -> bool:
        """Whether `bytes.split()` on each line gives exactly the rules' tokens: the block is valid UTF-8,
        has no character of `UNICODE_SPACES` nor NUL, no reserved word, and no line can be too long."""
        if block.isascii():
            if np.any((codes == 0) | ((codes >= 0x1C) & (codes <= 0x1F))):
                return False
        else:
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError:
                return False
            if _NEEDS_LINE_RULES.search(text):
                return False
        if self.max_line_chars is not None and longest > self.max_line_chars:
            return False  # bytes >= characters: a line within the limit in bytes is within it in characters
        return not any(word in block for word in self.reserved_bytes)

    @staticmethod
    def _regular(codes: np.ndarray) -> bool:
        """Whether the (plain) block's lines are their records already: tokens separated by single spaces,
        no space at either end of a line, no blank line, no other whitespace. Reading newlines as spaces:
        no control character but b"\\n", and no separator first, last or next to another."""
        if not len(codes) or np.any((codes < _SPACE) & (codes != _NEWLINE)):
            return False
        separator = (codes == _SPACE) | (codes == _NEWLINE)
        return not (separator[0] or codes[-1] == _SPACE or np.any(separator[1:] & separator[:-1]))

    def _plain_records(self, lines: list[bytes], first: int) -> bytes:
        records = [b" ".join(line.split()) for line in lines]
        blank = records.count(b"")
        if blank:
            noted = 0
            for i, record in enumerate(records):  # only while places are still kept: a few lines
                if not self.stats.wants_example("blank_lines"):
                    break
                if not record:
                    self.stats.note("blank_lines", self.path, first + i)
                    noted += 1
            self.stats.blank_lines += blank - noted
            records = [record for record in records if record]
        if not records:
            return b""
        records.append(b"")
        joined = b"\n".join(records)
        self.stats.sentences += len(records) - 1
        self.stats.tokens += joined.count(b" ") + len(records) - 1
        return joined

    def _line_by_line(self, lines: list[bytes], first: int) -> bytes:
        records = []
        for i, raw in enumerate(lines):
            tokens = self._tokens(raw, first + i)
            if tokens is None:
                continue
            if self.reserved and not self.reserved.isdisjoint(tokens):
                count = sum(token in self.reserved for token in tokens)
                self.stats.note("reserved_tokens", self.path, first + i, count)
            self.stats.sentences += 1
            self.stats.tokens += len(tokens)
            records.append(" ".join(tokens).encode("utf-8"))
        if not records:
            return b""
        records.append(b"")
        return b"\n".join(records)

    def _tokens(self, raw: bytes, number: int) -> list[str] | None:
        """The tokens of one line (without its b"\\n"), or None when it is skipped (and counted)."""
        stats, path = self.stats, self.path
        if self.limit > 0 and len(raw) >= self.limit:
            stats.note("long_lines", path, number)
            return None
        replaced = False
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if self.invalid_utf8 == "skip":
                stats.note("invalid_utf8_skipped", path, number)
                return None
            text, replaced = raw.decode("utf-8", errors="replace"), True
        text = text.rstrip("\r\n")
        if self.max_line_chars is not None and len(text) > self.max_line_chars:
            stats.note("long_lines", path, number)
            return None
        tokens = text.split()
        if not tokens:  # U+FFFD is not whitespace, so a replaced line is never blank
            stats.note("blank_lines", path, number)
            return None
        # Counted only for lines that are kept, so each line lands in exactly one skip reason or none.
        if replaced:
            stats.note("invalid_utf8_replaced", path, number)
        if "\x00" in text:
            stats.note("nul_lines", path, number)
        return tokens
