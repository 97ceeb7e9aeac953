"""Reading one-sentence-per-line corpora: globs, every odd line counted, constant memory, atomic writes."""

from __future__ import annotations

import json
import os
import re
import tracemalloc

import pytest

from elmo_jax import storage
from elmo_jax.data import text_blocks, text_files
from elmo_jax.data.text_files import ReadStats, expand_glob, iter_sentences
from elmo_jax.storage import atomic


def write(path, data: bytes | str):
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return str(path)


# ----------------------------------------------------------------------------- expand_glob


def test_expand_glob_sorts_and_keeps_pattern_order(tmp_path):
    for name in ("b.txt", "a.txt", "c.txt"):
        write(tmp_path / name, "x\n")
    assert expand_glob(str(tmp_path / "*.txt")) == [str(tmp_path / n) for n in ("a.txt", "b.txt", "c.txt")]
    assert expand_glob([str(tmp_path / "c.txt"), str(tmp_path / "[ab].txt")]) == [
        str(tmp_path / n) for n in ("c.txt", "a.txt", "b.txt")
    ]


def test_expand_glob_takes_an_existing_path_literally(tmp_path):
    path = write(tmp_path / "part[1].txt", "x\n")  # as a glob, "[1]" would mean "1"
    assert expand_glob(path) == [path]


def test_expand_glob_names_a_pattern_that_matches_nothing(tmp_path):
    pattern = str(tmp_path / "news.en-*")
    with pytest.raises(FileNotFoundError, match=re.escape(f"no file matches {pattern!r}")):
        expand_glob(pattern)


def test_expand_glob_rejects_a_directory(tmp_path):
    write(tmp_path / "a.txt", "x\n")
    (tmp_path / "sub").mkdir()
    with pytest.raises(IsADirectoryError, match=r"sub \(matched by .*\) is a directory"):
        expand_glob(str(tmp_path / "*"))


def test_expand_glob_rejects_a_file_matched_twice(tmp_path):
    path = write(tmp_path / "a.txt", "x\n")
    with pytest.raises(ValueError, match=r"a\.txt is matched by both .* it would be read twice"):
        expand_glob([path, str(tmp_path / "*.txt")])


def test_expand_glob_rejects_only_empty_files(tmp_path):
    write(tmp_path / "a.txt", b"")
    write(tmp_path / "b.txt", b"")
    with pytest.raises(ValueError, match=r"all 2 file\(s\) .* are empty \(0 bytes\): .*a\.txt, .*b\.txt"):
        expand_glob(str(tmp_path / "*.txt"))


def test_expand_glob_rejects_no_patterns():
    with pytest.raises(ValueError, match="no file patterns"):
        expand_glob([])


# ----------------------------------------------------------------------------- iter_sentences

ODD = (
    b"\xef\xbb\xbfhello  world .\r\n"  # 1: BOM, double space, CRLF
    b"\n"  # 2: blank
    b" \t \n"  # 3: blank
    b"bad \xff byte\n"  # 4: invalid UTF-8
    b"nul\x00inside x\n"  # 5: NUL is not whitespace
    + b"y" * 30
    + b"\n"  # 6: over the 20-character limit
    + b"<S> again <S>\n"  # 7: reserved words
    b"no newline at end"
)  # 8


@pytest.mark.parametrize("policy", ["replace", "skip"])
def test_every_odd_line_is_counted(tmp_path, policy):
    odd = write(tmp_path / "odd.txt", ODD)
    empty = write(tmp_path / "empty.txt", b"")
    stats = ReadStats()
    sentences = list(
        iter_sentences([odd, empty], max_line_chars=20, invalid_utf8=policy, stats=stats, reserved=["<S>"])
    )
    expected = [["hello", "world", "."]]
    if policy == "replace":
        expected.append(["bad", "\ufffd", "byte"])
    expected += [["nul\x00inside", "x"], ["<S>", "again", "<S>"], ["no", "newline", "at", "end"]]
    assert sentences == expected
    assert (stats.files, stats.empty_files, stats.bom_files, stats.lines) == (2, 1, 1, 8)
    assert (stats.sentences, stats.tokens) == (len(expected), sum(map(len, expected)))
    assert (stats.blank_lines, stats.long_lines, stats.nul_lines, stats.reserved_tokens) == (2, 1, 1, 2)
    assert (stats.invalid_utf8_replaced, stats.invalid_utf8_skipped) == ((1, 0) if policy == "replace" else (0, 1))
    assert stats.lines == stats.sentences + stats.skipped_lines
    assert stats.examples["blank_lines"] == [f"{odd}:2", f"{odd}:3"]
    assert stats.examples["long_lines"] == [f"{odd}:6"]
    assert stats.examples["invalid_utf8_" + ("replaced" if policy == "replace" else "skipped")] == [f"{odd}:4"]
    assert stats.examples["empty_files"] == [empty]
    summary = stats.summary()
    assert "\n" not in summary
    for count in (
        "files=2",
        "empty=1",
        "bom=1",
        "lines=8",
        f"sentences={len(expected)}",
        "blank=2",
        "too_long=1",
        f"invalid_utf8={stats.invalid_utf8_skipped}",
        f"invalid_utf8_replaced={stats.invalid_utf8_replaced}",
        "nul=1",
        "reserved_tokens=2",
        f"long_lines: {odd}:6",
    ):
        assert count in summary


def test_only_the_first_few_places_are_kept(tmp_path):
    path = write(tmp_path / "blank.txt", "a\n" + "\n" * 9)
    stats = ReadStats()
    assert list(iter_sentences(path, stats=stats)) == [["a"]]
    assert stats.blank_lines == 9
    assert stats.examples["blank_lines"] == [f"{path}:{n}" for n in range(2, 2 + text_files.MAX_EXAMPLES)]


def test_line_limit_counts_characters_not_bytes(tmp_path):
    path = write(tmp_path / "u.txt", "é" * 10 + "\n" + "é" * 11 + "\n")  # 20 and 22 bytes
    stats = ReadStats()
    assert list(iter_sentences(path, max_line_chars=10, stats=stats)) == [["é" * 10]]
    assert stats.long_lines == 1


def test_a_huge_line_is_skipped_without_being_held_in_memory(tmp_path):
    # Reading holds a few blocks of the input at a time; a line 16 blocks long is read past, never held.
    size = 16 * text_blocks.BLOCK_BYTES
    path = write(tmp_path / "huge.txt", b"first line\n" + b"x" * size + b"\nlast line\n")
    stats = ReadStats()
    tracemalloc.start()
    try:
        sentences = list(iter_sentences(path, max_line_chars=1000, stats=stats))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sentences == [["first", "line"], ["last", "line"]]
    assert stats.long_lines == 1 and stats.examples["long_lines"] == [f"{path}:2"]
    assert peak < size // 4, f"peak {peak} bytes while skipping an {size}-byte line"


def test_sentences_stream_in_file_order(tmp_path):
    a = write(tmp_path / "a.txt", "one\ntwo\n")
    b = write(tmp_path / "b.txt", "three\n")
    stream = iter_sentences(str(tmp_path / "*.txt"))
    assert next(stream) == ["one"]
    assert list(stream) == [["two"], ["three"]]
    assert [s for s in iter_sentences([b, a])] == [["three"], ["one"], ["two"]]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(invalid_utf8="ignore"), r"invalid_utf8='ignore': expected one of \('replace', 'skip'\)"),
        (dict(max_line_chars=0), r"max_line_chars=0: expected a positive int or None"),
        (dict(max_line_chars=2.5), r"max_line_chars=2.5"),
    ],
)
def test_bad_options_fail_at_the_call(tmp_path, kwargs, message):
    path = write(tmp_path / "a.txt", "x\n")
    with pytest.raises(ValueError, match=message):
        iter_sentences(path, **kwargs)  # no next(): the error comes before any reading


def test_a_bad_glob_fails_at_the_call(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file matches"):
        iter_sentences(str(tmp_path / "missing-*"))


# ----------------------------------------------------------------------------- atomic.write_text


def test_write_text_atomic_replaces_whole_files_only(tmp_path):
    path = tmp_path / "out.txt"
    atomic.write_text(path, "first\n")
    assert path.read_text(encoding="utf-8") == "first\n"
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~_umask()
    with pytest.raises(UnicodeEncodeError):
        atomic.write_text(path, "half written \ud800")  # fails mid-write
    assert path.read_text(encoding="utf-8") == "first\n"
    assert sorted(os.listdir(tmp_path)) == ["out.txt"]  # no temporary file left behind


def test_write_text_atomic_names_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cannot write .*out\.txt: directory .*nowhere does not exist"):
        atomic.write_text(tmp_path / "nowhere" / "out.txt", "x")


def test_nothing_can_be_created_under_a_file_and_the_reason_says_so(tmp_path):
    """A path whose directory is a file: the reason names that file as not a directory (it said the
    directory "does not exist", which sent users looking for a missing folder)."""
    (tmp_path / "train.txt").write_text("a\n", encoding="utf-8")
    for path, parents in ((tmp_path / "train.txt" / "x", False), (tmp_path / "train.txt" / "cache" / "x", True)):
        problem = storage.creation_problem(path, parents=parents)
        assert isinstance(problem, NotADirectoryError), (path, problem)
        assert str(problem) == f"{tmp_path / 'train.txt'} is not a directory", path
    missing = storage.creation_problem(tmp_path / "nowhere" / "x")
    assert isinstance(missing, FileNotFoundError) and "does not exist" in str(missing)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_every_reader_of_user_text_follows_one_rule(tmp_path):
    """Issue #31: the corpus and vocabulary readers accepted a UTF-8 byte-order mark while the probe
    reader refused a .jsonl starting with one (and kept it as part of a CoNLL token), and the probe reader
    split lines wherever `str.splitlines` does (U+2028, "\\x85", a lone "\\r"). Now every reader follows
    `formats.text_lines`: a BOM at the start is no text, "\\n" and "\\r\\n" end lines, nothing else does."""
    from elmo_jax.analysis.probe_data import read_probe_file
    from elmo_jax.files import sentence_input
    from elmo_jax.formats.vocab_file import Vocab

    BOM = b"\xef\xbb\xbf"

    odd = "cat\u2028dog"  # a line separator inside a token: text, not a line end
    text = tmp_path / "text.txt"
    text.write_bytes(BOM + f"the {odd} sat\r\nsecond line\n".encode())
    expected = [["the", "cat", "dog", "sat"], ["second", "line"]]  # str.split() splits at U+2028 too
    assert list(text_files.iter_sentences(str(text))) == expected
    assert [tokens for _, tokens in sentence_input.lines(str(text))] == expected
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(BOM + b"<S>\r\n</S>\r\n<UNK>\r\nthe\r\n")
    assert Vocab.load(vocab).words == ["<S>", "</S>", "<UNK>", "the"]
    record = {"tokens": ["the", odd, "sat"], "target": 1, "label": "N"}
    jsonl = tmp_path / "probe.jsonl"
    jsonl.write_bytes(BOM + (json.dumps(record, ensure_ascii=False) + "\r\n").encode() * 2)
    conll = tmp_path / "probe.conll"
    conll.write_bytes(BOM + f"the\tD\r\n{odd}\tN\r\n\r\n".encode())
    for path in (jsonl, conll):
        items = read_probe_file(str(path))
        assert items[0].tokens[0] == "the" and odd in items[0].tokens, (path.name, items[0])
