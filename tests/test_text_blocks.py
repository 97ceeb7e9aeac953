"""The block reader (`elmo_jax.data.text_blocks`, behind `text_files.iter_record_blocks` and
`iter_sentences`) against a line-at-a-time reference of the same rules (`tests/reference/text_lines.py`),
on random files full of the odd cases, at block sizes from 1 byte up: same records, counts and places."""

from __future__ import annotations

import random
import sys

import pytest

from elmo_jax.data import text_blocks, text_files
from tests.reference.text_lines import KINDS, read_lines

# Pieces a line is made of: plain words, and every kind of byte the rules treat specially.
WORDS = [b"the", b"cat", b"sat", b"on", b"mat", b".", b"caf\xc3\xa9", b"\xe2\x80\x9cquoted\xe2\x80\x9d", b"<S>"]
ODD = [
    b"  ",  # double space
    b"\t",
    b"\r",
    b"\x0b",
    b"\x0c",
    b"\x1c",  # separators str.split() knows and bytes.split() does not
    b"\x1f",
    b"\x00",  # NUL: not whitespace, counted
    b"\xc2\xa0",  # no-break space
    b"\xe2\x80\xa8",  # line separator
    b"\xe3\x80\x80",  # ideographic space
    b"\xe2\x80\x8b",  # zero-width space: not whitespace
    b"\xff",  # invalid UTF-8
    b"\xe2\x80",  # a truncated sequence
    b"\xef\xbb\xbf",  # a byte-order mark inside a line: an ordinary character there
]


def random_file(rng: random.Random, odd: float) -> bytes:
    lines = []
    for _ in range(rng.randrange(0, 30)):
        kind = rng.random()
        if kind < 0.1:
            lines.append(b"")
        elif kind < 0.15:
            lines.append(b"x" * rng.choice([19, 20, 21, 84, 85, 86, 200]))  # around max_line_chars=20 and its bytes
        else:
            pieces = []
            for _ in range(rng.randrange(1, 8)):
                pieces.append(rng.choice(ODD) if rng.random() < odd else rng.choice(WORDS))
                pieces.append(b" ")
            lines.append(b"".join(pieces[: rng.randrange(len(pieces) - 1, len(pieces) + 1)]))
    data = b"\n".join(lines) + rng.choice([b"", b"\n", b"\r\n"]) if lines else b""
    if rng.random() < 0.2:
        data = b"\xef\xbb\xbf" + data
    return data


def read_blocks(path, block_bytes, **options):
    stats = text_files.ReadStats()
    blocks = list(text_files.iter_record_blocks(path, stats=stats, block_bytes=block_bytes, **options))
    assert all(block.endswith(b"\n") for block in blocks)
    return b"".join(blocks).split(b"\n")[:-1], stats


@pytest.mark.parametrize("odd", [0.0, 0.05, 0.3])
@pytest.mark.parametrize("max_line_chars, invalid_utf8", [(20, "replace"), (20, "skip"), (None, "replace")])
def test_block_reader_equals_the_line_rules(tmp_path, odd, max_line_chars, invalid_utf8):
    rng = random.Random(f"{odd} {max_line_chars} {invalid_utf8}")
    reserved = ("<S>", "</S>")
    edges = [b"\xef\xbb\xbf", b"\xef\xbb\xbf\n", b"\xef\xbb\xbfa", b"\n", b" ", b"a", b"a ", b" a\n", b"a\n\n"]
    for n in range(40 + len(edges)):
        data = edges[n - 40] if n >= 40 else random_file(rng, odd)
        path = tmp_path / f"{n}.txt"
        path.write_bytes(data)
        expected, counts, examples = read_lines(data, str(path), max_line_chars, invalid_utf8, reserved)
        for block_bytes in (1, 2, 3, 5, 64, 1 << 20):
            options = dict(max_line_chars=max_line_chars, invalid_utf8=invalid_utf8, reserved=reserved)
            if not data:  # expand_glob refuses a glob of only empty files
                continue
            records, stats = read_blocks(str(path), block_bytes, **options)
            where = f"file {n} ({data!r}), block_bytes={block_bytes}"
            assert records == expected, where
            for kind in KINDS + ("lines", "sentences", "tokens"):
                assert getattr(stats, kind) == counts[kind], f"{kind}: {where}"
            assert {k: v for k, v in stats.examples.items() if v} == examples, where


def test_plain_and_odd_blocks_give_the_same_records_over_many_lines(tmp_path):
    # Long files, so that blocks of thousands of lines take the bulk path (tabs, double spaces, blank lines,
    # CRLF and non-ASCII letters are all handled in bulk) and others, holding one odd character, the
    # line-at-a-time path; the records must not depend on which.
    rng = random.Random(7)
    lines = []
    for i in range(20_000):
        words = [rng.choice(WORDS[:-1]) for _ in range(rng.randrange(0, 12))]  # no reserved word
        separator = rng.choice([b" ", b" ", b" ", b"  ", b"\t"])
        line = separator.join(words) + rng.choice([b"", b"", b"\r", b" "])
        if i % 5_000 == 4_999:
            line += b" \xc2\xa0 \x00"
        lines.append(line)
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "long.txt"
    path.write_bytes(data)
    expected, counts, examples = read_lines(data, str(path), 10_000, "replace", ("<S>",))
    for block_bytes in (4096, 1 << 16, text_blocks.BLOCK_BYTES):
        records, stats = read_blocks(str(path), block_bytes, reserved=("<S>",))
        assert records == expected
        assert (stats.sentences, stats.tokens, stats.blank_lines, stats.nul_lines) == (
            counts["sentences"],
            counts["tokens"],
            counts["blank_lines"],
            counts["nul_lines"],
        )
        assert stats.examples["blank_lines"] == examples["blank_lines"]
    assert list(text_files.iter_sentences(str(path))) == [r.decode("utf-8").split(" ") for r in expected]


def test_unicode_spaces_are_pythons():
    # The bulk path relies on knowing every character str.split() splits on beyond ASCII's six.
    ascii_spaces = set(" \t\n\r\x0b\x0c")
    expected = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()} - ascii_spaces
    assert set(text_blocks.UNICODE_SPACES) == expected
