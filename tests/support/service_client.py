"""The embedding service under test: an ASGI app on uvicorn in a thread of the test process, a real HTTP
client (http.client) on loopback, and stand-ins for the `SentenceEmbedder` the batcher runs, which answer
at once (no model, nothing compiled)."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time

import numpy as np
import uvicorn

from elmo_jax import serving


def request(port: int, method: str, path: str, body=None, headers=None, timeout: float = 120):
    """(status, headers with lower-case names, body bytes) of one request on a new connection; `body` is
    bytes as they are, or a value sent as JSON. A body goes with `Content-Type: application/json` unless
    `headers` name one; a header whose value is None is not sent (a body with no Content-Type at all)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        headers = dict(headers or {})
        if data is not None and not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/json"
        connection.request(method, path, body=data, headers={k: v for k, v in headers.items() if v is not None})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@contextlib.contextmanager
def running(app, config=None, connections=None, sock=None):
    """`app` on a free loopback port in a thread (or on `sock`); yields the port. With a `ServiceConfig`
    and the app's `connections`, on the server the command runs (`serving.http_server`: its protocol,
    timeouts and connection cap); without, on uvicorn's defaults."""
    sock = sock or serving.listening_socket("127.0.0.1", 0)
    if config is None:
        server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    else:
        server = serving.http_server(app, config, connections)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(60)


class ConstantEmbedder:
    """Stands in for a SentenceEmbedder of 3 layers of width 4: every token's vectors are `value` (a
    float32 (3, n, 4) array per sentence of n tokens). `count` changes how many arrays a batch gets
    back (a faulty embedder); `gate`, when set, is waited for before each batch."""

    def __init__(self, value: float = 1.0, count=None, gate: threading.Event | None = None):
        self.value, self.count, self.gate = value, count, gate
        self.stats = {"padded_tokens": 0}
        self.batches = 0
        self.running = threading.Event()

    def stream(self, sentences, window):
        self.batches += 1
        self.running.set()
        if self.gate is not None:
            assert self.gate.wait(60)
        vectors = [np.full((3, len(s), 4), self.value, np.float32) for s in sentences]
        return iter(vectors if self.count is None else vectors[: self.count(len(sentences))])
