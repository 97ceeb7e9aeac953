"""Segmenting text written without spaces (`python -m elmo_jax.segment`, `data.segmentation`).

The refusals and the file rules run without the `segment` extra (a stand-in segmenter where one is
needed); the Chinese and Japanese cases skip cleanly when rjieba or SudachiPy is not installed. The
Chinese reference is jieba's own README example ("我来到北京清华大学", accurate mode: 我/ 来到/ 北京/
清华大学, https://github.com/fxsjy/jieba).
"""

from __future__ import annotations

import importlib.util

import pytest

from elmo_jax.data import segmentation
from tests.support.commands import error_line
from tests.support.inprocess import run_in_process


def segment(*args):
    return run_in_process("elmo_jax.segment", *args)


@pytest.fixture
def by_character(monkeypatch):
    """A stand-in for Chinese that needs no extra: every character a word (its module, json, is always
    installed)."""
    stand_in = segmentation.Segmenter("zh", "Chinese", ("json",), lambda: list)
    monkeypatch.setitem(segmentation.SEGMENTERS, "zh", stand_in)


def test_a_segmenter_that_is_not_installed_is_refused_naming_the_extra(tmp_path, monkeypatch):
    text = tmp_path / "raw.txt"
    text.write_text("我来到北京\n", encoding="utf-8")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rjieba" else real(name, *a))
    result = segment("--language=zh", f"--input={text}", f"--output={tmp_path / 'out.txt'}")
    error_line(
        result, "--language=zh (Chinese) needs rjieba, which is not installed", "pip install rjieba (the segment extra)"
    )
    assert not (tmp_path / "out.txt").exists()
    with pytest.raises(ValueError, match="--language=ko: no segmenter for this language; the languages are zh, ja"):
        segmentation.find_segmenter("ko")


def test_missing_flags_and_an_unknown_language_are_refused():
    error_line(segment("--language=zh"), "--input and --output are required")
    error_line(segment("--language=ko", "--input=a", "--output=b"), "--language=ko", "zh|ja")


def test_words_are_joined_by_single_spaces_and_whitespace_only_separates():
    assert segmentation.segment_line("ab  c\td", list) == "a b c d"
    assert segmentation.segment_line("", list) == ""
    assert segmentation.segment_line(" \t ", list) == ""
    assert segmentation.segment_line("ab", lambda t: [t[0], " ", "", t[1]]) == "a b"


def test_one_line_out_per_line_in_read_by_the_text_rule(tmp_path, by_character):
    raw = tmp_path / "raw.txt"
    raw.write_bytes("\ufeff今天\r\n\n好 ok\n最后".encode())  # a BOM, CRLF, a blank line, no final newline
    output = tmp_path / "out.txt"
    result = segment("--language=zh", f"--input={raw}", f"--output={output}")
    assert result.returncode == 0, result.stderr
    assert output.read_text(encoding="utf-8") == "今 天\n\n好 o k\n最 后\n"
    assert result.stdout.strip() == f"{raw}: 4 lines, 7 words (Chinese) -> {output}"
    error_line(segment("--language=zh", f"--input={raw}", f"--output={output}"), "already exists", "--overwrite")
    error_line(segment("--language=zh", f"--input={raw}", f"--output={raw}", "--overwrite"), f"--output={raw}")


def test_bad_lines_are_named_and_nothing_is_written(tmp_path, by_character):
    output = tmp_path / "out.txt"
    bad = tmp_path / "bad.txt"
    bad.write_bytes("好\n".encode() + b"\xff\xfe\n")
    error_line(segment("--language=zh", f"--input={bad}", f"--output={output}"), f"{bad}:2: not valid UTF-8")
    long = tmp_path / "long.txt"
    long.write_text("好\n" + "字" * (segmentation.MAX_LINE_CHARS + 1) + "\n", encoding="utf-8")
    error_line(segment("--language=zh", f"--input={long}", f"--output={output}"), f"{long}:2: 10,001 characters")
    error_line(segment("--language=zh", f"--input={tmp_path / 'none.txt'}", f"--output={output}"), "no such file")
    error_line(segment("--language=zh", f"--input={tmp_path}", f"--output={output}"), "a directory, expected a text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "long.txt"]  # no output, no staging


def test_chinese_with_rjieba(tmp_path):
    pytest.importorskip("rjieba")
    raw = tmp_path / "raw.txt"
    raw.write_text("我来到北京清华大学\n", encoding="utf-8")
    result = segment("--language=zh", f"--input={raw}", f"--output={tmp_path / 'out.txt'}")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "我 来到 北京 清华大学\n"


def test_japanese_with_sudachipy():
    pytest.importorskip("sudachipy")
    if not any(importlib.util.find_spec(f"sudachidict_{e}") for e in segmentation.SUDACHI_DICTIONARIES):
        pytest.skip("no SudachiDict package installed")
    cut = segmentation.find_segmenter("ja").make()
    text = "東京都に住んでいます。"
    words = segmentation.segment_line(text, cut).split(" ")
    assert "".join(words) == text and len(words) >= 4  # every character kept, cut into several words
    assert "に" in words and words[-1] == "。"  # the particle and the full stop are words of their own
