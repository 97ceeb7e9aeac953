"""Vocabulary: bilm-tf file format, counting a corpus, deterministic order, and the CLI."""

from __future__ import annotations

import collections
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from elmo_jax import vocab as vocab_lib
from elmo_jax.data.vocab_builder import build_vocab, count_tokens
from elmo_jax.formats.vocab_file import Vocab
from tests.support.commands import run_command
from tests.support.inprocess import run_in_process

REPO = Path(__file__).resolve().parents[1]

# Counts: the 5, cat 3, sat 3, . 3, a 2, b 2, dog 1, é 1, z 1; "<S>" twice, which must not count.
CORPUS = "the cat sat .\nthe dog sat .\n\n<S> the cat sat . <S>\nthe b a z\nthe é b a\ncat\n"


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- counting and order


def test_count_tokens_counts_words_but_not_reserved_ones(corpus):
    counts, stats = count_tokens(str(corpus))
    assert counts == collections.Counter(
        {"the": 5, "cat": 3, "sat": 3, ".": 3, "a": 2, "b": 2, "dog": 1, "z": 1, "é": 1}
    )
    assert (stats.lines, stats.sentences, stats.blank_lines, stats.reserved_tokens) == (7, 6, 1, 2)
    assert stats.examples["reserved_tokens"] == [f"{corpus}:4"]


def test_build_vocab_orders_by_count_then_code_point(corpus):
    counts, _ = count_tokens(str(corpus))
    vocab = build_vocab(counts)
    # Ties: "." (U+002E) < "cat" < "sat"; "a" < "b"; "dog" < "z" < "é" (U+00E9).
    assert vocab.words == ["<S>", "</S>", "<UNK>", "the", ".", "cat", "sat", "a", "b", "dog", "z", "é"]
    assert (vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)


def test_build_vocab_min_count_and_max_size(corpus):
    counts, _ = count_tokens(str(corpus))
    assert build_vocab(counts, min_count=2).words == ["<S>", "</S>", "<UNK>", "the", ".", "cat", "sat", "a", "b"]
    # max_size counts the three reserved entries; the tie between "cat" and "sat" is cut in code-point order.
    assert build_vocab(counts, max_size=6).words == ["<S>", "</S>", "<UNK>", "the", ".", "cat"]
    assert build_vocab(counts, max_size=3).words == ["<S>", "</S>", "<UNK>"]
    assert build_vocab(counts, min_count=3, max_size=100).words == ["<S>", "</S>", "<UNK>", "the", ".", "cat", "sat"]


def test_build_vocab_ignores_reserved_entries_in_the_counts():
    vocab = build_vocab({"<S>": 100, "<UNK>": 7, "x": 1, "y": 2})
    assert vocab.words == ["<S>", "</S>", "<UNK>", "y", "x"]


def test_build_vocab_does_not_depend_on_counter_order():
    items = [("b", 2), ("a", 2), ("c", 5), ("d", 1)]
    assert build_vocab(dict(items)) == build_vocab(dict(reversed(items)))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(min_count=0), r"min_count=0: expected an int >= 1"),
        (dict(max_size=2), r"max_size=2: expected None or an int >= 3 \(it counts the reserved <S>, </S>, <UNK>\)"),
        (dict(max_size=True), r"max_size=True"),
    ],
)
def test_build_vocab_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_vocab({"a": 1}, **kwargs)


def test_count_tokens_rejects_a_corpus_without_sentences(tmp_path):
    path = tmp_path / "blank.txt"
    path.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"no sentences in .*blank\.txt.*blank=2"):
        count_tokens(str(path))


# ----------------------------------------------------------------------------- the file format


def test_loads_a_bilm_tf_file_with_maxtermid(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("<S>\n</S>\n<UNK>\n!!!MAXTERMID\nthe\n,\n  padded  \nwindows\r\n", encoding="utf-8")
    vocab = Vocab.load(path)
    assert vocab.words == ["<S>", "</S>", "<UNK>", "the", ",", "padded", "windows"]
    assert len(vocab) == 7 and "the" in vocab and "!!!MAXTERMID" not in vocab
    assert (vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.word_to_id(",") == 4 and vocab.word_to_id("unseen") == 2
    ids = vocab.encode(["the", "unseen", "<S>", "windows"])
    assert ids.dtype == np.int32 and ids.tolist() == [3, 2, 0, 6]
    assert vocab.encode([]).shape == (0,)


def test_reserved_words_may_sit_anywhere_as_in_bilm_tf(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("the\n<UNK>\n<S>\n</S>\n", encoding="utf-8")
    vocab = Vocab.load(path)
    assert (vocab.bos_id, vocab.eos_id, vocab.unk_id) == (2, 3, 1)


def test_save_and_load_round_trip_and_replace(tmp_path, corpus):
    path = tmp_path / "vocab.txt"
    path.write_text("old content\n", encoding="utf-8")
    vocab = build_vocab(count_tokens(str(corpus))[0])
    vocab.save(path)
    assert path.read_text(encoding="utf-8") == "".join(w + "\n" for w in vocab.words)
    assert Vocab.load(path) == vocab
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "vocab.txt"]


@pytest.mark.parametrize(
    "content,error,message",
    [
        (b"", ValueError, r"{path}: no tokens"),
        (b"<S>\n</S>\nthe\n", ValueError, r"{path}: missing <UNK>; a vocabulary must contain <S>, </S>, <UNK>"),
        (b"the\n", ValueError, r"{path}: missing <S>, </S>, <UNK>"),
        (b"\n \n\n", ValueError, r"{path}: no tokens"),
        (b"<S>\n</S>\n\n<S>\n", ValueError, r"{path}: missing <UNK>"),
        (
            b"<S>\n</S>\n<UNK>\nnew york\n",
            ValueError,
            r"{path}:4: expected one token without whitespace, found 'new york'",
        ),
        (b"<S>\n</S>\n<UNK>\nthe 123\n", ValueError, r"{path}:4: expected one token without whitespace"),
        (b"<S>\n</S>\n<UNK>\nbad\xffbyte\n", ValueError, r"{path}:4: not valid UTF-8"),
    ],
    ids=["empty", "no_unk", "no_specials", "only_blank", "no_unk_after_skips", "space", "word_count", "utf8"],
)
def test_bad_vocab_files_are_named_with_line(tmp_path, content, error, message):
    path = tmp_path / "vocab.txt"
    path.write_bytes(content)
    with pytest.raises(error, match=message.format(path=str(path).replace(".", r"\."))):
        Vocab.load(path)


def test_blank_lines_and_repeated_tokens_are_skipped_with_one_warning(tmp_path, caplog):
    """bilm-tf loads such files (it gives each line an id); here they are skipped, each token keeping its
    first line's place, and one warning per file counts them however often the file is loaded."""
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"<S>\n</S>\n<UNK>\n\nthe\ncat\nthe\n  \n!!!MAXTERMID\n<S>\ndog\n\n")
    with caplog.at_level(logging.WARNING):
        vocab = Vocab.load(path)
        assert Vocab.load(path) == vocab
    assert vocab.words == ["<S>", "</S>", "<UNK>", "the", "cat", "dog"]
    assert (vocab.bos_id, vocab.word_to_id("the"), vocab.word_to_id("dog")) == (0, 3, 5)
    assert vocab.skipped_lines == {"blank": 3, "duplicate": 2}
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(
        f"{path}: skipped 2 repeated token(s) (the first: 'the' on line 7, first on line 5) and 3 blank "
        "line(s) (the first: line 4); bilm-tf accepts such files too"
    ), warning
    clean = tmp_path / "clean.txt"
    clean.write_bytes(b"<S>\n</S>\n<UNK>\nthe\n")
    with caplog.at_level(logging.WARNING):
        assert Vocab.load(clean).skipped_lines == {"blank": 0, "duplicate": 0}
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_training_reads_a_lenient_vocabulary(tmp_path, corpus):
    """A run given a vocabulary file with a blank line and a repeated token uses its kept words."""
    from elmo_jax.data.training_corpus import open_training_data
    from tests.support.configs import tiny_config

    words = build_vocab(count_tokens(str(corpus))[0]).words
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(words[:5] + ["", words[4]] + words[5:]) + "\n\n", encoding="utf-8")
    config = tiny_config({"train": str(corpus), "heldout": "", "cache_dir": str(tmp_path / "cache")})
    config.data.vocab_file = str(path)
    assert open_training_data(config.data, str(tmp_path)).vocab.words == words


def test_missing_vocab_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"vocabulary file .*nope\.txt does not exist"):
        Vocab.load(tmp_path / "nope.txt")
    with pytest.raises(IsADirectoryError, match=r"is a directory"):
        Vocab.load(tmp_path)


# ----------------------------------------------------------------------------- CLI


def run_cli(*args: str):
    return run_in_process("elmo_jax.vocab", *args)


def test_cli_writes_the_vocabulary(tmp_path, corpus):
    """A real process (the command's one end-to-end run in the suite)."""
    output = tmp_path / "vocab.txt"
    result = run_command("elmo_jax.vocab", f"--files={tmp_path}/*.txt", f"--output={output}", "--min_count=2")
    assert result.returncode == 0, result.stderr
    assert output.read_text(encoding="utf-8").split("\n") == [
        "<S>",
        "</S>",
        "<UNK>",
        "the",
        ".",
        "cat",
        "sat",
        "a",
        "b",
        "",
    ]
    assert "sentences=6" in result.stdout and "reserved_tokens=2" in result.stdout
    assert "9 seen, 6 kept, 3 dropped" in result.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--files={tmp}/missing-*"], "error: no file matches"),
        (["--files={tmp}/*.txt", "--max_size=2"], "error: max_size=2: expected None or an int >= 3"),
        (["--files={tmp}/*.txt", "--invalid_utf8=ignore"], "error: flag --invalid_utf8=ignore"),
        (["--files={tmp}/blank.txt"], "error: no sentences in"),
    ],
    ids=["no_match", "max_size", "bad_enum", "no_sentences"],
)
def test_cli_bad_input_is_one_line_and_leaves_the_output_alone(tmp_path, corpus, args, message):
    (tmp_path / "blank.txt").write_text("\n\n", encoding="utf-8")
    output = tmp_path / "out" / "vocab.txt"
    output.parent.mkdir()
    output.write_bytes(b"<S>\n</S>\n<UNK>\nprevious\n")
    before = (output.read_bytes(), os.stat(output).st_mtime_ns)
    result = run_cli(*(a.format(tmp=tmp_path) for a in args), f"--output={output}", "--overwrite")
    assert result.returncode == 1
    assert result.stderr.startswith(message), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert (output.read_bytes(), os.stat(output).st_mtime_ns) == before
    assert os.listdir(output.parent) == ["vocab.txt"]


def test_cli_checks_the_output_directory_before_counting(tmp_path, corpus):
    result = run_cli(f"--files={corpus}", f"--output={tmp_path}/missing/vocab.txt")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --output=") and "does not exist" in result.stderr


def test_importing_vocab_defines_no_flags():
    """Library users (the data pipeline, train.py) must not inherit --files/--output from this CLI."""
    from absl import flags

    assert "min_count" not in flags.FLAGS and vocab_lib.FLAGS is flags.FLAGS


def test_a_byte_order_mark_is_removed_like_the_corpus_reader_does(tmp_path):
    """Issue #17 case 15: a vocabulary file starting with a UTF-8 BOM (as Windows editors write) was
    refused with "missing <S>"; it loads as the same vocabulary without one."""
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"\xef\xbb\xbf<S>\n</S>\n<UNK>\nthe\n")
    assert Vocab.load(path).words == ["<S>", "</S>", "<UNK>", "the"]
    path.write_bytes(b"<S>\n</S>\n<UNK>\n\xef\xbb\xbfthe\n")  # inside the file it is no BOM: part of the token
    assert Vocab.load(path).words[3] == "\ufeffthe"
