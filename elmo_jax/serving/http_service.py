"""The embedding service's HTTP face: an ASGI application (Starlette) over a `DynamicBatcher`, with
Prometheus metrics. `python -m elmo_jax.serve` runs it on uvicorn; docs/SERVING.md is the reference.

    POST /v1/embed   a JSON body (`embed_requests`) -> the vectors (JSON, .npy or .npz by Accept)
    GET  /healthz    200 while the process serves HTTP
    GET  /readyz     200 once the warm-up compiles are done, 503 before (with its progress) and while shutting down
    GET  /metrics    Prometheus text: requests by status, latency, batch sizes, padding, queue, compiles

Every failure is a JSON `{"error": {"field": ..., "message": ...}}`, quoting at most a few hundred
characters of what the client sent: 400 malformed, 401 without the token (when one is set), 404/405 no
such route or method, 406 an Accept it cannot answer, 408 a body that did not arrive in time, 413 over a
limit (a JSON answer over its own limit names .npy), 415 a body not sent as JSON, 421 a Host that is not
the loopback name of a service on loopback, 503 the queue is full or the warm-up runs (`Retry-After`:
1 s, or the warm-up's time left) or the service does not serve, and 500 when a batch fails or anything
unexpected happens (logged once with its traceback). Each answer is counted in /metrics by route and
status; a request whose client went away before its answer is cancelled (a batcher that has not taken
it never embeds it), never encoded, and counted apart.
Work that takes CPU time (parsing a large body, the output's arithmetic, encoding the answer) runs in a
worker thread, not on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time

from absl import logging
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from elmo_jax.runtime.signals import StopSignals
from elmo_jax.serving.dynamic_batching import DynamicBatcher, QueueFull, WarmingUp
from elmo_jax.serving.embed_requests import JSON, NPY, EmbedRequest, Limits, RequestError, encode, parse_request
from elmo_jax.serving.http_headers import answer_type, check_content_type, head_too_large, misdirected, quoted

RETRY_AFTER_S = 1
ROUTES = ("/v1/embed", "/healthz", "/readyz", "/metrics")
CLIENT_GONE = 499  # nginx's status for a request whose client closed it: a handler's mark, never sent
MESSAGE_CHARS = 500  # of a refusal's message (its field: QUOTED_CHARS)
JSON_NUMBER_BYTES = 24  # the most a float32 takes in JSON: "-1.2345678901234567e-05,"
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    """The service's Prometheus metrics, in their own registry (two services in one process, as in the
    tests, do not share counts)."""

    def __init__(self, batcher: DynamicBatcher, connections=None):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "elmo_requests", "HTTP requests to /v1/embed by status code", ["code"], registry=registry
        )
        self.responses = Counter(
            "elmo_http_responses",
            "HTTP answers by route (/v1/embed, /healthz, /readyz, /metrics, other) and status code",
            ["code", "route"],
            registry=registry,
        )
        self.client_gone = Counter(
            "elmo_client_gone",
            "Requests to /v1/embed whose client went away first (not embedded if still queued; not encoded)",
            registry=registry,
        )
        self.latency = Histogram(
            "elmo_request_seconds",
            "Time from a /v1/embed request's arrival to its answer",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_requests = Histogram(
            "elmo_batch_requests", "Requests merged into one batch", buckets=SIZE_BUCKETS, registry=registry
        )
        self.batch_sentences = Histogram(
            "elmo_batch_sentences", "Sentences in one batch", buckets=SIZE_BUCKETS, registry=registry
        )
        self.batch_tokens = Histogram(
            "elmo_batch_tokens", "Tokens in one batch", buckets=SIZE_BUCKETS, registry=registry
        )
        self.truncated_tokens = Counter(
            "elmo_truncated_tokens",
            "Tokens of answered requests cut to the model's C-2 UTF-8 bytes (docs/ELMO.md, Long tokens)",
            registry=registry,
        )
        stats = batcher.stats
        gauges = (
            ("elmo_tokens", "Tokens embedded", lambda: stats.tokens),
            ("elmo_padded_tokens", "Token positions run on the devices, padding included", lambda: stats.padded_tokens),
            (
                "elmo_compiles",
                "XLA programs compiled in this process (warm-up included), or read from the compilation cache",
                lambda: stats.compiles,
            ),
            (
                "elmo_compile_cache_hits",
                "Of elmo_compiles, those read from the compilation cache",
                lambda: stats.cache_hits,
            ),
            ("elmo_warmup_done", "Warm-up programs done (of elmo_warmup_total)", lambda: stats.warmup_batches),
            ("elmo_warmup_total", "Warm-up programs in all (0: no warm-up)", lambda: batcher.warmup_total),
            ("elmo_batch_failures", "Batches whose embedding failed", lambda: stats.failures),
            ("elmo_queue_tokens", "Tokens waiting for a batch", lambda: batcher.queued_tokens),
            ("elmo_queue_requests", "Requests waiting for a batch", lambda: batcher.queued_requests),
            ("elmo_ready", "1 once the warm-up is done", lambda: int(batcher.ready.is_set())),
        )
        for name, doc, read in gauges:
            Gauge(name, doc, registry=registry).set_function(read)
        if connections is not None:
            self._count_connections(connections)

    def _count_connections(self, connections) -> None:
        """The server's `ConnectionGuard`: its refusals counted here as they happen, and its open connections."""
        refused = Counter(
            "elmo_connections_refused",
            "Connections the server refused or cut off, by reason (timeouts, over the cap, unparsable heads)",
            ["reason"],
            registry=self.registry,
        )
        for reason in connections.refusals:
            refused.labels(reason)  # every reason shown from the start, at 0
        connections.on_refusal = lambda reason: refused.labels(reason).inc()
        Gauge("elmo_connections", "Open connections", registry=self.registry).set_function(
            lambda: connections.open_connections
        )

    def answered(self, path: str, status: int) -> None:
        """Counts one answer (a request to /v1/embed whose client went away: as that)."""
        route = path if path in ROUTES else "other"  # unknown paths are one label: a client cannot add series
        if route == "/v1/embed":
            if status == CLIENT_GONE:
                self.client_gone.inc()
                return
            self.requests.labels(str(status)).inc()
        self.responses.labels(str(status), route).inc()

    def on_batch(self, requests: int, sentences: int, tokens: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_sentences.observe(sentences)
        self.batch_tokens.observe(tokens)


def make_app(
    batcher: DynamicBatcher,
    *,
    limits: Limits,
    n_layers: int,
    auth_token: str | None = None,
    on_start=None,
    dim: int | None = None,
    max_json_answer_bytes: int = 32 << 20,
    body_timeout_s: float = 60.0,
    connections=None,
    allowed_hosts=None,
):
    """The ASGI application (see the module doc). Its lifespan starts the batcher (warm-up first) and, at
    shutdown, closes it after the last accepted request has its answer.

    Args:
      batcher: not started; its `on_batch` is set here, to feed the metrics' histograms.
      limits: what one request may hold.
      n_layers: L+1, the biLM's output layers (a request's layer index is checked against it).
      auth_token: requests to /v1/embed and /metrics must carry `Authorization: Bearer <token>`; None: open.
      on_start: called once the server takes requests (its signal handlers are in place), or None.
      dim: 2P, the biLM's output width: a JSON answer's size is then known before its batch runs (None:
        checked once the batch has run, still before the answer is encoded).
      max_json_answer_bytes: a JSON answer's bytes at most (estimated at `JSON_NUMBER_BYTES` a number);
        413 beyond, naming .npy.
      body_timeout_s: a request body must have arrived this long after the handler starts reading it (408).
      connections: the server's `ConnectionGuard` (`connections.py`), whose refusals /metrics counts, or None.
      allowed_hosts: the Host header values answered (lower case; `service.host_names` of the address the
        server listens on), 421 for any other; None: any.
    """
    metrics = Metrics(batcher, connections)
    batcher.on_batch = metrics.on_batch
    service = _Service(batcher, limits, n_layers, metrics, auth_token, on_start)
    service.bound_answers(dim, max_json_answer_bytes, body_timeout_s)
    routes = [
        Route("/v1/embed", service.embed, methods=["POST"]),
        Route("/healthz", service.healthz, methods=["GET"]),
        Route("/readyz", service.readyz, methods=["GET"]),
        Route("/metrics", service.metrics_page, methods=["GET"]),
    ]
    handlers = {HTTPException: _http_error, Exception: _unexpected_error}
    app = Starlette(routes=routes, lifespan=service.lifespan, exception_handlers=handlers)
    return _Answered(app, metrics, allowed_hosts)


class _Answered:
    """The app's outer layer (ASGI): heads over `MAX_HEAD_BYTES` are refused (whatever the server let
    through), and a request whose Host is not allowed is refused (`misdirected`: a service on loopback
    answers only its loopback names);
    every HTTP request gets an answer, a JSON 500 for anything unexpected (its traceback logged here,
    once: Starlette's answer for it is JSON too, and the exception goes no further, so uvicorn neither
    logs it again nor answers in plain text); every answer is counted (`Metrics.answered`)."""

    def __init__(self, app: Starlette, metrics: Metrics, allowed_hosts=None):
        self.app, self.metrics, self.allowed_hosts = app, metrics, allowed_hosts

    @property
    def outcome(self) -> str:
        """What became of the accepted requests: the service's last line, once its lifespan has ended."""
        return self.app.state.outcome

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":  # the lifespan
            await self.app(scope, receive, send)
            return
        status = None

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        host = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"host"), None)
        refusal = head_too_large(scope) or misdirected(host, self.allowed_hosts)
        try:
            await (_error(refusal) if refusal else self.app)(scope, receive, sending)
        except Exception:
            logging.exception("an unexpected error answering %s %s", scope["method"], quoted(scope["path"]))
        if status is None:  # the exception came before an answer, or the app gave none
            await _error(RequestError(500, "", _UNEXPECTED))(scope, receive, sending)
        self.metrics.answered(scope["path"], status)


_UNEXPECTED = "an unexpected error in the service (its log has the traceback)"


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    """Starlette's answer to an exception no handler caught (`_Answered` logs it)."""
    return _error(RequestError(500, "", _UNEXPECTED))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (404 no such route, 405 another method) as JSON."""
    message = f"{exc.detail}: {request.method} {request.url.path}; the routes are {', '.join(ROUTES)}"
    return _error(RequestError(exc.status_code, "", message), exc.headers)


class _Service:
    """The request handlers of `make_app` and what they share."""

    def __init__(self, batcher, limits, n_layers, metrics, auth_token, on_start):
        self.batcher, self.limits, self.n_layers, self.metrics = batcher, limits, n_layers, metrics
        self.expected = None if auth_token is None else f"Bearer {auth_token}".encode()
        self.on_start = on_start
        self.draining = False
        self.bound_answers(None, 32 << 20, 60.0)

    def bound_answers(self, dim: int | None, max_json_answer_bytes: int, body_timeout_s: float) -> None:
        """The bounds `make_app` names: the biLM's width (for a JSON answer's size), that size, the body's time."""
        self.dim, self.max_json_answer_bytes, self.body_timeout_s = dim, max_json_answer_bytes, body_timeout_s

    def authorized(self, request: Request) -> bool:
        if self.expected is None:
            return True
        given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
        return hmac.compare_digest(given, self.expected)  # constant time: the token does not leak by timing

    async def embed(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await self._embed(request)
        except RequestError as e:
            response = _error(e)
        if response.status_code == 200:
            self.metrics.latency.observe(time.perf_counter() - started)
        return response

    async def _embed(self, request: Request) -> Response:
        """The answer to one request; a refusal raised as RequestError."""
        if not self.authorized(request):
            return _unauthorized()
        check_content_type(request.headers.get("content-type"))
        media_type = answer_type(request.headers.get("accept"))
        try:
            body = await _read_body(request, self.limits.max_body_bytes, self.body_timeout_s)
        except ClientDisconnect:
            return Response(status_code=CLIENT_GONE)
        parsed = await run_in_threadpool(parse_request, body, media_type, self.limits, self.n_layers)
        if self.dim is not None:
            self._check_json_size(parsed, self.dim)
        try:
            future = self.batcher.submit(parsed.sentences)
        except WarmingUp as e:  # at once, not after the warm-up's minutes
            return _error(RequestError(503, "", str(e)), {"Retry-After": str(e.retry_after_s)})
        except QueueFull as e:
            return _error(RequestError(503, "", f"busy: {e}; retry"), {"Retry-After": str(RETRY_AFTER_S)})
        try:
            vectors = await _unless_gone(request, future)
        except QueueFull as e:  # refused after it was accepted: the batcher stopped (or broke) before it ran
            return _error(RequestError(503, "", str(e)), {"Retry-After": str(RETRY_AFTER_S)})
        except Exception as e:  # a failed batch (e.g. device memory): the service's fault, said as such
            return _error(RequestError(500, "", f"the batch holding this request failed: {e}"))
        if vectors is None or await request.is_disconnected():
            return Response(status_code=CLIENT_GONE)  # nobody to encode it for
        if self.dim is None and vectors:
            self._check_json_size(parsed, vectors[0].shape[-1])
        data, headers = await run_in_threadpool(lambda: encode(parsed.output.vectors(vectors), parsed))
        self.metrics.truncated_tokens.inc(parsed.truncated_tokens)  # X-Truncated-Tokens tells the client
        return Response(data, headers=headers)

    def _check_json_size(self, parsed: EmbedRequest, dim: int) -> None:
        """413 for a JSON answer over `max_json_answer_bytes`, from its numbers (before they exist)."""
        if parsed.media_type != JSON:
            return
        size = JSON_NUMBER_BYTES * _answer_numbers(parsed, self.n_layers, dim)
        if size > self.max_json_answer_bytes:
            raise RequestError(
                413,
                "Accept",
                f"the answer would take up to {size} bytes as JSON, over this service's {self.max_json_answer_bytes} "
                f"(--max_json_answer_bytes): ask for it as .npy (Accept: {NPY}), 4 bytes a number",
            )

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        reason = "shutting down" if self.draining else self.batcher.status  # "not serving: why" when broken
        ready = reason == "ready"
        answer = {"ready": ready, "status": reason}
        if (warmup := self.batcher.warmup_progress()) is not None:
            answer["warmup"] = warmup  # {"done": 80, "total": 168, "seconds_left": 120}
        return JSONResponse(answer, status_code=200 if ready else 503)

    async def metrics_page(self, request: Request) -> Response:
        if not self.authorized(request):
            return _unauthorized()
        return Response(generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        """Starts the batcher; stops it as soon as SIGTERM or SIGINT comes (`_stop_on_signal`), closes it
        once uvicorn has answered the open requests, and leaves what became of the accepted requests in
        `app.state.outcome` (the service's last line; logged as a warning when some were refused)."""
        self.batcher.start()
        with StopSignals() as signals:
            watcher = asyncio.ensure_future(self._stop_on_signal(signals))
            if self.on_start is not None:
                self.on_start()
            try:
                yield
            finally:  # uvicorn has stopped accepting and waited for the open requests: answer what is queued
                watcher.cancel()
                self.draining = True
                await run_in_threadpool(self.batcher.close)
        app.state.outcome = self.batcher.outcome()
        if app.state.outcome != "stopped: every accepted request was answered":
            logging.warning("%s", app.state.outcome)

    async def _stop_on_signal(self, signals: StopSignals) -> None:
        """The first SIGTERM or SIGINT (recorded by `signals` in the main thread, where the server runs):
        the batcher stops at once (during the warm-up: the warm-up ends at its next batch; after it: what
        was accepted is still embedded), /readyz says "shutting down", then the signal goes on to
        uvicorn's handler, which stops taking connections and waits for the open requests
        (`--shutdown_timeout_s`). Without this the stop would reach the batcher only after uvicorn's
        shutdown, the whole warm-up still to run."""
        while not signals.stopped:
            await asyncio.sleep(0.05)
        self.draining = True
        self.batcher.stop()
        signals.check()


def _answer_numbers(parsed: EmbedRequest, n_layers: int, dim: int) -> int:
    """How many numbers the answer to `parsed` holds (its output mode's shapes, docs/SERVING.md)."""
    layers = parsed.output.layers
    if layers == "sentence_mean":
        return len(parsed.sentences) * dim
    return parsed.tokens * dim * (n_layers if layers == "all" else 1)


async def _unless_gone(request: Request, future) -> list | None:
    """The batch's vectors for this request, or None when its client goes away first; the request is
    then cancelled, and a batcher that has not taken it yet never embeds it (`Future.cancel`)."""
    answer = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if answer.done():
        return answer.result()
    answer.cancel()  # cancels `future` too
    return None


async def _disconnect(request: Request) -> None:
    """Returns once the client has gone (the body is read: the server's next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _unauthorized() -> Response:
    return _error(RequestError(401, "Authorization", "a bearer token is required"), {"WWW-Authenticate": "Bearer"})


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `limit` bytes: by its Content-Length, or
    while it streams in, so an oversized body is never held whole; 408 when it has not all arrived
    `timeout_s` after this started."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "", f"the body has {declared} bytes; at most {limit}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestError(413, "", f"the body exceeds {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(408, "", f"the body did not arrive within {timeout_s:g} s (--body_timeout_s)") from None
    return b"".join(chunks)


def _error(error: RequestError, headers: dict[str, str] | None = None) -> Response:
    """A refusal as JSON, quoting at most `QUOTED_CHARS` of its field and `MESSAGE_CHARS` of its message
    (both may repeat what the client sent). The connection of a 408 or 431 is closed (the rest of a late
    body may still come; a client sending oversized heads is not kept)."""
    bounded = RequestError(error.status, quoted(error.field), quoted(error.message, MESSAGE_CHARS))
    if error.status in (408, 431):
        headers = {**(headers or {}), "Connection": "close"}
    return JSONResponse(bounded.body(), status_code=error.status, headers=headers)
