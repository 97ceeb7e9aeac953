"""`embed_file` at scale: every local device, several processes, the token cache, pooled sentence vectors.

References: `embed` of each sentence alone (itself checked against AllenNLP in test_parity_allennlp.py),
NumPy re-derivations of the mix and the mean (tests/reference/elmo_equations.py), and for devices,
processes and the cache the same file written the plain way (1 device, 1 process, the char CNN for every
token). Other batch shapes round float32 sums differently, so the project's tolerance (1e-5; 1e-6 for the
cache, issue #6) applies.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import h5py
import numpy as np
import pytest

import elmo_jax
from elmo_jax.files import file_embedding as ef
from tests.reference.elmo_equations import np_sentence_mean
from tests.support.commands import REPO, command_argv, command_env, error_line
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms, lstm_terms

ATOL = 1e-5  # against NumPy formulas of `embed`'s layers (test_sentence_mean_is_the_mean_of_the_mix_over_real_tokens)
WORDS = ["the", "bank", "of", "river", ".", "a", "Zürich", "naïve", "'s", "x" * 20, "<S>"]


def write_input(path, n=60, seed=0):
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, int(rng.integers(1, 13)))) for _ in range(n)]
    lines[4] = ""
    lines[9] = " ".join(rng.choice(WORDS, 30))  # split into pieces of 12 tokens
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path, lines


def read_output(path):
    with h5py.File(path, "r") as f:
        index = json.loads(f["sentence_to_index"][0]) if "sentence_to_index" in f else None
        return {name: f[name][...] for name in f if name != "sentence_to_index"}, index


def assert_same(got, expected, terms):
    """Two files of the same vectors, computed with `terms` dependent sums ordered otherwise."""
    assert sorted(got[0]) == sorted(expected[0]) and got[1] == expected[1]
    for name, vectors in expected[0].items():
        assert got[0][name].shape == vectors.shape, name
        assert_close_up_to_order(got[0][name], vectors, terms, err_msg=name)


def batch_terms(config) -> int:
    """Other batch shapes: the char CNN's and the LSTM's sums (pieces of at most 12 tokens, plus <S>, </S>)."""
    return char_cnn_terms(config) + lstm_terms(config, SPLIT["max_sentence_tokens"] + 2)


SPLIT = dict(long_sentences="split", max_sentence_tokens=12, batch_tokens=64)


@pytest.fixture(scope="module")
def one_device(tiny_params, tmp_path_factory):
    """The input and the file written on one device."""
    root = tmp_path_factory.mktemp("one_device")
    path, lines = write_input(root / "in.txt")
    counts = ef.embed_file(tiny_params, str(path), str(root / "out.hdf5"), ef.Options(devices=(0,), **SPLIT))
    assert counts["devices"] == 1 and counts["split_lines"] == 1
    return path, lines, read_output(root / "out.hdf5")


def test_eight_devices_write_the_one_device_file(tiny_params, one_device, tmp_path):
    path, _, expected = one_device
    counts = ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), ef.Options(**SPLIT))
    assert counts["devices"] == 8 and counts["compiled_shapes"] <= counts["batches"]
    assert_same(read_output(tmp_path / "out.hdf5"), expected, batch_terms(tiny_params.config))


def test_sentence_mean_is_the_mean_of_the_mix_over_real_tokens(tiny_params, one_device, tmp_path):
    """One (2P,) vector per line; a split line is pooled over all its pieces; a blank line is zeros."""
    path, lines, _ = one_device
    s, gamma = (0.5, -1.0, 2.0), 0.7
    options = ef.Options(layers="sentence_mean", mix_scalars=s, gamma=gamma, **SPLIT)
    ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), options)
    vectors, index = read_output(tmp_path / "out.hdf5")
    assert index == {line: str(i) for i, line in enumerate(lines)}
    pieces = [(i, line.split()[start : start + 12]) for i, line in enumerate(lines) for start in range(0, 30, 12)]
    pieces = [(i, piece) for i, piece in pieces if piece]
    layers, _ = elmo_jax.embed(tiny_params, elmo_jax.batch_to_ids([piece for _, piece in pieces]))
    layers = np.asarray(layers)  # every piece alone in its row: (pieces, L+1, 12, 2P), zeros at padding
    for i, line in enumerate(lines):
        rows = [(row, len(piece)) for row, (j, piece) in enumerate(pieces) if j == i]
        own = np.concatenate([np.zeros((3, 0, 32))] + [layers[row, :, :n] for row, n in rows], axis=1)
        expected = np_sentence_mean(own, s, gamma)
        assert vectors[str(i)].shape == (32,) and vectors[str(i)].dtype == np.float32
        np.testing.assert_allclose(vectors[str(i)], expected, rtol=0, atol=ATOL, err_msg=line)
    assert np.all(vectors["4"] == 0.0)


def test_the_vocabulary_cache_gives_the_char_cnn_vectors(tiny_params, one_device, tmp_path):
    """With a vocabulary (a model directory's vocab.txt), its words in the input skip the char CNN."""
    path, lines, expected = one_device
    vocabulary = ["<S>", "</S>", "<UNK>", "the", "bank", "river", "x" * 20, "unused"]
    options = ef.Options(devices=(0,), **SPLIT)
    counts = ef.embed_file(tiny_params, str(path), str(tmp_path / "out.hdf5"), options, vocabulary=vocabulary)
    assert counts["cached_types"] == 6  # the vocabulary's words in the input, plus <S> and </S>
    assert_same(read_output(tmp_path / "out.hdf5"), expected, char_cnn_terms(tiny_params.config))
    off = ef.Options(devices=(0,), token_cache="off", **SPLIT)
    counts = ef.embed_file(tiny_params, str(path), str(tmp_path / "off.hdf5"), off, vocabulary=vocabulary)
    assert counts["cached_types"] == 0
    with pytest.raises(ValueError, match="--token_cache must be one of"):
        ef.embed_file(tiny_params, str(path), str(tmp_path / "x.hdf5"), ef.Options(token_cache="on"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_killed_process_stops_the_other_at_once_and_the_same_commands_continue(
    fixture_dir, tiny_params, one_device, tmp_path
):
    """`--coordinator_address ... --num_processes=2`: two processes with 2 CPU devices each (gloo), every
    other line each, process 0 writing the file. Process 1 is killed (SIGKILL) while it spools (paused at
    its second batch by tests/support/pausing.py, so the kill lands there): process 0 does not wait for
    it: it exits 1 at once, its last line one error naming process 1 and where its own progress is kept.
    Both spools are kept, and the same two commands then continue from them, each its own share, and
    write the single-process file, leaving no staging. (This is the suite's two-process embed_file run:
    a fresh one differs from the continuation only in having no spool to adopt.)"""
    path, _, expected = one_device
    target = tmp_path / "out.hdf5"
    marker = tmp_path / "process_1_paused"
    env = command_env(devices=2)

    def start(i: int, port: int, log, pause: bool = False) -> subprocess.Popen:
        argv = command_argv(
            "elmo_jax.embed_file", *split_run_args(fixture_dir, path, target, port), f"--process_id={i}"
        )
        if pause:  # python -m tests.support.pausing Spool.append 2 MARKER -m elmo_jax.embed_file ...
            argv[1:1] = ["-m", "tests.support.pausing", "elmo_jax.formats.vector_spool:Spool.append", "2", str(marker)]
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    logs = [open(tmp_path / f"process_{i}.log", "w+") for i in range(2)]
    port = free_port()
    first = [start(0, port, logs[0]), start(1, port, logs[1], pause=True)]
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert time.monotonic() < deadline and all(p.poll() is None for p in first), read_logs(logs)
            time.sleep(0.05)
        first[1].kill()
        first[1].wait(timeout=60)
        code = first[0].wait(timeout=60)  # not JAX's 100 s heartbeat timeout, nor forever
    finally:
        for p in first:
            if p.poll() is None:
                p.kill()
    survivor = read_logs(logs)[0]
    line = error_line(subprocess.CompletedProcess([], code, "", survivor), f"--output={target}: process 1 of 2")
    assert "run the same commands again (every process) to continue" in line and "kept in" in line
    assert len([n for n in os.listdir(tmp_path) if n.startswith(".out.hdf5.")]) == 2  # both spools kept

    for log in logs:
        log.seek(0)
        log.truncate()
    port = free_port()
    again = [start(i, port, logs[i]) for i in range(2)]
    try:
        codes = [p.wait(timeout=240) for p in again]
    finally:
        for p in again:
            if p.poll() is None:
                p.kill()
    outputs = read_logs(logs)
    for log in logs:
        log.close()
    assert codes == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    assert all("resuming the run of pid" in o and "from the stopped run" in o for o in outputs)
    # Line 5 (index 4) is blank: process 0 embeds 29 lines, process 1 the other 30.
    assert "(process 1 of 2): 30 sentences" in outputs[1] and "2 devices" in outputs[1]
    assert f"wrote {target} (process 0 of 2): 60 sentences" in outputs[0]  # the whole file
    assert sorted(os.listdir(tmp_path)) == ["out.hdf5", "process_0.log", "process_1.log", "process_1_paused"]
    assert_same(read_output(target), expected, batch_terms(tiny_params.config))


def split_run_args(fixture_dir, path, target, port: int) -> list[str]:
    """The flags of every process of a two-process run of `one_device`'s input."""
    return [
        f"--options={fixture_dir / 'options.json'}",
        f"--weights={fixture_dir / 'weights.hdf5'}",
        f"--input={path}",
        f"--output={target}",
        "--long_sentences=split",
        "--max_sentence_tokens=12",
        "--batch_tokens=64",
        "--progress=false",
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
    ]


def read_logs(logs) -> list[str]:
    """What each process has written so far."""
    texts = []
    for log in logs:
        log.flush()
        log.seek(0)
        texts.append(log.read())
    return texts
