"""The one rule for reading a person's text file, which every reader of user files follows: the corpus
(`data.text_files`, `data.text_blocks`), a vocabulary (`formats.vocab_file`), probe sets
(`analysis.probe_data`) and embed_file's sentences (`files.sentence_input`).

- The text is UTF-8. A byte-order mark at the start of the file (Windows editors write one) is not part of
  the text; anywhere else it is a character like any other.
- A line ends at "\\n", and a "\\r" just before it belongs to the line end ("\\r\\n", Windows); a last line
  without "\\n" is a line too. Nothing else ends a line: a "\\r" alone, "\\x85", U+2028 and the other
  characters `str.splitlines` would split at are text (whitespace, where a reader splits tokens on it).
- Bytes that are not UTF-8 are an error naming the file and line, unless the reader has a policy for them
  (the corpus's `--invalid_utf8` replaces or skips such lines and counts them).

`read_lines` reads a whole file by the rule; readers with checks of their own per raw line (length, NUL
bytes, a policy for invalid bytes) call `line_text` on each line they read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from elmo_jax import storage

BOM = b"\xef\xbb\xbf"


def line_text(raw: bytes, number: int) -> str:
    """The text of the raw line `number` (1-based, with or without its line end), by the rule: the line
    end and, on line 1, a byte-order mark removed. Raises UnicodeDecodeError for bytes that are not UTF-8."""
    if raw.endswith(b"\n"):
        raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
    if number == 1 and raw.startswith(BOM):
        raw = raw[len(BOM) :]
    return raw.decode("utf-8")


def read_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(number, text) of every line of a local or gs:// file, by the rule.

    Raises:
      ValueError: a line is not UTF-8 (the message names the file, the line and the byte).
      OSError: the file cannot be read.
    """
    with storage.open_file(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, line_text(raw, number)
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{os.fspath(path)}:{number}: not valid UTF-8 ({e.reason} at byte {e.start} of the line)"
                ) from None
