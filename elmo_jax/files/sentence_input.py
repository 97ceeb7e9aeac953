"""The input of `embed_file`: one whitespace-tokenized sentence per line, checked before any compute.

`scan` reads the whole file once, cheaply, so that every problem (invalid UTF-8, a NUL byte, a sentence over the
length limit, an empty file, blank lines under `--blank_lines=error`) is reported with its line number
before the model is loaded or any output exists, and so that the progress bar knows the total. `lines`
then streams the sentences; neither holds more than one line in memory.

Line numbers in messages are 1-based, as editors show them; the output's dataset names are the 0-based
line index, as in AllenNLP's `elmo` command (line 1 is dataset "0").
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import Iterator

from elmo_jax.formats.text_lines import line_text

BLANK_LINE_POLICIES = ("empty", "skip", "error")
LONG_SENTENCE_POLICIES = ("error", "split")
NUL = b"\x00"
MAX_LINE_BYTES = 64 << 20  # a "line" longer than this is almost surely not text; never read it whole
MAX_TYPES = 1 << 20  # distinct tokens `scan` collects at most (for the token cache)


@dataclasses.dataclass
class InputSummary:
    """What `scan` found: line counts, the first few blank or split lines (1-based), the file's size and
    SHA-256 (what a resumed run compares), and with `collect_types` its distinct tokens (None when there
    are more than `MAX_TYPES`)."""

    path: str
    lines: int = 0
    tokens: int = 0
    blank: int = 0
    long: int = 0
    first_blank: list[int] = dataclasses.field(default_factory=list)
    first_long: list[int] = dataclasses.field(default_factory=list)
    size: int = 0
    sha256: str = ""
    types: set[str] | None = None


def scan(
    path: str,
    *,
    blank_lines: str = "empty",
    max_tokens: int = 1024,
    long_sentences: str = "error",
    collect_types: bool = False,
) -> InputSummary:
    """Checks every line of `path`; returns the counts (and its distinct tokens with `collect_types`).

    Raises:
      FileNotFoundError / IsADirectoryError: `path` is not a readable file.
      ValueError: the file is empty; a line is not UTF-8, is over `MAX_LINE_BYTES`, has more than
        `max_tokens` tokens (with long_sentences="error"), or is blank (with blank_lines="error");
        the message names the file and line and the flag that changes the behaviour.
    """
    _check_policies(blank_lines, long_sentences, max_tokens)
    summary = InputSummary(path, types=set() if collect_types else None)
    digest = hashlib.sha256()
    for number, tokens in _numbered_lines(path, digest):
        _count_line(summary, number, tokens, blank_lines, max_tokens, long_sentences)
    if summary.lines == 0:
        raise ValueError(f"{path}: the input file is empty; expected one tokenized sentence per line")
    summary.size, summary.sha256 = os.path.getsize(path), digest.hexdigest()
    return summary


def lines(path: str, digest=None) -> Iterator[tuple[int, list[str]]]:
    """(0-based line index, tokens) for every line, blank ones included; `scan` has checked them.
    `digest` (a hashlib object), when given, is updated with every byte read."""
    for number, tokens in _numbered_lines(path, digest):
        yield number - 1, tokens


def _check_policies(blank_lines: str, long_sentences: str, max_tokens: int) -> None:
    """Raises ValueError naming the flag whose value is not one the scan knows."""
    if blank_lines not in BLANK_LINE_POLICIES:
        raise ValueError(f"--blank_lines must be one of {BLANK_LINE_POLICIES}, found {blank_lines!r}")
    if long_sentences not in LONG_SENTENCE_POLICIES:
        raise ValueError(f"--long_sentences must be one of {LONG_SENTENCE_POLICIES}, found {long_sentences!r}")
    if max_tokens < 1:
        raise ValueError(f"--max_sentence_tokens must be positive, found {max_tokens}")


def _count_line(
    summary: InputSummary, number: int, tokens: list[str], blank_lines: str, max_tokens: int, long_sentences: str
) -> None:
    """Adds line `number` (1-based) to `summary`, or raises ValueError where its policy says a blank or
    long line is an error (the message names the file, the line and the flag that changes it)."""
    summary.lines += 1
    summary.tokens += len(tokens)
    if summary.types is not None:
        summary.types.update(tokens)
        if len(summary.types) > MAX_TYPES:
            summary.types = None
    if not tokens:
        if blank_lines == "error":
            raise ValueError(
                f"{summary.path}:{number}: blank line; remove it, or pass --blank_lines=empty (an empty "
                "entry) or --blank_lines=skip (no entry)"
            )
        summary.blank += 1
        _keep_first(summary.first_blank, number)
    elif len(tokens) > max_tokens:
        if long_sentences == "error":
            raise ValueError(
                f"{summary.path}:{number}: {len(tokens):,} tokens, over --max_sentence_tokens={max_tokens}; "
                "raise the limit or pass --long_sentences=split (embeds pieces of at most that "
                "many tokens, each without the others' context)"
            )
        summary.long += 1
        _keep_first(summary.first_long, number)


def _numbered_lines(path: str, digest=None) -> Iterator[tuple[int, list[str]]]:
    if os.path.isdir(path):
        raise IsADirectoryError(f"--input={path}: is a directory, expected a text file")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--input={path}: file not found")
    if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe would be used up by `scan` before `lines` reads it
        raise ValueError(
            f"--input={path}: not a regular file (a pipe or device); the input is read twice, "
            "so write it to a file first"
        )
    with open(path, "rb") as f:
        number = 0
        while raw := f.readline(MAX_LINE_BYTES + 1):
            number += 1
            if digest is not None:
                digest.update(raw)
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(
                    f"{path}:{number}: line longer than {MAX_LINE_BYTES >> 20} MiB; expected one sentence per line"
                )
            if NUL in raw:  # valid UTF-8, but in a text file almost always a sign of binary data
                raise ValueError(
                    f"{path}:{number}: NUL byte at byte {raw.index(NUL)} of the line; expected "
                    "UTF-8 text (is this a binary file?)"
                )
            try:  # the text-file rule (`formats.text_lines`): a BOM at the start, "\r\n" line ends
                text = line_text(raw, number)
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{number}: not valid UTF-8 ({e.reason} at byte {e.start} of the line)"
                ) from None
            yield number, text.split()


def _keep_first(places: list[int], number: int, limit: int = 5) -> None:
    if len(places) < limit:
        places.append(number)
