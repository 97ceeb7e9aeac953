"""Corpora as random-access sentence sequences: local files prepared as ArrayRecord shards (no TFDS, no
TensorFlow), stock TFDS datasets by name, grain, and the built-in standard-library corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from elmo_jax.data import default_corpus, local_corpus, shard_writer, text_files, tfds_corpus
from tests.support.tfds_datasets import Lm1bStandIn

TRAIN_A = "The  cat sat .\n\n  on the\tmat  \nbad \xff byte\n"
TRAIN_B = "second file , first line\n" + "x" * 50 + "\nlast line without newline"
HELDOUT = "a heldout sentence .\nanother one\n"
TRAIN_EXPECTED = [
    "The cat sat .",
    "on the mat",
    "bad \ufffd byte",
    "second file , first line",
    "last line without newline",
]


@pytest.fixture
def files(tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    (text / "train-00.txt").write_bytes(TRAIN_A.encode("latin-1"))  # \xff is not UTF-8
    (text / "train-01.txt").write_text(TRAIN_B, encoding="utf-8")
    (text / "heldout.txt").write_text(HELDOUT, encoding="utf-8")
    return {"train": str(text / "train-*.txt"), "test": str(text / "heldout.txt")}


@pytest.fixture
def prepared(files, tmp_path):
    return local_corpus.prepare_local_corpus(files["train"], files["test"], tmp_path / "prepared", max_line_chars=40)


def test_local_corpus_round_trip(prepared):
    train = local_corpus.open_split(prepared, "train")
    assert len(train) == len(TRAIN_EXPECTED)
    assert [train[i] for i in range(len(train))] == TRAIN_EXPECTED  # normalised, in file order
    assert list(local_corpus.open_split(prepared, "test")) == ["a heldout sentence .", "another one"]
    assert prepared.sentences("train") == len(TRAIN_EXPECTED)
    assert "tensorflow" not in sys.modules


def test_read_counts_are_stored_with_the_corpus(prepared, files):
    stats = local_corpus.read_stats(prepared)["train"]
    assert (
        stats.files,
        stats.lines,
        stats.sentences,
        stats.blank_lines,
        stats.long_lines,
        stats.invalid_utf8_replaced,
    ) == (2, 7, 5, 1, 1, 1)
    assert stats.examples["long_lines"] == [os.path.abspath(files["train"].replace("*", "01")) + ":2"]
    assert local_corpus.read_stats(local_corpus.load_prepared(prepared.directory))["train"] == stats  # from disk


def test_prepare_is_idempotent_and_never_stale(prepared, files, tmp_path, monkeypatch):
    def no_rewrite(*args, **kwargs):
        raise AssertionError("a prepared corpus was written again")

    with monkeypatch.context() as patch:
        patch.setattr(local_corpus, "_write_split", no_rewrite)
        again = local_corpus.prepare_local_corpus(
            files["train"], files["test"], tmp_path / "prepared", max_line_chars=40
        )
    assert again == prepared
    assert list(local_corpus.open_split(again, "train")) == TRAIN_EXPECTED

    with open(files["test"], "a", encoding="utf-8") as f:
        f.write("a new line\n")
    changed = local_corpus.prepare_local_corpus(files["train"], files["test"], tmp_path / "prepared", max_line_chars=40)
    assert changed.name != prepared.name and os.path.isdir(prepared.directory)  # the old one is left alone
    assert local_corpus.open_split(changed, "test")[-1] == "a new line"
    other_options = local_corpus.prepare_local_corpus(
        files["train"], files["test"], tmp_path / "prepared", max_line_chars=40, invalid_utf8="skip"
    )
    assert "bad \ufffd byte" not in list(local_corpus.open_split(other_options, "train"))


@pytest.mark.parametrize("writer_processes", [0, 2])
def test_shards_follow_the_text_in_order(files, tmp_path, writer_processes):
    """With shards of at most ~20 bytes of text, the five sentences spread over several files and read
    back in file order, also through ArrayRecord's own reader given the manifest's shard list; the same
    whether this process writes the shards or helper processes do."""
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    corpus = local_corpus.prepare_local_corpus(
        files["train"], None, tmp_path, max_line_chars=40, shard_bytes=20, writer_processes=writer_processes
    )
    shards = corpus.splits["train"]
    assert len(shards) == 3 and [s.records for s in shards] == [2, 2, 1]
    assert sum(s.bytes for s in shards) == sum(len(t.encode()) for t in TRAIN_EXPECTED)
    assert list(local_corpus.open_split(corpus, "train")) == TRAIN_EXPECTED
    plain = ArrayRecordDataSource([os.path.join(corpus.directory, s.file) for s in shards])
    assert [plain[i].decode() for i in range(len(plain))] == TRAIN_EXPECTED


def test_a_failing_writer_process_is_reported_with_its_shard(tmp_path):
    """A helper that cannot write its shard (here: its directory is missing) makes `close` raise OSError
    naming the shard and the helper's reason; the helpers are stopped either way."""
    helpers = shard_writer.ShardProcesses(2)
    good, bad = str(tmp_path / "good.array_record"), str(tmp_path / "missing" / "bad.array_record")
    helpers.submit(good, b"one two\nthree\n", 2)
    helpers.submit(bad, b"four\n", 1)
    with pytest.raises(OSError, match=r"writing .*missing/bad\.array_record failed: .+"):
        helpers.close()
    assert helpers.errors == {} and os.path.getsize(good) > 0


def test_an_interrupted_preparation_leaves_nothing_prepared(files, tmp_path, monkeypatch):
    """A failure while writing (here: the third record) leaves no corpus under its name and no staging;
    the next call prepares it whole. A corpus damaged later (a shard deleted) is prepared again."""
    real_writer = shard_writer.array_record_module.ArrayRecordWriter

    class FailingWriter:
        written = 0

        def __init__(self, *args):
            self._writer = real_writer(*args)

        def write(self, record):
            FailingWriter.written += 1
            if FailingWriter.written == 3:
                raise OSError(28, "No space left on device")
            self._writer.write(record)

        def close(self):
            self._writer.close()

    with monkeypatch.context() as patch:
        patch.setattr(shard_writer.array_record_module, "ArrayRecordWriter", FailingWriter)
        with pytest.raises(OSError, match="No space left"):
            local_corpus.prepare_local_corpus(files["train"], None, tmp_path, max_line_chars=40)
    assert os.listdir(tmp_path / local_corpus.DIRECTORY) == []
    corpus = local_corpus.prepare_local_corpus(files["train"], None, tmp_path, max_line_chars=40)
    assert list(local_corpus.open_split(corpus, "train")) == TRAIN_EXPECTED

    os.remove(os.path.join(corpus.directory, corpus.splits["train"][0].file))
    again = local_corpus.prepare_local_corpus(files["train"], None, tmp_path, max_line_chars=40)
    assert list(local_corpus.open_split(again, "train")) == TRAIN_EXPECTED


def test_open_sentences_from_files_and_from_a_corpus(files, tmp_path):
    data_dir = tmp_path / "prepared"
    train = tfds_corpus.open_sentences("train", files=files, data_dir=data_dir)
    assert list(train) == TRAIN_EXPECTED[:2] + [
        "bad \ufffd byte",
        "second file , first line",
        "x" * 50,
        "last line without newline",
    ]  # default line limit
    corpus = local_corpus.load_prepared(os.path.join(data_dir, local_corpus.DIRECTORY, train.name.split("[")[0]))
    assert list(tfds_corpus.open_sentences("test", corpus=corpus)) == ["a heldout sentence .", "another one"]


def test_a_stock_dataset_by_name(tmp_path):
    Lm1bStandIn(data_dir=tmp_path, file_format="array_record").download_and_prepare()
    test = tfds_corpus.open_sentences("test", tfds_name="lm1b", data_dir=tmp_path)
    assert test.name == "lm1b[test]"
    assert sorted(test) == ["last", "the test line"]  # TFDS shuffled them by key when preparing
    assert sorted(tfds_corpus.open_sentences("train", tfds_name="lm1b", data_dir=tmp_path)) == [
        "a  train line",
        "another",
    ]


def test_reading_needs_neither_this_package_nor_tensorflow(prepared):
    """The manifest and the array_record package are all a reader needs."""
    script = (
        "import json, os, sys; from array_record.python.array_record_data_source import ArrayRecordDataSource; "
        f"d = {prepared.directory!r}; m = json.load(open(os.path.join(d, 'manifest.json'))); "
        "src = ArrayRecordDataSource([os.path.join(d, s['file']) for s in m['splits']['train']['shards']]); "
        "print(json.dumps([[src[i].decode() for i in range(len(src))], 'tensorflow' in sys.modules, "
        "'elmo_jax' in sys.modules]))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [TRAIN_EXPECTED, False, False]


def test_sentence_source_indexing(prepared):
    train = local_corpus.open_split(prepared, "train")
    assert train[-1] == TRAIN_EXPECTED[-1] and train[1:4:2] == [TRAIN_EXPECTED[1], TRAIN_EXPECTED[3]]
    assert train.__getitems__([4, 0]) == [TRAIN_EXPECTED[4], TRAIN_EXPECTED[0]]
    for index in (5, -6):
        with pytest.raises(IndexError, match=rf"sentence {index} is out of range for .*\[train\] \(5 sentences\)"):
            train[index]


def test_grain_random_access(prepared):
    import grain

    train = local_corpus.open_split(prepared, "train")
    stream = grain.MapDataset.source(train).shuffle(seed=7).repeat()
    epochs = [[stream[e * len(train) + i] for i in range(len(train))] for e in range(2)]
    assert all(sorted(epoch) == sorted(TRAIN_EXPECTED) for epoch in epochs)
    assert epochs[0] != epochs[1]  # reshuffled per epoch
    again = grain.MapDataset.source(train).shuffle(seed=7).repeat()
    assert [again[i] for i in range(2 * len(train))] == epochs[0] + epochs[1]  # reproducible from the seed


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(), ValueError, r"exactly one of tfds_name, files, corpus; got none"),
        (dict(tfds_name="lm1b", files={"train": "x"}), ValueError, r"got \['tfds_name', 'files'\]"),
        (dict(files={"heldout": "x"}), ValueError, r"expected keys 'train' and optionally 'test', found \['heldout'\]"),
        (dict(tfds_name="lm1b"), FileNotFoundError, r"TFDS dataset 'lm1b' is not prepared in .*lm1b"),
        (dict(tfds_name="no_such_dataset"), ValueError, r"cannot open TFDS dataset 'no_such_dataset' .*not found\.$"),
    ],
    ids=["none", "two", "bad_files_key", "not_prepared", "unknown"],
)
def test_open_sentences_rejects(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        tfds_corpus.open_sentences("train", data_dir=tmp_path, **kwargs)


def test_open_split_names_missing_split(files, tmp_path):
    corpus = local_corpus.prepare_local_corpus(files["train"], None, tmp_path)
    with pytest.raises(ValueError, match=r"has no split 'test'; it has \['train'\]"):
        local_corpus.open_split(corpus, "test")


def test_prepare_rejects_bad_input(files, tmp_path):
    with pytest.raises(ValueError, match=r"name='my corpus': expected letters, digits and '_' only"):
        local_corpus.prepare_local_corpus(files["train"], None, tmp_path, name="my corpus")
    with pytest.raises(FileNotFoundError, match="no file matches"):
        local_corpus.prepare_local_corpus(str(tmp_path / "missing-*"), None, tmp_path)
    with pytest.raises(ValueError, match=r"1 file\(s\) are in both the train and the heldout files: .*heldout\.txt"):
        local_corpus.prepare_local_corpus([files["train"], files["test"]], files["test"], tmp_path)
    with pytest.raises(ValueError, match=r"max_line_chars=0"):
        local_corpus.prepare_local_corpus(files["train"], None, tmp_path, max_line_chars=0)
    assert not os.path.exists(tmp_path / "local_text_corpus")  # rejected before anything was written
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"split 'train' has no sentences: .*blank=2"):
        local_corpus.prepare_local_corpus(str(blank), None, tmp_path / "prepared")


# ----------------------------------------------------------------------------- default corpus

SMALL = ("argparse", "heapq", "textwrap")


def test_default_corpus_is_deterministic_and_reused(tmp_path):
    first = default_corpus.build_default_corpus(tmp_path / "a", modules=SMALL)
    second = default_corpus.build_default_corpus(tmp_path / "b", modules=SMALL)
    for x, y in zip(first, second):
        assert open(x, "rb").read() == open(y, "rb").read()
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["python"] == sys.version and manifest["modules"] == list(SMALL)
    assert manifest["train"]["sentences"] > 200 and manifest["heldout"]["sentences"] > 5

    stamp = os.stat(first[0]).st_mtime_ns
    assert default_corpus.build_default_corpus(tmp_path / "a", modules=SMALL) == first
    assert os.stat(first[0]).st_mtime_ns == stamp  # reused, not rewritten
    assert default_corpus.build_default_corpus(tmp_path / "a", modules=SMALL[:2]) == first
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["modules"] == list(SMALL[:2])


def test_default_corpus_is_in_the_corpus_format(tmp_path):
    train, heldout = default_corpus.build_default_corpus(tmp_path, modules=SMALL)
    stats = text_files.ReadStats()
    sentences = list(text_files.iter_sentences([train, heldout], stats=stats))
    assert stats.sentences == stats.lines and stats.skipped_lines == 0 and stats.invalid_utf8_replaced == 0
    lines = [line for path in (train, heldout) for line in open(path, encoding="utf-8").read().splitlines()]
    assert lines == [" ".join(tokens) for tokens in sentences]  # already normalised
    assert len(set(lines)) == len(lines)  # de-duplicated, so no sentence is in both splits
    assert all(default_corpus.MIN_TOKENS <= len(tokens) <= default_corpus.MAX_TOKENS for tokens in sentences)


def test_default_corpus_tokenizer():
    assert default_corpus.tokenize("Use os.path.join(a, b) -- it's 3.14x faster, e.g. here!") == [
        "Use",
        "os.path.join",
        "(",
        "a",
        ",",
        "b",
        ")",
        "-",
        "-",
        "it's",
        "3.14x",
        "faster",
        ",",
        "e.g",
        ".",
        "here",
        "!",
    ]


def test_default_corpus_names_missing_modules(tmp_path):
    default_corpus.build_default_corpus(tmp_path, modules=("heapq", "no_such_module"))
    assert json.loads((tmp_path / "manifest.json").read_text())["missing_modules"] == ["no_such_module"]
    with pytest.raises(FileNotFoundError, match=r"none of the modules \['no_such_module'\] has source"):
        default_corpus.build_default_corpus(tmp_path / "x", modules=("no_such_module",))
