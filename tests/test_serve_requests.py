"""The service's requests and batches under what a careless or hostile client sends (issue #50): bodies
nested deeper than JSON parsing can recurse, numbers larger than float64 or than Python parses, mixes and
float16 answers that would hold non-finite values, a batcher that meets an error of its own, a batching
window that cannot be waited for, and SIGTERM during the warm-up. Each answer is a JSON refusal naming
its field (or a 500/503 saying why), never a plain-text 500, a hang or a non-JSON literal.

In-process where the behaviour allows (`parse_request`, the batcher, the app on uvicorn in a thread with
a stand-in embedder: nothing compiled); one real process for SIGTERM, which only a process's main thread
receives.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import re
import signal
import subprocess
import threading
import time

import pytest

from elmo_jax.runtime.progress import Progress
from elmo_jax.serving import DynamicBatcher, Limits, dynamic_batching, make_app
from elmo_jax.serving.embed_requests import RequestError, parse_request
from tests.support.commands import command_argv, command_env
from tests.support.service_client import ConstantEmbedder, request, running

LIMITS = Limits(max_sentences=6, max_tokens=60, max_sentence_tokens=24, max_body_bytes=1 << 20)


def refusal(body: bytes) -> RequestError:
    """The RequestError `parse_request` raises for `body` (a model of 3 layers)."""
    with pytest.raises(RequestError) as caught:
        parse_request(body, None, LIMITS, 3)
    return caught.value


def strict_json(data: bytes):
    """`json.loads` that refuses what RFC 8259 does not allow: NaN, Infinity and -Infinity."""

    def refuse(name):
        raise AssertionError(f"{name} in the answer: not JSON")

    return json.loads(data, parse_constant=refuse)


def test_nesting_is_bounded_before_json_parsing_recurses():
    """100,000 nested arrays (json.loads recursed into a RecursionError before: a plain-text 500) and an
    object nested 17 deep are refused with 400 naming the bound; so are 100,000 arrays whose strings'
    closing brackets hide them from the first, cheap count (the parser's bound refuses them: Python
    3.13's json parses 5,000 levels, where 3.12's stopped); brackets inside strings (escaped quotes among
    them) are not nesting."""
    hidden = b'["]",' * 100_000 + b"1" + b"]" * 100_000
    for body, words in [
        (b"[" * 100_000 + b"]" * 100_000, "nested 100000 deep; at most 16"),
        (b'{"a":' * 17 + b"1" + b"}" * 17, "nested 17 deep; at most 16"),
        (hidden, "nested too deep to parse; at most 16"),
    ]:
        error = refusal(body)
        assert (error.status, error.field) == (400, "") and words in error.message, error
    text = " ".join(["[" * 40] * 20 + ['\\"', "{" * 40])  # 840 brackets, an escaped quote among them
    parsed = parse_request(json.dumps({"texts": [text]}).encode(), None, LIMITS, 3)
    assert parsed.sentences == [text.split()]


def test_numbers_beyond_float64_are_refused_naming_their_field():
    """A 400-digit integer as a mix scalar or gamma (a TypeError in the finite check before: a plain-text
    500), a 5000-digit one (more than Python parses, sys.get_int_max_str_digits(): refused before as "not
    JSON", naming no field), 1e400 and NaN: 422 naming the field. Where a number is not what the field
    takes, a huge one is refused like any other number (400)."""
    huge, larger = "9" * 400, "7" * 5000
    mix = '{"sentences": [["a"]], "layers": {"scalars": [0, %s, 0], "gamma": %s}}'
    cases = [  # body, status, field, words of the message
        (mix % (huge, "1"), 422, "layers.scalars[1]", "a 400-digit integer"),
        (mix % ("0", huge), 422, "layers.gamma", "a 400-digit integer"),
        (mix % ("0", "-" + larger), 422, "layers.gamma", "a 5000-digit integer"),
        (mix % ("0", "1e400"), 422, "layers.gamma", "inf"),
        (mix % ("NaN", "1"), 422, "layers.scalars[1]", "nan"),
        ('{"sentences": [["a"]], "layers": ' + huge + "}", 400, "layers", "a 400-digit integer"),
        ('{"sentences": [["a"]], "float16": ' + larger + "}", 400, "float16", "found a number"),
        ('{"sentences": [["a", ' + larger + "]]}", 400, "sentences[0][1]", "found a number"),
    ]
    for body, status, field, words in cases:
        error = refusal(body.encode())
        assert (error.status, error.field) == (status, field) and words in error.message, (body[:80], error)
    # Within float64's range a number is taken, however it is written.
    big = parse_request((mix % ("1" + "0" * 300, "1.5e300")).encode(), None, LIMITS, 3).output
    assert big.scalars[1] == 1e300 and big.gamma == 1.5e300


def test_answers_are_finite_json_or_a_refusal_naming_the_field():
    """Through the app: a mix whose gamma overflows float32 (1e308) and a float16 answer past 65504 were
    answered 200 with `Infinity` literals before (not JSON); now 422 naming layers.gamma and float16. A
    model whose layers are NaN: a 500 saying so, as JSON. Every answer is RFC 8259 JSON, counted in
    /metrics."""

    def app_of(value):
        batcher = DynamicBatcher(ConstantEmbedder(value), max_wait_s=0)
        return make_app(batcher, limits=LIMITS, n_layers=3)

    with running(app_of(70000.0)) as port:
        cases = [  # request, status, field, words of the message
            ({"layers": {"scalars": [0, 0, 0], "gamma": 1e30}}, 200, None, None),
            ({"layers": {"scalars": [0, 0, 0], "gamma": 1e308}}, 422, "layers.gamma", "gamma 1e+308"),
            ({"layers": "top", "float16": True}, 422, "float16", "65504"),
            ({"layers": "sentence_mean", "float16": True}, 422, "float16", "65504"),
            ({"layers": "top"}, 200, None, None),
        ]
        for extra, status, field, words in cases:
            got, headers, data = request(port, "POST", "/v1/embed", {"sentences": [["a", "b"]], **extra})
            answer = strict_json(data)
            assert got == status and headers["content-type"] == "application/json", (extra, data[:200])
            if field is not None:
                assert answer["error"]["field"] == field and words in answer["error"]["message"], (extra, answer)
        metrics = request(port, "GET", "/metrics")[2].decode()
        assert 'elmo_requests_total{code="422"} 3.0' in metrics and 'elmo_requests_total{code="200"} 2.0' in metrics
    with running(app_of(float("nan"))) as port:
        got, _, data = request(port, "POST", "/v1/embed", {"sentences": [["a"]], "layers": "top"})
        assert got == 500 and "not finite" in strict_json(data)["error"]["message"], data


def test_a_batch_that_fails_in_the_batcher_is_answered_and_the_worker_goes_on(caplog):
    """Errors outside the embedding itself: the metrics' callback raising (it killed the worker before:
    its requests were never answered) and an embedder that gives back fewer arrays than sentences (before:
    the requests got too few vectors, silently). The batch's requests get the error, it is logged once
    with its traceback, and the next request is answered."""
    calls = []

    def on_batch(requests, sentences, tokens):
        calls.append(sentences)
        if len(calls) == 1:
            raise RuntimeError("a metrics bug")

    batcher = DynamicBatcher(ConstantEmbedder(), max_wait_s=0, on_batch=on_batch)
    batcher.start()
    with pytest.raises(RuntimeError, match="a metrics bug"):
        batcher.submit([["a"]]).result(10)
    assert [v.shape for v in batcher.submit([["a", "b"]]).result(10)] == [(3, 2, 4)]
    batcher.close(10)
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None, [r.getMessage() for r in caplog.records]

    short = ConstantEmbedder(count=lambda n: n - 1 if n > 1 else n)
    batcher = DynamicBatcher(short, max_wait_s=0)
    batcher.start()
    with pytest.raises(RuntimeError, match="1 arrays for 2 sentences"):
        batcher.submit([["a"], ["b"]]).result(10)
    assert len(batcher.submit([["a"]]).result(10)) == 1 and batcher.stats.failures == 1
    batcher.close(10)


def test_a_worker_that_cannot_go_on_turns_the_service_not_ready_and_says_why():
    """A fault in the batcher's own loop (a batching window past what `Condition.wait` takes, set after
    the constructor's check: before, worker 0 died of OverflowError, the request was never answered and
    /readyz said ready): the waiting request is answered 503, later ones too, /readyz and elmo_ready say
    the service is not ready and why."""
    batcher = DynamicBatcher(ConstantEmbedder(), max_wait_s=0)
    app = make_app(batcher, limits=LIMITS, n_layers=3)
    with running(app) as port:
        assert batcher.ready.wait(10)
        batcher.max_wait_s = float("inf")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(request, port, "POST", "/v1/embed", {"sentences": [["a"]]})
            status, headers, data = waiting.result(30)
        assert status == 503 and "worker 0 stopped: OverflowError" in strict_json(data)["error"]["message"], data
        status, _, data = request(port, "POST", "/v1/embed", {"sentences": [["a"]]})
        assert status == 503 and "worker 0 stopped" in strict_json(data)["error"]["message"]
        status, _, data = request(port, "GET", "/readyz")
        assert status == 503 and "not serving: worker 0 stopped: OverflowError" in strict_json(data)["status"]
        assert "elmo_ready 0.0" in request(port, "GET", "/metrics")[2].decode()


@pytest.mark.parametrize("max_wait_s", [float("inf"), 1e300, float("nan"), -0.5, "5"])
def test_the_batching_window_must_be_a_finite_wait(max_wait_s):
    """inf and 1e300 were accepted and killed the first worker that waited (OverflowError)."""
    with pytest.raises(ValueError, match="max_wait_s"):
        DynamicBatcher(ConstantEmbedder(), max_wait_s=max_wait_s)


class ClockEmbedder(ConstantEmbedder):
    """A stand-in whose every batch takes `seconds` of a fake clock (`now`, a one-item list), as a compile
    would; with `gate_at`, the batch of that number (from 1) waits for `gate` first."""

    def __init__(self, now: list, seconds: float, gate_at: int):
        super().__init__()
        self.now, self.seconds, self.gate_at, self.gate_open = now, seconds, gate_at, threading.Event()
        self.at_gate = threading.Event()

    def stream(self, sentences, window):
        if self.batches + 1 == self.gate_at:
            self.at_gate.set()
            assert self.gate_open.wait(60)
        self.now[0] += self.seconds
        return super().stream(sentences, window)


def test_the_warm_up_says_how_far_it_is_and_refuses_requests_at_once(monkeypatch, caplog):
    """Issue #51: the warm-up was silent (minutes on a CPU) and a request sent meanwhile waited for all
    of it. Now, 10 warm-up batches of 3 s each (a fake clock): a line at the start naming --nowarmup,
    then one once both 10% and 15 s have passed, and the last; while 4 are done, /readyz says 4/10 and
    18 s left (6 batches at 3 s), a request is answered 503 at once with `Retry-After: 18` and the same,
    /metrics has the gauges; once ready, /readyz says 10/10 and requests are embedded."""
    now = [0.0]
    monkeypatch.setattr(dynamic_batching, "Progress", functools.partial(Progress, clock=lambda: now[0]))
    caplog.set_level(logging.INFO)
    embedder = ClockEmbedder(now, seconds=3.0, gate_at=5)
    batcher = DynamicBatcher(embedder, max_wait_s=0, warmup=[[["w"]]] * 10)
    with running(make_app(batcher, limits=LIMITS, n_layers=3)) as port:
        assert embedder.at_gate.wait(30)  # 4 batches done, at 12 s
        status, _, data = request(port, "GET", "/readyz")
        warming = {"ready": False, "status": "warming up (compiling)"}
        assert (status, strict_json(data)) == (503, {**warming, "warmup": {"done": 4, "total": 10, "seconds_left": 18}})
        status, headers, data = request(port, "POST", "/v1/embed", {"sentences": [["a"]]})
        message = strict_json(data)["error"]["message"]
        assert (status, headers["retry-after"]) == (503, "18"), data
        assert "warming up (compiling): 4/10 programs done, about 18 s left" in message and "--nowarmup" in message
        metrics = request(port, "GET", "/metrics")[2].decode()
        assert "elmo_warmup_done 4.0" in metrics and "elmo_warmup_total 10.0" in metrics, metrics
        embedder.gate_open.set()
        assert batcher.ready.wait(30)
        status, _, data = request(port, "GET", "/readyz")
        assert strict_json(data) == {
            "ready": True,
            "status": "ready",
            "warmup": {"done": 10, "total": 10, "seconds_left": 0},
        }
        assert request(port, "POST", "/v1/embed", {"sentences": [["a"]]})[0] == 200
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up")]
    assert lines[0].startswith("warm-up: 10 programs to compile") and "--nowarmup skips it" in lines[0], lines
    # 15 s at the 5th batch (the first line due: a tenth and 15 s); the next 15 s is the end.
    assert lines[1:] == ["warm-up: 5/10 programs, ~15 s left", "warm-up done: 10 programs in 30 s (0 compiled); ready"]
    assert batcher.stats.warmup_refused == 1


def test_a_stop_during_the_warm_up_ends_it_between_batches():
    """`close` (SIGTERM starts its first half, `stop`) while the first of 6 warm-up batches runs: the
    warm-up ends after the batch that runs (before, it ran every remaining batch), and the batcher says
    what happened: a request sent during the warm-up was refused at once (503, Retry-After 10 s: no
    batch done yet, nothing to estimate from; before, it waited for the warm-up), none was accepted."""
    gate = threading.Event()
    embedder = ConstantEmbedder(gate=gate)
    batcher = DynamicBatcher(embedder, max_wait_s=0, warmup=[[["w"]]] * 6)
    app = make_app(batcher, limits=LIMITS, n_layers=3)
    with running(app) as port, concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert embedder.running.wait(10)
        status, headers, data = request(port, "POST", "/v1/embed", {"sentences": [["a"]]})
        closing = pool.submit(batcher.close, 30)
        while batcher.status != "shutting down":
            time.sleep(0.01)
        gate.set()  # the warm-up batch that runs ends
        closing.result(30)
    message = strict_json(data)["error"]["message"]
    assert status == 503 and "0/6 programs done, the time left is not known yet" in message, data
    assert headers["retry-after"] == "10"
    assert embedder.batches == 1, f"{embedder.batches} warm-up batches ran after the stop"
    assert batcher.outcome() == (
        "stopped during the warm-up (1 of 6 warm-up batches run): no request was accepted (1 refused while it ran: 503)"
    )


def test_sigterm_during_the_warm_up_stops_within_the_shutdown_timeout(fixture_dir):
    """A real process warming up 177 programs (rows of up to 128 steps in 8,192-token batches): SIGTERM
    once it serves (the warm-up runs from then on: /readyz says so, with its progress; a request is
    refused at once, 503 naming --nowarmup). Before: the process ran every remaining warm-up compile
    (and the request waited for them). Now: the warm-up stops after the compile that runs, the process
    exits 0 within the shutdown timeout and its log and last line say what happened."""
    shutdown_timeout_s = 20
    argv = command_argv(
        "elmo_jax.serve",
        f"--options={fixture_dir / 'options.json'}",
        f"--weights={fixture_dir / 'weights.hdf5'}",
        "--port=0",
        "--workers=1",
        "--batch_tokens=8192",
        "--max_batch_tokens=8192",
        "--warmup_shapes=all",
        f"--shutdown_timeout_s={shutdown_timeout_s}",
    )
    process = subprocess.Popen(argv, env=command_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # printed once the batcher has started its warm-up
        assert line.startswith("serving on http://127.0.0.1:"), line + process.stderr.read()
        port = int(line.split(":")[2].split(" ")[0])
        status, _, data = request(port, "GET", "/readyz")
        answer = strict_json(data)
        assert status == 503 and answer["status"] == "warming up (compiling)", data
        assert answer["warmup"]["total"] == 177 and answer["warmup"]["done"] < 177, data
        status, headers, data = request(port, "POST", "/v1/embed", {"sentences": [["the", "bank"]]})
        assert status == 503 and "--nowarmup" in strict_json(data)["error"]["message"], (status, data)
        assert int(headers["retry-after"]) >= 1
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        process.wait(timeout=shutdown_timeout_s)
        exited = time.monotonic() - signalled
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err[-2000:]
    assert exited < shutdown_timeout_s, f"exited {exited:.0f} s after SIGTERM"
    outcome = r"stopped during the warm-up \(\d+ of 177 warm-up batches run\): no request was accepted \(1 refused"
    assert re.search(outcome, err) and "warm-up: 177 programs to compile" in err, err[-2000:]
    assert re.search(outcome, out.splitlines()[-1]), out[-2000:]  # the last line says so too
    assert "every accepted request was answered" not in out + err, (out[-2000:], err[-2000:])
    assert "Traceback" not in err
