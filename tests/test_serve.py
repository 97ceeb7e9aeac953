"""`python -m elmo_jax.serve`: a real HTTP client (http.client) on loopback against the service, in-process
(uvicorn in a thread, the fixture's tiny biLM on the 8 test devices) and once as a real process (SIGTERM).

References: `elmo_jax.embed` of the same sentences in one padded batch, reduced per output mode by the
NumPy formulas of tests/reference/elmo_equations.py, and `embed_sentences` of each output mode (the
library's modes, which the service answers through); the packed rows of the service sum in another
order, so the float32 bound is derived from rounding (tests/support/tolerance.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import io
import json
import re
import signal
import subprocess
import threading
import time
import types
import weakref

import jax
import numpy as np
import pytest
from absl import flags

import elmo_jax
from elmo_jax import serving
from elmo_jax.features import packing
from elmo_jax.features.sentences import SentenceEmbedder
from elmo_jax.serving import DynamicBatcher, Limits, dynamic_batching, make_app, warmup_sentences
from tests.reference.elmo_equations import np_scalar_mix, np_sentence_mean
from tests.support.commands import command_argv, command_env
from tests.support.service_client import request, running
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms, lstm_terms, order_tolerance

LIMITS = Limits(max_sentences=6, max_tokens=60, max_sentence_tokens=24, max_body_bytes=4000)
WORDS = ["the", "bank", "of", "a", "river", "ran", "dry", "Überschwemmungsgebiet", ".", "x" * 48]


def service(embedder, *, token=None, **batcher_options):
    batcher = DynamicBatcher(embedder, **batcher_options)
    app = make_app(batcher, limits=LIMITS, n_layers=3, auth_token=token)
    return app, batcher


@pytest.fixture(scope="module")
def tiny_service(tiny_params):
    """The tiny biLM served with a 50 ms batching window (so concurrent requests share batches)."""
    embedder = SentenceEmbedder(tiny_params, layers="all", batch_tokens=256)
    app, batcher = service(embedder, max_batch_tokens=400, max_wait_s=0.05, warmup=[[["the", "bank"]]])
    with running(app) as port:
        assert batcher.ready.wait(120)  # requests during the warm-up are refused (503)
        yield port, batcher


def expected_output(layers: np.ndarray, spec) -> np.ndarray:
    """What a request's `layers` spec gives from one sentence's (L+1, n, D) layers, in float64."""
    if spec == "all":
        return layers
    if spec == "top":
        return layers[-1]
    if spec == "average":
        return np_scalar_mix(layers, np.zeros(3), 1.0)
    if spec == "sentence_mean":
        return np_sentence_mean(layers, np.zeros(3), 1.0)
    if isinstance(spec, dict):
        return np_scalar_mix(layers, spec["scalars"], spec["gamma"])
    return layers[spec]


def decode(headers, data: bytes, n: int) -> list[np.ndarray]:
    """The per-sentence arrays of an answer in any of the three encodings."""
    kind = headers["content-type"]
    if kind == "application/x-npz":
        arrays = np.load(io.BytesIO(data))
        return [arrays[str(i)] for i in range(n)]
    if kind == "application/x-npy":
        padded, lengths = np.load(io.BytesIO(data)), [int(x) for x in headers["x-sentence-lengths"].split(",")]
        if padded.ndim == 2:  # sentence_mean
            return list(padded)
        axis = padded.ndim - 3  # the token axis of one sentence: (L+1, T, D) or (T, D)
        return [p[(slice(None),) * axis + (slice(0, k),)] for p, k in zip(padded, lengths)]
    answer = json.loads(data)
    assert answer["shapes"] == [list(np.shape(e)) for e in answer["embeddings"]]
    dtype = np.float16 if answer["dtype"] == "float16" else np.float32
    return [np.asarray(e, dtype).reshape(shape) for e, shape in zip(answer["embeddings"], answer["shapes"])]


def test_concurrent_mixed_requests_equal_embed(tiny_service, tiny_params):
    """24 requests from 8 threads at once, of 1-4 sentences of 0-14 tokens (words up to 48 bytes), every
    output mode and encoding, float16 too: each answer is `embed` of its sentences, in order, whatever
    batch it shared; and requests did share batches."""
    port, batcher = tiny_service
    rng = np.random.default_rng(7)
    specs = ["all", "top", "average", "sentence_mean", 0, 2, {"scalars": [0.5, -1.0, 2.0], "gamma": 0.7}]
    kinds = ["application/json", "application/x-npy", "application/x-npz"]
    requests = []
    for i in range(24):
        sentences = [list(rng.choice(WORDS, rng.integers(0, 15))) for _ in range(rng.integers(1, 5))]
        sentences[0] = sentences[0] or ["the"]  # npy pads to the longest: at least one token somewhere
        requests.append((sentences, specs[i % len(specs)], kinds[i % 3], i % 5 == 4))
    everything = [s for r in requests for s in r[0]]
    layers, _ = elmo_jax.embed(tiny_params, elmo_jax.batch_to_ids(everything))
    layers = np.asarray(layers, np.float64)
    batches_before = batcher.stats.batches
    barrier = threading.Barrier(8)

    def send(chunk):
        barrier.wait()
        return [
            request(port, "POST", "/v1/embed", {"sentences": s, "layers": spec, "float16": f16}, {"Accept": kind})
            for s, spec, kind, f16 in chunk
        ]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [a for chunk in pool.map(send, [requests[k::8] for k in range(8)]) for a in chunk]
    order = [i for k in range(8) for i in range(k, 24, 8)]
    first = {i: sum(len(r[0]) for r in requests[:i]) for i in range(24)}
    for i, (status, headers, data) in zip(order, answers):
        assert status == 200, data[:300]
        sentences, spec, kind, f16 = requests[i]
        assert headers["content-type"] == kind
        got = decode(headers, data, len(sentences))
        for k, (sentence, vectors) in enumerate(zip(sentences, got)):
            reference = expected_output(layers[first[i] + k, :, : len(sentence)], spec)
            assert vectors.dtype == (np.float16 if f16 else np.float32) and vectors.shape == reference.shape
            if f16:
                np.testing.assert_allclose(vectors.astype(np.float32), reference, rtol=2**-10, atol=1e-4)
            else:
                terms = char_cnn_terms(tiny_params.config) + lstm_terms(tiny_params.config, len(sentence) + 2)
                assert_close_up_to_order(vectors, reference, terms, f"request {i} sentence {k}")
    batches = batcher.stats.batches - batches_before
    assert 1 <= batches < 24, f"{batches} batches for 24 concurrent requests: none were merged"


def test_every_output_mode_is_what_embed_sentences_gives_for_that_mode(tiny_service, tiny_params):
    """One request per output mode, every layer index 0..L among them, for the same sentences (an empty
    one too): each answer is `embed_sentences(..., layers=mode)` of them. The service reduces a
    sentence's layers on the host and `embed_sentences` in its batch program, so their float32 sums may
    differ in order: the chain of the char CNN, the LSTM and the mode's own sum over the layers and tokens,
    at the scale of the sentence's layers (the terms of every mode's sums)."""
    port, _ = tiny_service
    sentences = [["the", "bank", "of", "a", "river"], [], ["Überschwemmungsgebiet", "ran", "dry", "."], ["x" * 48]]
    mix = {"scalars": [0.5, -1.0, 2.0], "gamma": 0.7}
    n_layers = tiny_params.config.n_output_layers
    modes = [("all", {}), ("top", {}), ("average", {}), ("sentence_mean", {})]
    modes += [(mix, {"layers": "mix", "mix_scalars": mix["scalars"], "gamma": mix["gamma"]})]
    modes += [(j, {}) for j in range(n_layers)]
    layers = elmo_jax.embed_sentences(tiny_params, sentences, layers="all", batch_tokens=256)
    for spec, options in modes:
        body = {"sentences": sentences, "layers": spec}
        status, headers, data = request(port, "POST", "/v1/embed", body, {"Accept": "application/x-npz"})
        assert status == 200, data[:300]
        got = decode(headers, data, len(sentences))
        expected = elmo_jax.embed_sentences(tiny_params, sentences, batch_tokens=256, **(options or {"layers": spec}))
        for k, (vectors, reference) in enumerate(zip(got, expected)):
            assert vectors.dtype == reference.dtype == np.float32 and vectors.shape == reference.shape, (spec, k)
            n = len(sentences[k])
            config = tiny_params.config
            terms = char_cnn_terms(config) + lstm_terms(config, n + 2) + n_layers * max(n, 1)
            np.testing.assert_allclose(
                vectors, reference, rtol=0, atol=order_tolerance(layers[k], terms), err_msg=f"{spec} sentence {k}"
            )


def test_every_refusal_names_its_field(tiny_service):
    port, _ = tiny_service
    cases = [  # body (dict, or raw bytes), headers, status, field, words of the message
        (b"{not json", {}, 400, "", "not JSON"),
        (b"[1, 2]", {}, 400, "", "a JSON object, found a list"),
        ({"sentences": []}, {}, 400, "sentences", "empty"),
        ({"sentences": "The bank ."}, {}, 400, "sentences", "expected a list"),
        ({"sentences": ["The bank ."]}, {}, 400, "sentences[0]", 'use "texts"'),
        ({"sentences": [["the", 5]]}, {}, 400, "sentences[0][1]", "found a number"),
        ({"texts": [["the"]]}, {}, 400, "texts[0]", "expected a string"),
        ({"sentences": [["a"]], "texts": ["a"]}, {}, 400, "sentences", "either"),
        ({"sentences": [["a"]], "model": "original"}, {}, 400, "model", "unknown field"),
        ({"sentences": [["a"]], "layers": "bottom"}, {}, 400, "layers", "'bottom'"),
        ({"sentences": [["a"]], "layers": 3}, {}, 400, "layers", "layers 0 to 2"),
        ({"sentences": [["a"]], "layers": True}, {}, 400, "layers", "boolean"),
        ({"sentences": [["a"]], "layers": {"scalars": [1, 2]}}, {}, 400, "layers.scalars", "3 finite numbers"),
        ({"sentences": [["a"]], "float16": "yes"}, {}, 400, "float16", "true or false"),
        ({"sentences": [["a"]] * 7}, {}, 413, "sentences", "at most 6"),
        ({"sentences": [["a"] * 25]}, {}, 413, "sentences[0]", "at most 24 per sentence"),
        ({"sentences": [["a"] * 20] * 4}, {}, 413, "sentences", "80 tokens; at most 60"),
        ({"texts": ["a " * 2000]}, {}, 413, "", "at most 4000"),
        ({"sentences": [["a"]]}, {"Accept": "text/csv"}, 406, "Accept", "application/json"),
    ]
    for body, headers, status, field, words in cases:
        got, response_headers, data = request(tiny_service[0], "POST", "/v1/embed", body, headers)
        assert got == status, (body, data)
        error = json.loads(data)["error"]
        assert error["field"] == field and words in error["message"], (body, error)
    assert request(port, "GET", "/v1/embed")[0] == 405
    assert request(port, "POST", "/v1/other", {"sentences": [["a"]]})[0] == 404
    status, _, data = request(port, "POST", "/v1/embed", {"texts": ["", "the  bank"], "layers": "sentence_mean"})
    assert status == 200 and json.loads(data)["shapes"] == [[32], [32]]  # an empty text is an empty sentence


def _dispatched_shapes(embedder, monkeypatch, batches) -> list[tuple]:
    """The (rows, T2, S) of each batch `embedder` dispatches while it streams `batches` (zeros come back
    for results: nothing is compiled)."""
    shapes = []

    def dispatch(batch):
        shapes.append(batch.shape)
        rows, T2, _ = batch.shape
        return np.zeros((rows, 3, T2, 32), np.float32)

    monkeypatch.setattr(embedder.runner, "dispatch", dispatch)
    for sentences in batches:
        assert len(list(embedder.stream(sentences, window=len(sentences)))) == len(sentences)
    return shapes


def test_the_warm_up_embeds_once_each_shape_the_packer_names(tiny_params, monkeypatch):
    """`warmup_sentences` runs one batch of each shape `RowPacker.shapes` names, for each width bucket.
    By hand, for 256-step batches over the 8 test devices and sentences of up to 24 tokens: rows of 32
    steps, 8 of them (a full batch, and a partly filled one rounded to the devices), and one row alone
    shortened to 8 or 16 steps (rounded to 8 rows too), for S = 8, 16 and 24. The batches are recorded
    where the embedder dispatches them (with zeros for results): nothing is compiled."""
    embedder = SentenceEmbedder(tiny_params, layers="all", batch_tokens=256)
    shapes = _dispatched_shapes(embedder, monkeypatch, warmup_sentences(embedder, max_tokens=24))
    assert sorted(shapes) == sorted((8, T2, S) for T2 in (8, 16, 32) for S in (8, 16, 24))


def test_the_common_warm_up_is_the_shapes_of_batches_of_up_to_8_rows_of_up_to_64_steps(tiny_params, monkeypatch):
    """`--warmup_shapes=common` (a CPU's default, "auto"): on one device, 4,096-token batches, 16 tail
    steps, sentences of up to 512 tokens. By hand: rows of 32 steps (128 a full batch, a part rounded up
    to a power of two or a multiple of 8) and of 64 steps (64 a full batch, multiples of 4) in batches of
    1, 2, 4 or 8 rows, and the lone rows of 8 and 16 steps; for widths 8, 16 and 24: 30 programs, where
    "all" has 168. On an accelerator "auto" is "all"."""
    embedder = SentenceEmbedder(tiny_params, layers="all", batch_tokens=4096, devices=[0], tail_steps=16)
    shapes = _dispatched_shapes(embedder, monkeypatch, dynamic_batching.warmup_set(embedder, 512, "common"))
    rows = [(r, T2) for T2 in (32, 64) for r in (1, 2, 4, 8)] + [(1, 8), (1, 16)]
    assert sorted(shapes) == sorted((r, T2, S) for r, T2 in rows for S in (8, 16, 24))
    assert len(dynamic_batching.warmup_set(embedder, 512, "all")) == 168
    config = serving.ServiceConfig()
    assert serving.service.warmup_shapes(config, embedder) == "common"  # the test devices are CPUs
    monkeypatch.setattr(embedder.runner, "devices", [types.SimpleNamespace(platform="tpu")])
    assert serving.service.warmup_shapes(config, embedder) == "all"
    assert serving.service.warmup_shapes(dataclasses.replace(config, warmup_shapes="common"), embedder) == "common"
    with pytest.raises(ValueError, match="--warmup_shapes=some: expected auto, all or common"):
        dataclasses.replace(config, warmup_shapes="some").check({})


def test_every_stretch_of_the_warm_up_holds_cheap_and_costly_programs_alike(tiny_params):
    """The time left is estimated from the programs done so far, so every part of the warm-up must cost
    about the same: in each quarter of the 168 batches, the widths 8, 16 and 24 average 16 (equal numbers
    of each) and the token positions (rows x T2 of each batch's shape) average within 10% of the whole's.
    Before, the list went width by width: its first quarter all width 8, its ETA a third too short."""
    embedder = SentenceEmbedder(tiny_params, layers="all", batch_tokens=4096, devices=[0], tail_steps=16)
    packer = packing.RowPacker(4096, embedder.C, row_multiple=1, tail_steps=16)
    shapes = packer.shapes(512, longest_row=128)  # (rows, T2) -> the lengths of the sentences that make it
    positions = {tuple(lengths): rows * T2 for (rows, T2), lengths in shapes.items()}
    batches = warmup_sentences(embedder, max_tokens=512)
    widths = np.array([len(b[0][0]) + 2 for b in batches])  # a batch's words are S - 2 bytes
    sizes = np.array([positions[tuple(map(len, b))] for b in batches])
    assert len(batches) == 168 and sorted(set(widths)) == [8, 16, 24]
    for quarter in np.array_split(np.arange(168), 4):
        assert abs(widths[quarter].mean() - 16) <= 1, widths[quarter]
        assert abs(sizes[quarter].mean() / sizes.mean() - 1) <= 0.1, sizes[quarter]


class GatedEmbedder:
    """Stands in for a SentenceEmbedder: each `stream` call notes its first word in `seen`, sets
    `running`, waits for `gate`, then gives zeros."""

    def __init__(self):
        self.gate, self.running = threading.Event(), threading.Event()
        self.stats = {"padded_tokens": 0}
        self.seen = []

    def stream(self, sentences, window):
        self.seen.append(sentences[0][0])
        self.running.set()
        assert self.gate.wait(60)
        return iter([np.zeros((3, len(s), 4), np.float32) for s in sentences])


class FailingEmbedder:
    def stream(self, sentences, window):
        raise RuntimeError("out of device memory")


def test_workers_share_the_warm_up_and_the_batcher_is_ready_after_all_of_it():
    """Each of two workers runs every other warm-up batch (side by side); `ready` waits for both; a
    failed warm-up leaves the batcher not ready and its workers stopped."""
    first, second = GatedEmbedder(), GatedEmbedder()
    first.gate.set()
    batcher = DynamicBatcher([first, second], warmup=[[[str(i)]] for i in range(5)])
    batcher.start()
    assert second.running.wait(10)
    time.sleep(0.2)
    # The first ran its share; the second's is still running.
    assert first.seen == ["0", "2", "4"] and second.seen == ["1"] and not batcher.ready.is_set()
    second.gate.set()
    assert batcher.ready.wait(10)
    assert len(batcher.submit([["a", "b"]]).result(10)) == 1
    batcher.close(10)

    batcher = DynamicBatcher([GatedEmbedder(), FailingEmbedder()], warmup=[[["0"]], [["1"]]])
    batcher.embedders[0].gate.set()
    batcher.start()
    for thread in batcher._threads:
        thread.join(10)
        assert not thread.is_alive()
    assert not batcher.ready.is_set()


def test_the_batcher_counts_compiles_while_open_and_is_freed_when_closed():
    """A program compiled while the batcher is open counts in its stats, none after `close`; a closed
    batcher is not kept alive by the compile listener (it holds the embedders and their programs)."""
    embedder = GatedEmbedder()
    embedder.gate.set()
    batcher = DynamicBatcher([embedder])
    batcher.start()
    assert batcher.ready.wait(10)
    before = batcher.stats.compiles
    jax.jit(lambda x: x * 3.0 + 1.0)(np.ones(7, np.float32))  # a program no test compiles elsewhere
    assert batcher.stats.compiles == before + 1
    batcher.close(10)
    jax.jit(lambda x: x * 5.0 - 2.0)(np.ones(7, np.float32))
    assert batcher.stats.compiles == before + 1
    closed = weakref.ref(batcher)
    del batcher
    gc.collect()
    assert closed() is None


def test_readiness_queue_full_auth_and_metrics():
    """Not ready while the warm-up runs, ready after; a full queue answers 503 with Retry-After, and
    the requests it accepted are all answered; a token is required; /metrics counts it all."""
    embedder = GatedEmbedder()
    app, batcher = service(
        embedder, token="s3cret", max_batch_tokens=10, max_wait_s=0, max_queue_tokens=20, warmup=[[["w"]]]
    )
    auth = {"Authorization": "Bearer s3cret"}
    with running(app) as port:
        assert request(port, "GET", "/healthz")[0] == 200
        status, _, data = request(port, "GET", "/readyz")
        assert status == 503 and json.loads(data)["status"] == "warming up (compiling)"
        embedder.gate.set()
        assert batcher.ready.wait(10) and request(port, "GET", "/readyz")[0] == 200

        body = {"sentences": [["a"] * 10]}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, response_headers, data = request(port, "POST", "/v1/embed", body, headers)
            assert status == 401 and response_headers["www-authenticate"] == "Bearer", data
        assert request(port, "GET", "/metrics")[0] == 401

        embedder.gate.clear()  # the devices are busy with one batch, then the queue fills (20 tokens)
        embedder.running.clear()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            accepted = [pool.submit(request, port, "POST", "/v1/embed", body, auth)]
            assert embedder.running.wait(30)
            accepted += [pool.submit(request, port, "POST", "/v1/embed", body, auth) for _ in range(2)]
            while batcher.queued_tokens < 20:
                time.sleep(0.01)
            status, headers, data = request(port, "POST", "/v1/embed", body, auth)
            assert status == 503 and headers["retry-after"] == "1" and "busy" in json.loads(data)["error"]["message"]
            embedder.gate.set()
            assert [f.result()[0] for f in accepted] == [200, 200, 200]

        status, _, data = request(port, "GET", "/metrics", headers=auth)
        text = data.decode()
        assert status == 200
        for line in (
            'elmo_requests_total{code="200"} 3.0',
            'elmo_requests_total{code="401"} 3.0',
            'elmo_requests_total{code="503"} 1.0',
            "elmo_request_seconds_count 3.0",
            "elmo_batch_requests_count 3.0",
            "elmo_tokens 30.0",
            "elmo_queue_tokens 0.0",
            "elmo_ready 1.0",
        ):
            assert line in text, (line, text)
        assert "elmo_padded_tokens" in text and "elmo_compiles" in text


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_and_exits_0(fixture_dir):
    """A real process: SIGTERM while three accepted requests wait for their batch stops it taking new
    connections, answers every one of them, and exits 0."""
    argv = command_argv(
        "elmo_jax.serve",
        f"--options={fixture_dir / 'options.json'}",
        f"--weights={fixture_dir / 'weights.hdf5'}",
        "--port=0",
        "--warmup=false",
        "--max_wait_ms=3000",
    )
    process = subprocess.Popen(argv, env=command_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), line + process.stderr.read()
        port = int(line.split(":")[2].split(" ")[0])
        bodies = [{"sentences": [["the", "bank"] * n]} for n in (1, 3, 7)]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = [pool.submit(request, port, "POST", "/v1/embed", body) for body in bodies]
            while "elmo_queue_requests 3.0" not in request(port, "GET", "/metrics")[2].decode():
                time.sleep(0.05)  # all three accepted, waiting in the 3 s batching window
            process.send_signal(signal.SIGTERM)
            results = [a.result() for a in answers]
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert [status for status, _, _ in results] == [200, 200, 200], err[-2000:]
    for (_, _, data), body in zip(results, bodies):
        assert json.loads(data)["shapes"] == [[3, len(body["sentences"][0]), 32]]
    assert process.returncode == 0, err[-2000:]
    assert "stopped: every accepted request was answered" in out and "Traceback" not in err
    with pytest.raises(OSError):
        request(port, "GET", "/healthz")


def test_binding_beyond_loopback_needs_a_token(tmp_path, monkeypatch):
    """Checked before anything is loaded: a token from the file's first line or the environment."""
    assert serving.is_loopback("127.0.0.1") and serving.is_loopback("::1") and serving.is_loopback("localhost")
    assert not serving.is_loopback("0.0.0.0") and not serving.is_loopback("10.1.2.3")
    token_file = tmp_path / "token"
    token_file.write_text("abc123\n")
    assert serving.read_token(str(token_file), {}) == "abc123"
    assert serving.read_token(None, {serving.TOKEN_ENV: "from-env"}) == "from-env"
    assert serving.read_token(None, {}) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty: its first line is empty"):
        serving.read_token(str(tmp_path / "empty"), {})
    with pytest.raises(ValueError, match="missing: cannot read it"):
        serving.read_token(str(tmp_path / "missing"), {})


def test_the_settings_are_checked_before_anything_loads(tmp_path):
    """`ServiceConfig.check`, what the command runs first: each error names its flag; a token from the
    file or the environment is returned (and needed beyond loopback)."""
    for settings, message in [
        (dict(workers=0), "--workers=0: expected a positive integer"),
        (dict(tail_steps=-1), "--tail_steps=-1: expected a positive integer"),
        (dict(max_body_bytes=0), "--max_body_bytes=0: expected a positive integer"),
        (dict(max_wait_ms=-1.0), "--max_wait_ms=-1.0: expected >= 0"),
        (dict(port=65536), "--port=65536: expected 0 to 65535"),
        (dict(host="0.0.0.0"), "--host=0.0.0.0 is reachable from other machines"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            serving.ServiceConfig(**settings).check({})
    token_file = tmp_path / "token"
    token_file.write_text("abc123\n")
    assert serving.ServiceConfig(host="0.0.0.0", auth_token_file=str(token_file)).check({}) == "abc123"
    assert serving.ServiceConfig(host="10.1.2.3").check({serving.TOKEN_ENV: "from-env"}) == "from-env"
    assert serving.ServiceConfig().check({}) is None


def test_the_commands_flags_are_the_settings_with_their_defaults():
    """`python -m elmo_jax.serve` turns its flags into a `ServiceConfig` field by field: every field is a
    flag, with the field's default (written out in the command, where docs/API.md reads it)."""
    from elmo_jax import serve

    before = set(flags.FLAGS)
    try:
        serve.define_flags()
        defaults = {name: flags.FLAGS[name].default for name in set(flags.FLAGS) - before}
    finally:
        for name in set(flags.FLAGS) - before:
            delattr(flags.FLAGS, name)
    # --compilation_cache is every command's flag (cli.run_main sets the cache up), not a service setting
    defaults.pop("compilation_cache", None)
    assert defaults == {field.name: field.default for field in dataclasses.fields(serving.ServiceConfig)}
