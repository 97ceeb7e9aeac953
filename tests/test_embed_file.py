"""`python -m elmo_jax.embed_file`: AllenNLP's `elmo` command layout, bucketing, atomic output, bad input.

The reference for every sentence's vectors is `embed` of that sentence alone (the fixture model, whose
`embed` outputs are checked against AllenNLP in test_parity_allennlp.py). In a file, a sentence shares its
batch with others: the matrix products then have other shapes, which XLA blocks differently, so the
float32 sums round differently; the bound follows from that rounding (`close_to`, tests/support/tolerance.py).
"""

from __future__ import annotations

import glob
import json
import os
import re

import h5py
import jax
import numpy as np
import pytest

import elmo_jax
from elmo_jax.features import batch_runner
from elmo_jax.features.length_buckets import LENGTHS
from elmo_jax.files import file_embedding as ef
from elmo_jax.formats import model_source
from tests.support.commands import error_line, run_command
from tests.support.inprocess import run_in_process
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms, lstm_terms

WORDS = ["the", "bank", "of", "river", ".", "a", "Zürich", "naïve", "'s", "x" * 20, "日本語", "<S>", "y" * 60]


def random_sentences(rng, n, max_len=30, words=WORDS):
    return [[str(rng.choice(words)) for _ in range(int(rng.integers(1, max_len + 1)))] for _ in range(n)]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_output(path):
    with h5py.File(path, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        return {name: f[name][...] for name in f if name != "sentence_to_index"}, index


def reference(params, tokens):
    """(L+1, n, 2P) float32: `embed` of one sentence alone."""
    if not tokens:
        return np.zeros((params.config.n_output_layers, 0, params.config.output_dim), np.float32)
    layers, _ = elmo_jax.embed(params, elmo_jax.batch_to_ids([tokens]))
    return np.asarray(layers)[0]


def close_to(params, got, expected, err_msg=""):
    """A sentence's vectors from a batch of other sentences against `embed` of it alone: the char CNN's
    and the LSTM's sums (over its tokens, <S> and </S>) may be ordered otherwise."""
    steps = got.shape[-2] + 2
    assert_close_up_to_order(got, expected, char_cnn_terms(params.config) + lstm_terms(params.config, steps), err_msg)


def write_previous_vectors(path) -> bytes:
    """An earlier output in the elmo-command layout (what --overwrite may replace); returns its bytes."""
    with h5py.File(path, "w") as f:
        f["0"] = np.ones((3, 2, 32), np.float32)
        f["sentence_to_index"] = np.array([json.dumps({"previous results": "0"})], dtype=h5py.string_dtype())
    return path.read_bytes()


def cli(*args):
    return run_command("elmo_jax.embed_file", *args)


@pytest.fixture(scope="module")
def sentences():
    """A few lengths in several buckets (1..70 tokens), one blank line, tokens over 50 bytes."""
    rng = np.random.default_rng(0)
    lengths = [1, 4, 4, 9, 9, 9, 17, 17, 33, 70, 4, 9, 17, 1, 9]
    lines = [" ".join(str(w) for w in rng.choice(WORDS, n)) for n in lengths]
    lines.insert(5, "")
    return lines


@pytest.fixture(scope="module")
def references(tiny_params, sentences):
    return {str(i): reference(tiny_params, line.split()) for i, line in enumerate(sentences)}


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "top", "average", "mix"])
def test_every_sentence_equals_embed_of_it_alone(tiny_params, sentences, references, tmp_path, layers):
    path = write_lines(tmp_path / "in.txt", sentences)
    scalars = (0.5, -1.0, 2.0) if layers == "mix" else None
    counts = ef.embed_file(
        tiny_params,
        str(path),
        str(tmp_path / "out.hdf5"),
        ef.Options(layers=layers, mix_scalars=scalars, gamma=0.7, batch_tokens=64),
    )
    vectors, index = read_output(tmp_path / "out.hdf5")
    assert set(vectors) == {str(i) for i in range(len(sentences))}
    assert counts["sentences"] == len(sentences) and counts["blank_lines"] == 1
    s = np.exp(np.array(scalars or (0.0, 0.0, 0.0)))
    mix = 0.7 * s / s.sum()
    for name, all_layers in references.items():
        expected = {
            "all": all_layers,
            "top": all_layers[-1],
            "average": all_layers.mean(axis=0),
            "mix": np.einsum("l,lnd->nd", mix, all_layers),
        }[layers]
        assert vectors[name].dtype == np.float32 and vectors[name].shape == expected.shape, name
        close_to(tiny_params, vectors[name], expected, err_msg=name)
    assert index == {line.strip(): str(i) for i, line in enumerate(sentences)}


def test_float16_halves_the_size_and_keeps_the_values(tiny_params, sentences, references, tmp_path):
    path = write_lines(tmp_path / "in.txt", sentences)
    ef.embed_file(tiny_params, str(path), str(tmp_path / "16.hdf5"), ef.Options(float16=True, batch_tokens=64))
    vectors, _ = read_output(tmp_path / "16.hdf5")
    for name, expected in references.items():
        assert vectors[name].dtype == np.float16
        np.testing.assert_allclose(vectors[name].astype(np.float32), expected, rtol=2**-10, atol=1e-4)


def test_input_order_batching_gives_the_same_vectors(tiny_params, sentences, references, tmp_path):
    path = write_lines(tmp_path / "in.txt", sentences)
    ef.embed_file(tiny_params, str(path), str(tmp_path / "plain.hdf5"), ef.Options(bucketing=False, batch_tokens=100))
    vectors, _ = read_output(tmp_path / "plain.hdf5")
    for name, expected in references.items():
        close_to(tiny_params, vectors[name], expected, err_msg=name)


def test_blank_lines_skipped_or_refused_by_flag(tiny_params, sentences, tmp_path):
    path = write_lines(tmp_path / "in.txt", sentences)
    counts = ef.embed_file(
        tiny_params, str(path), str(tmp_path / "skip.hdf5"), ef.Options(blank_lines="skip", batch_tokens=64)
    )
    vectors, index = read_output(tmp_path / "skip.hdf5")
    assert "5" not in vectors and "6" in vectors and "" not in index
    assert counts["sentences"] == len(sentences) - 1
    with pytest.raises(ValueError, match=r"in\.txt:6: blank line.*--blank_lines"):
        ef.embed_file(tiny_params, str(path), str(tmp_path / "error.hdf5"), ef.Options(blank_lines="error"))
    assert not (tmp_path / "error.hdf5").exists()


def test_long_sentences_refused_or_split_into_pieces(tiny_params, tmp_path):
    rng = np.random.default_rng(1)
    long = [str(w) for w in rng.choice(WORDS[:8], 26)]
    path = write_lines(tmp_path / "in.txt", ["the bank .", " ".join(long)])
    with pytest.raises(
        ValueError, match=r"in\.txt:2: 26 tokens, over --max_sentence_tokens=10.*--long_sentences=split"
    ):
        ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), ef.Options(max_sentence_tokens=10))
    assert not (tmp_path / "out.hdf5").exists()
    counts = ef.embed_file(
        tiny_params,
        str(path),
        str(tmp_path / "out.hdf5"),  # pieces in different batches
        ef.Options(max_sentence_tokens=10, long_sentences="split", batch_tokens=16),
    )
    assert counts["split_lines"] == 1
    vectors, _ = read_output(tmp_path / "out.hdf5")
    pieces = [reference(tiny_params, long[i : i + 10]) for i in range(0, 26, 10)]
    close_to(tiny_params, vectors["1"], np.concatenate(pieces, axis=1))


def expected_buckets(lines, C=50):
    """(length bucket, char-width bucket) of every non-blank line, derived from the rules by hand."""
    keys = set()
    for line in lines:
        tokens = line.split()
        if not tokens:
            continue
        T = min(length for length in LENGTHS if length >= len(tokens))
        widest = max(min(len(t.encode("utf-8")), C - 2) + 2 if t not in ("<S>", "</S>") else 3 for t in tokens)
        keys.add((T, min(-(-max(widest, 3) // 8) * 8, C)))
    return keys


@pytest.mark.slow
def test_ten_thousand_varied_sentences_compile_at_most_one_program_per_bucket(tiny_params, tmp_path):
    """Every batch has the shape of a bucket its sentences fall into, and XLA compiles each shape once; a
    bucket whose few sentences ride in a longer bucket's last batch needs no program of its own."""
    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(2.0, 0.8, 10_000).astype(int), 1, 120)
    vocabulary = WORDS[:9] + ["internationalization"]
    lines = [" ".join(rng.choice(vocabulary, n)) for n in lengths]
    path = write_lines(tmp_path / "in.txt", lines)
    program = batch_runner._chars_program(batch_runner.device_mesh(jax.local_devices()), "top", "float32")
    compiled_before = program._cache_size()
    counts = ef.embed_file(
        tiny_params,
        str(path),
        str(tmp_path / "out.hdf5"),
        ef.Options(layers="top", batch_tokens=2048, sentence_index=False),
    )
    buckets = expected_buckets(lines)
    assert counts["devices"] == 8 and counts["compiled_shapes"] <= len(buckets), (counts, sorted(buckets))
    assert program._cache_size() - compiled_before == counts["compiled_shapes"]
    assert counts["sentences"] == 10_000 and counts["tokens"] == int(lengths.sum())
    print(
        f"10,000 sentences ({counts['tokens']:,} tokens, lengths 1-120): {counts['batches']} batches, "
        f"{counts['compiled_shapes']} compiled shapes for {len(buckets)} buckets, {counts['seconds']:.1f} s"
    )


def test_cli_writes_the_file_and_reports_bad_input_in_one_line(fixture_dir, tmp_path):
    model = ["--options=" + str(fixture_dir / "options.json"), "--weights=" + str(fixture_dir / "weights.hdf5")]
    good = write_lines(tmp_path / "good.txt", ["The bank of the river .", "Hello !"])
    result = cli(*model, f"--input={good}", f"--output={tmp_path / 'out.hdf5'}", "--layers=top")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 sentences" in result.stdout
    vectors, _ = read_output(tmp_path / "out.hdf5")
    assert vectors["0"].shape == (6, 32) and vectors["1"].shape == (2, 32)
    bad_utf8 = tmp_path / "bad.txt"
    bad_utf8.write_bytes(b"fine line\nanother\nbroken \xff\xfe here\n")
    out = f"--output={tmp_path / 'x.hdf5'}"
    for args, expected in (
        ([*model, f"--input={bad_utf8}", out], "bad.txt:3: not valid UTF-8"),
        ([f"--model={tmp_path}", f"--input={good}", out], "missing manifest.json"),
        ([*model, f"--input={good}", out, "--layers=mix", "--mix_scalars=1,x"], "--mix_scalars"),
        ([model[0], f"--input={good}", out], "--weights"),
    ):
        error_line(run_in_process("elmo_jax.embed_file", *args), expected)
    assert not (tmp_path / "x.hdf5").exists() and not glob.glob(str(tmp_path / "x.hdf5.*"))


def test_bad_input_is_named_and_leaves_no_output(tiny_params, tmp_path):
    good = write_lines(tmp_path / "good.txt", ["The bank of the river .", "Hello !"])
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    out = str(tmp_path / "x.hdf5")
    cases = [
        ((str(empty), out, ef.Options()), ValueError, "empty.txt: the input file is empty"),
        ((str(tmp_path / "nope.txt"), out, ef.Options()), FileNotFoundError, "nope.txt: file not found"),
        ((str(tmp_path), out, ef.Options()), IsADirectoryError, "is a directory, expected a text file"),
        ((str(good), str(tmp_path / "no" / "x.hdf5"), ef.Options()), FileNotFoundError, "does not exist"),
        (
            (str(good), str(tmp_path), ef.Options()),
            IsADirectoryError,
            "is a directory; expected an elmo-command HDF5 vectors file",
        ),
        ((str(good), out, ef.Options(batch_tokens=0)), ValueError, "batch_tokens must be positive"),
        ((str(good), out, ef.Options(layers="mix", mix_scalars=(1.0, 2.0))), ValueError, "expected 3 values"),
        ((str(good), out, ef.Options(layers="top", mix_scalars=(1.0, 2.0, 3.0))), ValueError, "--layers=mix"),
    ]
    for args, error, expected in cases:
        with pytest.raises(error, match=re.escape(expected)):
            ef.embed_file(tiny_params, *args)
    with pytest.raises(FileNotFoundError, match="no such model directory, and not a published model name"):
        model_source.load_model(str(tmp_path / "absent"), None, None)
    with pytest.raises(ValueError, match="either --model"):
        model_source.load_model(str(tmp_path), "options.json", None)
    assert sorted(os.listdir(tmp_path)) == ["empty.txt", "good.txt"]


def test_sentences_longer_than_the_largest_length_bucket(tiny_params, tmp_path):
    tokens = [str(w) for w in np.random.default_rng(4).choice(WORDS[:8], 1050)]
    path = write_lines(tmp_path / "in.txt", ["the bank .", " ".join(tokens)])
    ef.embed_file(
        tiny_params, str(path), str(tmp_path / "out.hdf5"), ef.Options(max_sentence_tokens=2000, layers="top")
    )
    vectors, _ = read_output(tmp_path / "out.hdf5")
    close_to(tiny_params, vectors["1"], reference(tiny_params, tokens)[-1])


def test_input_that_is_the_output_a_pipe_or_changes_is_refused(tiny_params, tmp_path, monkeypatch):
    path = write_lines(tmp_path / "in.txt", ["the bank .", "hello !"])
    before = path.read_bytes()
    with pytest.raises(ValueError, match="is the input"):
        ef.embed_file(tiny_params, str(path), str(path))
    assert path.read_bytes() == before
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        ef.embed_file(tiny_params, str(fifo), str(tmp_path / "out.hdf5"))
    real_lines = ef.sentence_input.lines
    monkeypatch.setattr(ef.sentence_input, "lines", lambda p: list(real_lines(p))[:1])  # the file shrank
    with pytest.raises(ValueError, match="changed while it was read"):
        ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"))
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "pipe"]


def test_a_failing_write_is_named_and_leaves_nothing(tiny_params, tmp_path, monkeypatch):
    path = write_lines(tmp_path / "in.txt", ["the bank .", "hello !"])
    previous = write_previous_vectors(tmp_path / "out.hdf5")

    def full_disk(self, key, value):
        raise RuntimeError("Can't write data (file write failed: errno = 28, error message = 'No space left')")

    monkeypatch.setattr(h5py.Dataset, "__setitem__", full_disk)
    with pytest.raises(OSError, match=r"--output=.*out\.hdf5: writing the HDF5 file failed .*No space left"):
        ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), ef.Options(overwrite=True))
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]
    assert (tmp_path / "out.hdf5").read_bytes() == previous
