"""The embedding service's HTTP face under a careless or hostile client (issue #50 item 3): every failure
answered as JSON and counted, slow clients bounded, settings and tokens checked before anything loads,
only JSON bodies for the loopback names, Accept honoured, a gone client's work dropped, JSON answers
bounded.

In-process: uvicorn in a thread on a free loopback port, with the command's own server settings
(`serving.http_server`) where the connections matter; stand-in embedders that give zeros (no JAX
program is compiled), so each test costs little more than its sockets. The stand-ins' vectors are
(L+1 = 3, n, 2P = 32), the tiny fixture biLM's shapes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import logging as std_logging
import math
import os
import re
import resource
import socket
import threading
import time

import numpy as np
import pytest

from elmo_jax import serving
from elmo_jax.serving import DynamicBatcher, Limits, ServiceConfig, make_app
from tests.support.commands import REPO, error_line
from tests.support.inprocess import run_in_process
from tests.support.service_client import request, running

LIMITS = Limits(max_sentences=6, max_tokens=60, max_sentence_tokens=24, max_body_bytes=1 << 20)
DIM = 32


class ZeroEmbedder:
    """Stands in for a SentenceEmbedder: zeros of the tiny biLM's shapes for each sentence; every
    sentence it was given is in `seen`. Each `stream` call waits for `gate` (set: no wait) and sets
    `running` first."""

    def __init__(self, gate_open: bool = True):
        self.stats = {"padded_tokens": 0}
        self.seen: list[list[str]] = []
        self.gate, self.running = threading.Event(), threading.Event()
        if gate_open:
            self.gate.set()

    def stream(self, sentences, window):
        self.seen += [list(s) for s in sentences]
        self.running.set()
        assert self.gate.wait(60)
        return iter([np.zeros((3, len(s), DIM), np.float32) for s in sentences])


def app_of(embedder, **options):
    """A service over one stand-in embedder, without a warm-up, batches run at once."""
    batcher = DynamicBatcher([embedder], max_wait_s=0)
    return make_app(batcher, limits=LIMITS, n_layers=3, **options), batcher


def guarded_app_of(embedder, config: ServiceConfig, **options):
    """`app_of` for the server the command runs: (app, its `ConnectionGuard` made from `config`)."""
    connections = serving.ConnectionGuard(config.max_connections, config.header_timeout_s, config.body_timeout_s)
    app, _ = app_of(embedder, connections=connections, **options)
    return app, connections


def error_of(data: bytes) -> dict:
    """The `error` object of a JSON refusal (fails on anything else, starlette's plain text included)."""
    return json.loads(data)["error"]


def metrics(port) -> str:
    return request(port, "GET", "/metrics")[2].decode()


def raw(port, data: bytes = b"", timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if data:
        sock.sendall(data)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it does not). A
    server that closes with bytes of ours unread resets the connection: what came before still counts."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def parse_response(data: bytes) -> tuple[int, dict, bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_every_failure_is_json_counted_and_an_unexpected_error_logged_once(monkeypatch):
    """An exception no handler expects (here: the encoder breaks) is a 500 with a JSON body, its
    traceback logged once, counted; routing's own refusals (404, 405) are JSON too and counted.
    Failed before: starlette's plain-text "Internal Server Error" (json.loads raised), "Not Found" and
    "Method Not Allowed" as plain text, and nothing counted but /v1/embed's codes."""
    from elmo_jax.serving import http_service

    def broken(*args):
        raise RuntimeError("the encoder broke")

    monkeypatch.setattr(http_service, "encode", broken)
    # Handlers on the two loggers themselves, kept through every request below. The traceback is logged
    # after the answer is sent (starlette sends the 500, then raises on to `_Answered`, which logs it), so
    # the client may read the answer before the record exists: wait for it, and count at the end.
    records = {"absl": [], "uvicorn.error": []}
    handlers = {}
    for name, kept in records.items():
        handlers[name] = std_logging.Handler(std_logging.ERROR)
        handlers[name].emit = kept.append
        std_logging.getLogger(name).addHandler(handlers[name])

    def tracebacks():
        return [r for r in records["absl"] if r.exc_info and "the encoder broke" in str(r.exc_info[1])]

    app, _ = app_of(ZeroEmbedder())
    try:
        with running(app) as port:
            status, headers, data = request(port, "POST", "/v1/embed", {"sentences": [["a"]]})
            assert status == 500 and headers["content-type"] == "application/json", data
            assert "unexpected" in error_of(data)["message"]
            deadline = time.monotonic() + 30
            while not tracebacks():
                assert time.monotonic() < deadline, "no traceback logged within 30 s"
                time.sleep(0.01)
            for method, path, code in (("GET", "/nowhere", 404), ("GET", "/v1/embed", 405), ("POST", "/healthz", 405)):
                status, headers, data = request(port, method, path)
                assert status == code and headers["content-type"] == "application/json", data
                assert error_of(data)["message"]
            text = metrics(port)
    finally:
        for name, handler in handlers.items():
            std_logging.getLogger(name).removeHandler(handler)
    assert len(tracebacks()) == 1 and not records["uvicorn.error"], records
    for line in (
        'elmo_requests_total{code="500"} 1.0',
        'elmo_requests_total{code="405"} 1.0',
        'elmo_http_responses_total{code="404",route="other"} 1.0',
        'elmo_http_responses_total{code="405",route="/healthz"} 1.0',
        'elmo_http_responses_total{code="500",route="/v1/embed"} 1.0',
    ):
        assert line in text, (line, text)


def test_malformed_and_oversized_heads_are_answered_as_json():
    """A head over 16 KiB is a JSON 431 whether it trickles in (the parser refuses it once its buffer is
    over) or arrives whole (20 KB at once: the app refuses it); a malformed request line is a JSON 400;
    each counted. Failed before: `serving.http_server` did not exist; uvicorn answered "Invalid HTTP
    request received." as plain text, nothing was counted, and a 20 KB head was served (200)."""
    config = ServiceConfig()
    app, connections = guarded_app_of(ZeroEmbedder(), config)
    with running(app, config, connections) as port:
        start = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Big: " % port
        pieces = raw(port, start)
        with contextlib.suppress(OSError):
            for _ in range(20):  # 20 KB in pieces: the head is never complete
                pieces.sendall(b"x" * 1000)
                time.sleep(0.01)
        whole = raw(port, start + b"x" * 20000 + b"\r\n\r\n")
        for sock in (pieces, whole):
            status, headers, body = parse_response(read_until_closed(sock))
            assert status == 431 and headers["content-type"] == "application/json" and len(body) < 500
            assert "16384" in error_of(body)["message"]
        status, headers, body = parse_response(read_until_closed(raw(port, b"NONSENSE\r\n\r\n")))
        assert status == 400 and headers["content-type"] == "application/json", body
        text = metrics(port)
    for line in (
        'elmo_connections_refused_total{reason="head_too_large"} 1.0',
        'elmo_connections_refused_total{reason="bad_request"} 1.0',
        'elmo_http_responses_total{code="431",route="/healthz"} 1.0',
    ):
        assert line in text, (line, text)


def test_a_head_that_trickles_in_is_answered_408_after_the_header_timeout():
    """A client that sends a header line every 50 ms never finishes its head: it gets a JSON 408 once
    `--header_timeout_s` (0.3 s here) has passed since it connected, and the connection is closed.
    Failed before: uvicorn has no header timeout; the connection stayed open (the read timed out)."""
    config = ServiceConfig(header_timeout_s=0.3)
    app, connections = guarded_app_of(ZeroEmbedder(), config)
    with running(app, config, connections) as port:
        started = time.monotonic()  # before the server can have seen the connection
        sock = raw(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(0.05)
        data = b""
        with contextlib.suppress(OSError):
            for i in range(400):  # 20 s at most
                sock.sendall(f"X-Line-{i}: a\r\n".encode())
                with contextlib.suppress(socket.timeout):
                    if not (chunk := sock.recv(65536)):
                        break
                    data += chunk
        waited = time.monotonic() - started
        sock.close()
        status, _, body = parse_response(data)
        assert status == 408 and "0.3" in error_of(body)["message"] and waited >= 0.3, (data, waited)
        assert 'elmo_connections_refused_total{reason="header_timeout"} 1.0' in metrics(port)


def test_a_body_that_does_not_arrive_is_answered_408_and_a_leftover_body_is_cut_off():
    """/v1/embed reads its body for at most `--body_timeout_s` (0.3 s): a body stalled half-way gets a
    JSON 408 (counted with the requests). A body no handler reads (a GET with a Content-Length that never
    comes) is cut off by the server once as long has passed after the answer. Failed before: both
    connections stayed open (the reads timed out)."""
    config = ServiceConfig(body_timeout_s=0.3)
    app, connections = guarded_app_of(ZeroEmbedder(), config, body_timeout_s=0.3)
    with running(app, config, connections) as port:
        head = b"POST /v1/embed HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n" % port
        head += b"Content-Length: 100\r\n\r\n"
        status, headers, body = parse_response(read_until_closed(raw(port, head + b'{"sentences"')))
        assert status == 408 and "0.3" in error_of(body)["message"], body
        sock = raw(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 50\r\n\r\n" % port)
        status, _, body = parse_response(read_until_closed(sock))
        assert status == 200 and json.loads(body) == {"status": "ok"}
        text = metrics(port)
    assert 'elmo_requests_total{code="408"} 1.0' in text, text
    assert 'elmo_connections_refused_total{reason="body_timeout"} 1.0' in text, text


def test_many_trickling_connections_cannot_stop_healthz():
    """200 connections trickle a header line every 0.25 s (each closed one reconnects at once) against a
    cap of 50 connections: /healthz, asked on a new connection each round, answers within a second every
    time (a generous bound, as issue #50 asks), the server never holds more than the cap, and the
    connections it dropped to stay under it got a JSON 503. Failed before: `serving.http_server` did not
    exist; on uvicorn's defaults all 200 connections stayed open for as long as they trickled (no cap,
    no header timeout: the file descriptors of a process run out this way)."""
    config = ServiceConfig(max_connections=50, header_timeout_s=30.0)
    app, connections = guarded_app_of(ZeroEmbedder(), config)
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    with running(app, config, connections) as port:
        clients = [raw(port, head, timeout=5) for _ in range(200)]
        refusals, slowest, most_open = [], 0.0, 0
        try:
            for round in range(8):
                for i, sock in enumerate(clients):
                    try:
                        sock.sendall(f"X-Trickle-{round}: a\r\n".encode())
                    except OSError:
                        sock.close()
                        clients[i] = raw(port, head, timeout=5)
                started = time.monotonic()
                status, _, data = request(port, "GET", "/healthz", timeout=10)
                slowest = max(slowest, time.monotonic() - started)
                assert status == 200, data
                most_open = max(most_open, connections.open_connections)
                time.sleep(0.25)
            for sock in clients:
                sock.settimeout(0)
                with contextlib.suppress(OSError):
                    if data := sock.recv(65536):
                        refusals.append(parse_response(data))
        finally:
            for sock in clients:
                sock.close()
        text = metrics(port)
    assert slowest < 1.0, f"/healthz took {slowest:.2f} s"
    assert most_open <= 50, most_open
    assert refusals, "no connection was pushed out"
    for status, _, body in refusals:
        assert status == 503 and "connections" in error_of(body)["message"], body
    count = float(re.search(r'elmo_connections_refused_total\{reason="over_capacity"\} (\S+)', text).group(1))
    assert count >= 150, text


def test_the_connection_cap_fits_the_processs_file_limit():
    """`--max_connections` and the files the service needs besides fit RLIMIT_NOFILE's hard limit
    (`serve` raises the soft one to what it needs), else refused before anything loads. Failed before:
    there was no cap (ServiceConfig took no max_connections)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        with pytest.raises(ValueError, match=rf"--max_connections={hard}: .* {hard} files .*RLIMIT_NOFILE"):
            ServiceConfig(max_connections=hard).check({})
    assert ServiceConfig(max_connections=10).check({}) is None


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(max_wait_ms=math.inf), "--max_wait_ms=inf: expected >= 0 and <= 60000"),
        (dict(max_wait_ms=1e300), "--max_wait_ms=1e+300: expected >= 0 and <= 60000"),
        (dict(max_wait_ms=math.nan), "--max_wait_ms=nan: expected >= 0"),
        (dict(shutdown_timeout_s=-1.0), "--shutdown_timeout_s=-1.0: expected >= 0 and <= 86400"),
        (dict(shutdown_timeout_s=math.nan), "--shutdown_timeout_s=nan"),
        (dict(header_timeout_s=0.0), "--header_timeout_s=0.0: expected > 0 and <= 3600"),
        (dict(body_timeout_s=math.inf), "--body_timeout_s=inf: expected > 0"),
        (dict(keep_alive_s=-5.0), "--keep_alive_s=-5.0: expected > 0"),
        (dict(max_connections=0), "--max_connections=0: expected a positive integer"),
        (dict(max_json_answer_bytes=0), "--max_json_answer_bytes=0: expected a positive integer"),
        (dict(max_body_bytes=0), "--max_body_bytes=0: expected a positive integer"),
        (dict(workers=1.5), "--workers=1.5: expected a positive integer"),
    ],
)
def test_each_setting_is_checked_naming_its_flag(settings, message):
    """Finite, in range, of its type, each naming its flag, before anything loads. Failed before (the
    old fields): inf, 1e300, -1 and 1.5 were accepted (DID NOT RAISE), NaN passed `< 0`; the new
    fields did not exist (TypeError)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        ServiceConfig(**settings).check({})


def test_the_command_refuses_a_bad_flag_before_the_model_loads():
    """`--max_wait_ms=inf` with a model that is not there: the error names the flag, not the model.
    Failed before: the flag was accepted and the error named the model directory."""
    result = run_in_process("elmo_jax.serve", "--model=/nonexistent/elmo-model", "--max_wait_ms=inf", "--port=0")
    error_line(result, "--max_wait_ms=inf")


def test_the_host_header_is_checked_on_loopback():
    """A service on loopback answers only requests whose Host is a loopback name with its port (DNS
    rebinding: a web page whose name now points to 127.0.0.1 sends its own name): 421 JSON otherwise;
    beyond loopback any Host (the token guards it). Failed before: make_app took no `allowed_hosts`
    (TypeError); the app answered every Host, evil.example's too (200)."""
    sock = serving.listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    assert serving.host_names("0.0.0.0", port) is None and "localhost" in serving.host_names("127.0.0.1", 80)
    app, _ = app_of(ZeroEmbedder(), allowed_hosts=serving.host_names("127.0.0.1", port))
    with running(app, sock=sock):
        for host, code in (
            (f"127.0.0.1:{port}", 200),
            (f"localhost:{port}", 200),
            (f"LOCALHOST:{port}", 200),
            (f"[::1]:{port}", 200),
            (f"evil.example:{port}", 421),
            ("evil.example", 421),
            (f"127.0.0.1:{port + 1}", 421),
            ("127.0.0.1", 421),
            (f"127.0.0.1.evil.example:{port}", 421),
        ):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.putrequest("GET", "/healthz", skip_host=True)
            connection.putheader("Host", host)
            connection.endheaders()
            response = connection.getresponse()
            data = response.read()
            connection.close()
            assert response.status == code, (host, data)
            if code == 421:
                assert "Host" == error_of(data)["field"] and "loopback" in error_of(data)["message"]
        assert 'elmo_http_responses_total{code="421",route="/healthz"} 5.0' in metrics(port)


def test_only_json_bodies_are_read():
    """A body is read as JSON only when it says so: anything else (a form, text, none: what a web page
    may send to another site without asking first) is 415, naming what is accepted. Failed before:
    every body was parsed as JSON (200)."""
    body = json.dumps({"sentences": [["a"]]}).encode()
    app, _ = app_of(ZeroEmbedder())
    with running(app) as port:
        for kind, code in (
            ("application/json", 200),
            ("application/json; charset=utf-8", 200),
            ("Application/JSON", 200),
            ("text/plain", 415),
            ("application/x-www-form-urlencoded", 415),
            ("multipart/form-data; boundary=x", 415),
            ("application/jsonp", 415),
            (None, 415),
        ):
            status, _, data = request(port, "POST", "/v1/embed", body, {"Content-Type": kind})
            assert status == code, (kind, data)
            if code == 415:
                error = error_of(data)
                assert error["field"] == "Content-Type" and "application/json" in error["message"], error
        assert 'elmo_requests_total{code="415"} 5.0' in metrics(port)


def test_accept_q_values_choose_the_answer_and_refusals_are_bounded():
    """The answer's encoding is the acceptable type the client prefers most (q-values, then the more
    specific range): `q=0` means not that one. Refusal bodies quote at most a few hundred characters of
    what the client sent. Failed before: q-values were ignored (json;q=0 got JSON), the 406 body
    repeated a 15 KB header whole, an unknown field's 5,000-character name and a 100,000-character layers
    value were quoted whole."""
    app, _ = app_of(ZeroEmbedder())
    body = {"sentences": [["a", "b"]]}
    with running(app) as port:
        for accept, expected in (
            ("application/json;q=0, application/x-npy", "application/x-npy"),
            ("application/x-npy;q=0.5, application/json", "application/json"),
            ("application/json;q=0.2, application/x-npz;q=0.8", "application/x-npz"),
            ("*/*;q=0.1, application/x-npz", "application/x-npz"),
            ("application/x-npy, */*", "application/x-npy"),
            ("application/*", "application/json"),
            ("text/html, */*;q=0.8", "application/json"),
            ("application/json;q=0", None),
            ("application/*;q=0", None),
            ("*/*;q=0, application/x-npy;q=0", None),
            ("text/csv", None),
        ):
            status, headers, data = request(port, "POST", "/v1/embed", body, {"Accept": accept})
            if expected is None:
                assert status == 406 and error_of(data)["field"] == "Accept", (accept, data)
            else:
                assert status == 200 and headers["content-type"] == expected, (accept, status, data[:200])
        status, _, data = request(port, "POST", "/v1/embed", body, {"Accept": "text/csv, " * 1500})
        assert status == 406 and len(data) < 1000, len(data)
        for oversized in ({"sentences": [["a"]], "x" * 5000: 1}, {"sentences": [["a"]], "layers": "y" * 100000}):
            status, _, data = request(port, "POST", "/v1/embed", oversized)
            assert status == 400 and len(data) < 1000, (status, len(data))


class _Client:
    """One request on a raw socket, so that the test can leave before the answer."""

    def __init__(self, port, sentences):
        body = json.dumps({"sentences": sentences}).encode()
        head = f"POST /v1/embed HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        self.sock = raw(port, head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body, timeout=30)


def test_the_work_of_a_client_that_has_gone_is_dropped():
    """Request A holds the only worker; B waits in the queue and its client goes away: B is never
    embedded nor encoded, not counted as answered (200) but as gone. C, sent after, is answered as
    usual. Failed before: B was embedded, encoded and counted as a 200 (the stand-in saw "second")."""
    from elmo_jax.serving import http_service

    embedder = ZeroEmbedder(gate_open=False)
    app, batcher = app_of(embedder)
    encoded = []
    original_encode = http_service.encode
    with running(app) as port, concurrent.futures.ThreadPoolExecutor(2) as pool:
        http_service.encode = lambda vectors, parsed: (
            encoded.append(parsed.sentences) or original_encode(vectors, parsed)
        )
        try:
            first = pool.submit(request, port, "POST", "/v1/embed", {"sentences": [["first"]]})
            assert embedder.running.wait(30)
            second = _Client(port, [["second"]])
            for _ in range(3000):
                if batcher.queued_requests == 1:
                    break
                time.sleep(0.01)
            waiting = batcher._waiting[0].future
            second.sock.close()
            # The gate opens once the service has seen the client go: counted, and its request cancelled
            # (asyncio cancels the batcher's future one loop turn after the count). At most 60 s: a loaded
            # machine is slow, and the first request's client waits up to 120 s.
            deadline = time.monotonic() + 60
            while not (waiting.cancelled() and "elmo_client_gone_total 1.0" in metrics(port)):
                assert time.monotonic() < deadline, "the service did not see the client go within 60 s"
                time.sleep(0.01)
            embedder.gate.set()
            assert first.result()[0] == 200
            assert request(port, "POST", "/v1/embed", {"sentences": [["third"]]})[0] == 200
            text = metrics(port)
        finally:
            http_service.encode = original_encode
    assert embedder.seen == [["first"], ["third"]], embedder.seen
    assert encoded == [[["first"]], [["third"]]], encoded
    assert 'elmo_requests_total{code="200"} 2.0' in text and "elmo_client_gone_total 1.0" in text, text


def test_json_answers_are_bounded_and_the_refusal_names_npy(monkeypatch):
    """A JSON answer over `--max_json_answer_bytes` (20,000 here) is refused with 413 naming .npy, from
    its size estimated before anything is computed (24 bytes per number: 3 layers x 10 tokens x 32 for
    "all" is 23,040): the batch never runs. The same as .npy, or a smaller JSON answer, is served.
    Without the model's width (`dim`) the estimate waits for the batch but still comes before the
    encoding. Failed before: answered 200 (make_app took no such limit)."""
    from elmo_jax.serving import http_service

    encoded = []
    original_encode = http_service.encode
    monkeypatch.setattr(
        http_service, "encode", lambda vectors, parsed: encoded.append(1) or original_encode(vectors, parsed)
    )
    sentences = [["w"] * 10]
    for dim in (DIM, None):
        embedder = ZeroEmbedder()
        app, _ = app_of(embedder, dim=dim, max_json_answer_bytes=20000)
        with running(app) as port:
            status, _, data = request(port, "POST", "/v1/embed", {"sentences": sentences, "layers": "all"})
            assert status == 413, data
            error = error_of(data)
            assert error["field"] == "Accept" and "application/x-npy" in error["message"], error
            assert "23040" in error["message"], error
            assert encoded == [] and embedder.seen == ([] if dim else sentences)
            for layers, accept in (("all", "application/x-npy"), ("average", "application/json")):
                body = {"sentences": sentences, "layers": layers}
                assert request(port, "POST", "/v1/embed", body, {"Accept": accept})[0] == 200
        encoded.clear()


def test_tokens_are_stripped_ascii_and_their_file_private(tmp_path, caplog):
    """The environment's token is stripped like the file's, and refused when empty or blank; a token
    that is not ASCII is refused naming where it came from (a client's header could not carry it); a
    token file others may read gets one warning line. Failed before: a blank $ELMO_JAX_SERVE_TOKEN was
    returned as the token (DID NOT RAISE), non-ASCII tokens were accepted, no warning."""
    env = serving.TOKEN_ENV
    assert serving.read_token(None, {env: "  from-env \n"}) == "from-env"
    for blank in ("", "   ", "\n"):
        with pytest.raises(ValueError, match=re.escape(f"${env} is set but blank")):
            serving.read_token(None, {env: blank})
    with pytest.raises(ValueError, match=re.escape(f"${env}: the token must be printable ASCII")):
        serving.read_token(None, {env: "tökén"})
    token_file = tmp_path / "token"
    token_file.write_text("tökén\n", encoding="utf-8")
    token_file.chmod(0o600)
    not_ascii = f"--auth_token_file={token_file}: the token must be printable ASCII"
    with pytest.raises(ValueError, match=re.escape(not_ascii)):
        serving.read_token(str(token_file), {})
    token_file.write_text("abc123\n")
    with caplog.at_level(std_logging.WARNING):
        assert serving.read_token(str(token_file), {}) == "abc123"
        assert not [r for r in caplog.records if str(token_file) in r.getMessage()]
        token_file.chmod(0o644)
        assert serving.read_token(str(token_file), {}) == "abc123"
    warnings = [r.getMessage() for r in caplog.records if str(token_file) in r.getMessage()]
    assert len(warnings) == 1 and "chmod 600" in warnings[0] and "\n" not in warnings[0], warnings
    with pytest.raises(ValueError, match=re.escape(f"${env} is set but blank")):
        ServiceConfig(host="0.0.0.0").check({env: "  "})
    assert os.stat(token_file).st_mode & 0o077  # the warning was not about a file we had made private


def test_the_documented_client_sends_again_after_the_keep_alive_closed_its_connection():
    """Issue #51: docs/SERVING.md's Python example kept one connection for many requests, and after 6 s
    idle (the keep-alive is 5 s) the next request failed with BrokenPipeError. The example's own code,
    read from the page, against the command's server with a 0.2 s keep-alive: a request, an idle gap
    until the service has closed the connection, another request, both answered (on the old page there
    is no `embed` to call again). A plain request on an idle
    connection fails, so the gap did close it."""
    text = (REPO / "docs" / "SERVING.md").read_text(encoding="utf-8")
    example = text.split("## Examples", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    config = ServiceConfig(keep_alive_s=0.2)
    app, connections = guarded_app_of(ZeroEmbedder(), config)
    with running(app, config, connections) as port:
        names = {}
        exec(example.replace("8080", str(port)), names)  # the page's own code
        assert [names["vectors"].shape, names["lengths"]] == [(2, 3, 3, DIM), [3, 2]]
        plain = http.client.HTTPConnection("127.0.0.1", port)
        plain.request("GET", "/healthz")
        assert plain.getresponse().read() and names["connection"].sock is not None
        deadline = time.monotonic() + 60
        while connections.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)  # idle past the keep-alive: the service closes both (on its clock, not ours)
        vectors, lengths = names["embed"]([["a", "b"]], layers="top")
        assert vectors.shape == (1, 2, DIM) and lengths == [2]
        with pytest.raises((BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected)):
            plain.request("GET", "/healthz")
            plain.getresponse()
