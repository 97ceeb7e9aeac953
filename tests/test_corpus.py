"""Corpora as random-access sentence sequences: local files through TFDS (no TensorFlow), by name, grain,
and the built-in standard-library corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds

from elmo_jax.data import default_corpus, text_files, tfds_corpus

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
    return tfds_corpus.prepare_local_corpus(files["train"], files["test"], tmp_path / "tfds", max_line_chars=40)


def test_local_corpus_round_trip(prepared):
    train = tfds_corpus.open_sentences("train", builder=prepared)
    assert len(train) == len(TRAIN_EXPECTED)
    assert [train[i] for i in range(len(train))] == TRAIN_EXPECTED  # normalised, in file order
    assert list(tfds_corpus.open_sentences("test", builder=prepared)) == ["a heldout sentence .", "another one"]
    assert prepared.info.features["text"].__class__ is tfds.features.Text  # the stock lm1b features
    assert "tensorflow" not in sys.modules


def test_read_counts_are_stored_with_the_dataset(prepared, files, tmp_path):
    stats = tfds_corpus.read_stats(prepared)["train"]
    assert (
        stats.files,
        stats.lines,
        stats.sentences,
        stats.blank_lines,
        stats.long_lines,
        stats.invalid_utf8_replaced,
    ) == (2, 7, 5, 1, 1, 1)
    assert stats.examples["long_lines"] == [os.path.abspath(files["train"].replace("*", "01")) + ":2"]
    reread = tfds.builder(tfds_corpus.tfds_name(prepared), data_dir=tmp_path / "tfds")  # from disk only
    assert tfds_corpus.read_stats(reread)["train"] == stats


def test_prepare_is_idempotent_and_never_stale(prepared, files, tmp_path, monkeypatch):
    def no_regeneration(self, **kwargs):
        raise AssertionError("a prepared dataset was generated again")

    with monkeypatch.context() as patch:
        patch.setattr(tfds_corpus.LocalTextCorpus, "_generate_examples", no_regeneration)
        again = tfds_corpus.prepare_local_corpus(files["train"], files["test"], tmp_path / "tfds", max_line_chars=40)
    assert tfds_corpus.tfds_name(again) == tfds_corpus.tfds_name(prepared)
    assert list(tfds_corpus.open_sentences("train", builder=again)) == TRAIN_EXPECTED

    with open(files["test"], "a", encoding="utf-8") as f:
        f.write("a new line\n")
    changed = tfds_corpus.prepare_local_corpus(files["train"], files["test"], tmp_path / "tfds", max_line_chars=40)
    assert tfds_corpus.tfds_name(changed) != tfds_corpus.tfds_name(prepared)
    assert tfds_corpus.open_sentences("test", builder=changed)[-1] == "a new line"
    other_options = tfds_corpus.prepare_local_corpus(
        files["train"], files["test"], tmp_path / "tfds", max_line_chars=40, invalid_utf8="skip"
    )
    assert "bad \ufffd byte" not in list(tfds_corpus.open_sentences("train", builder=other_options))


def test_open_sentences_from_files_and_by_name(files, tmp_path):
    data_dir = tmp_path / "tfds"
    train = tfds_corpus.open_sentences("train", files=files, data_dir=data_dir)
    assert list(train) == TRAIN_EXPECTED[:2] + [
        "bad \ufffd byte",
        "second file , first line",
        "x" * 50,
        "last line without newline",
    ]  # default line limit
    name = train.name.split("[")[0]
    assert list(tfds_corpus.open_sentences("test", tfds_name=name, data_dir=data_dir)) == [
        "a heldout sentence .",
        "another one",
    ]
    assert tfds_corpus.open_sentences("train[1:3]", tfds_name=name, data_dir=data_dir)[:] == [
        "on the mat",
        "bad \ufffd byte",
    ]


class Lm1bStandIn(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Writes a dataset where the stock `lm1b` builder looks for it (its download cannot run here)."""

    name = "lm1b"
    VERSION = tfds.core.Version("1.1.0")  # the stock builder's version
    code_path = None  # see tfds_corpus.LocalTextCorpus.code_path
    LINES = {"train": ["a  train line", "another"], "test": ["  the test line ", "last"]}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            supervised_keys=("text", "text"),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in self.LINES}

    def _generate_examples(self, split):
        for index, line in enumerate(self.LINES[split]):
            yield f"line_{index}", {"text": line.strip()}  # as the stock builder stores them


def test_a_stock_dataset_by_name(tmp_path):
    Lm1bStandIn(data_dir=tmp_path, file_format="array_record").download_and_prepare()
    test = tfds_corpus.open_sentences("test", tfds_name="lm1b", data_dir=tmp_path)
    assert test.name == "lm1b[test]"
    assert sorted(test) == ["last", "the test line"]  # TFDS shuffled them by key when preparing
    assert sorted(tfds_corpus.open_sentences("train", tfds_name="lm1b", data_dir=tmp_path)) == [
        "a  train line",
        "another",
    ]


def test_reading_by_name_needs_neither_this_package_nor_tensorflow(prepared, tmp_path):
    script = (
        "import json, sys; import tensorflow_datasets as tfds; "
        f"src = tfds.data_source({tfds_corpus.tfds_name(prepared)!r}, split='train', "
        f"data_dir={str(tmp_path / 'tfds')!r}, download=False); "
        "print(json.dumps([[r['text'].decode() for r in src], 'tensorflow' in sys.modules, "
        "'elmo_jax' in sys.modules]))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [TRAIN_EXPECTED, False, False]


def test_sentence_source_indexing(prepared):
    train = tfds_corpus.open_sentences("train", builder=prepared)
    assert train[-1] == TRAIN_EXPECTED[-1] and train[1:4:2] == [TRAIN_EXPECTED[1], TRAIN_EXPECTED[3]]
    assert train.__getitems__([4, 0]) == [TRAIN_EXPECTED[4], TRAIN_EXPECTED[0]]
    for index in (5, -6):
        with pytest.raises(IndexError, match=rf"sentence {index} is out of range for .*\[train\] \(5 sentences\)"):
            train[index]


def test_grain_random_access(prepared):
    import grain

    train = tfds_corpus.open_sentences("train", builder=prepared)
    stream = grain.MapDataset.source(train).shuffle(seed=7).repeat()
    epochs = [[stream[e * len(train) + i] for i in range(len(train))] for e in range(2)]
    assert all(sorted(epoch) == sorted(TRAIN_EXPECTED) for epoch in epochs)
    assert epochs[0] != epochs[1]  # reshuffled per epoch
    again = grain.MapDataset.source(train).shuffle(seed=7).repeat()
    assert [again[i] for i in range(2 * len(train))] == epochs[0] + epochs[1]  # reproducible from the seed


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(), ValueError, r"exactly one of tfds_name, files, builder; got none"),
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


def test_open_sentences_names_missing_split(files, tmp_path):
    builder = tfds_corpus.prepare_local_corpus(files["train"], None, tmp_path / "tfds")
    with pytest.raises(ValueError, match=r"has no split 'test'; it has \['train'\]"):
        tfds_corpus.open_sentences("test", builder=builder)


def test_prepare_rejects_bad_input(files, tmp_path):
    with pytest.raises(ValueError, match=r"name='my corpus': expected letters, digits and '_' only"):
        tfds_corpus.prepare_local_corpus(files["train"], None, tmp_path, name="my corpus")
    with pytest.raises(FileNotFoundError, match="no file matches"):
        tfds_corpus.prepare_local_corpus(str(tmp_path / "missing-*"), None, tmp_path)
    with pytest.raises(ValueError, match=r"1 file\(s\) are in both the train and the heldout files: .*heldout\.txt"):
        tfds_corpus.prepare_local_corpus([files["train"], files["test"]], files["test"], tmp_path)
    with pytest.raises(ValueError, match=r"max_line_chars=0"):
        tfds_corpus.prepare_local_corpus(files["train"], None, tmp_path, max_line_chars=0)
    assert not os.path.exists(tmp_path / "local_text_corpus")  # rejected before TFDS wrote anything
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"split 'train' has no sentences: .*blank=2"):
        tfds_corpus.prepare_local_corpus(str(blank), None, tmp_path / "tfds")


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


def test_a_split_over_the_in_memory_limit_prepares_without_tensorflow(files, tmp_path, monkeypatch):
    """TFDS spills splits over 1000 MiB through tf.io.gfile; without TensorFlow they must stay in memory.

    The limit is lowered to 64 bytes so the tiny corpus counts as "large"."""
    from tensorflow_datasets.core import shuffle

    monkeypatch.setattr(shuffle, "MAX_MEM_BUFFER_SIZE", 64)
    builder = tfds_corpus.prepare_local_corpus(files["train"], files["test"], tmp_path / "big", max_line_chars=40)
    train = tfds_corpus.open_sentences("train", builder=builder)
    assert [train[i] for i in range(len(train))] == TRAIN_EXPECTED
    assert shuffle.MAX_MEM_BUFFER_SIZE == 64  # restored afterwards
    assert "tensorflow" not in sys.modules
