"""The embedding service's HTTP face: an ASGI application (Starlette) over a `DynamicBatcher`, with
Prometheus metrics. `python -m elmo_jax.serve` runs it on uvicorn; docs/SERVING.md is the reference.

    POST /v1/embed   a JSON body (`embed_requests`) -> the vectors (JSON, .npy or .npz by Accept)
    GET  /healthz    200 while the process serves HTTP
    GET  /readyz     200 once the warm-up compiles are done, 503 before and while shutting down
    GET  /metrics    Prometheus text: requests by status, latency, batch sizes, padding, queue, compiles

Every refusal is a JSON `{"error": {"field": ..., "message": ...}}`: 400 malformed, 401 without the
token (when one is set), 406 an Accept it cannot answer, 413 over a limit, 503 the queue is full
(`Retry-After`) or the service is not ready. Work that takes CPU time (parsing a large body, the output's
arithmetic, encoding the answer) runs in a worker thread, not on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from elmo_jax.serving.dynamic_batching import DynamicBatcher, QueueFull
from elmo_jax.serving.embed_requests import Limits, RequestError, encode, parse_request

RETRY_AFTER_S = 1
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    """The service's Prometheus metrics, in their own registry (two services in one process, as in the
    tests, do not share counts)."""

    def __init__(self, batcher: DynamicBatcher):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "elmo_requests", "HTTP requests to /v1/embed by status code", ["code"], registry=registry
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
        stats = batcher.stats
        gauges = (
            ("elmo_tokens", "Tokens embedded", lambda: stats.tokens),
            ("elmo_padded_tokens", "Token positions run on the devices, padding included", lambda: stats.padded_tokens),
            ("elmo_compiles", "XLA programs compiled in this process (warm-up included)", lambda: stats.compiles),
            ("elmo_batch_failures", "Batches whose embedding failed", lambda: stats.failures),
            ("elmo_queue_tokens", "Tokens waiting for a batch", lambda: batcher.queued_tokens),
            ("elmo_queue_requests", "Requests waiting for a batch", lambda: batcher.queued_requests),
            ("elmo_ready", "1 once the warm-up is done", lambda: int(batcher.ready.is_set())),
        )
        for name, doc, read in gauges:
            Gauge(name, doc, registry=registry).set_function(read)

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
) -> Starlette:
    """The ASGI application (see the module doc). Its lifespan starts the batcher (warm-up first) and, at
    shutdown, closes it after the last accepted request has its answer.

    Args:
      batcher: not started; its `on_batch` is set here, to feed the metrics' histograms.
      limits: what one request may hold.
      n_layers: L+1, the biLM's output layers (a request's layer index is checked against it).
      auth_token: requests to /v1/embed and /metrics must carry `Authorization: Bearer <token>`; None: open.
      on_start: called once the server takes requests (its signal handlers are in place), or None.
    """
    metrics = Metrics(batcher)
    batcher.on_batch = metrics.on_batch
    service = _Service(batcher, limits, n_layers, metrics, auth_token, on_start)
    routes = [
        Route("/v1/embed", service.embed, methods=["POST"]),
        Route("/healthz", service.healthz, methods=["GET"]),
        Route("/readyz", service.readyz, methods=["GET"]),
        Route("/metrics", service.metrics_page, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=service.lifespan)


class _Service:
    """The request handlers of `make_app` and what they share."""

    def __init__(self, batcher, limits, n_layers, metrics, auth_token, on_start):
        self.batcher, self.limits, self.n_layers, self.metrics = batcher, limits, n_layers, metrics
        self.expected = None if auth_token is None else f"Bearer {auth_token}".encode()
        self.on_start = on_start
        self.draining = False

    def authorized(self, request: Request) -> bool:
        if self.expected is None:
            return True
        given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
        return hmac.compare_digest(given, self.expected)  # constant time: the token does not leak by timing

    async def embed(self, request: Request) -> Response:
        started = time.perf_counter()
        response = await self._embed(request)
        self.metrics.requests.labels(str(response.status_code)).inc()
        if response.status_code == 200:
            self.metrics.latency.observe(time.perf_counter() - started)
        return response

    async def _embed(self, request: Request) -> Response:
        if not self.authorized(request):
            return _unauthorized()
        try:
            body = await _read_body(request, self.limits.max_body_bytes)
            accept = request.headers.get("accept")
            parsed = await run_in_threadpool(parse_request, body, accept, self.limits, self.n_layers)
        except RequestError as e:
            return _error(e)
        try:
            future = self.batcher.submit(parsed.sentences)
        except QueueFull as e:
            return _error(RequestError(503, "", f"busy: {e}; retry"), {"Retry-After": str(RETRY_AFTER_S)})
        try:
            vectors = await asyncio.wrap_future(future)
        except Exception as e:  # a failed batch (e.g. device memory): the service's fault, said as such
            return _error(RequestError(500, "", f"the batch holding this request failed: {e}"))
        data, headers = await run_in_threadpool(lambda: encode(parsed.output.vectors(vectors), parsed))
        return Response(data, headers=headers)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        ready = self.batcher.ready.is_set() and not self.draining
        reason = "ready" if ready else "shutting down" if self.draining else "warming up (compiling)"
        return JSONResponse({"ready": ready, "status": reason}, status_code=200 if ready else 503)

    async def metrics_page(self, request: Request) -> Response:
        if not self.authorized(request):
            return _unauthorized()
        return Response(generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.batcher.start()
        if self.on_start is not None:
            self.on_start()
        try:
            yield
        finally:  # uvicorn has stopped accepting and waited for the open requests: answer what is queued
            self.draining = True
            await run_in_threadpool(self.batcher.close)


def _unauthorized() -> Response:
    return _error(RequestError(401, "Authorization", "a bearer token is required"), {"WWW-Authenticate": "Bearer"})


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `limit` bytes: by its Content-Length, or
    while it streams in, so an oversized body is never held whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "", f"the body has {declared} bytes; at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, "", f"the body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _error(error: RequestError, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(error.body(), status_code=error.status, headers=headers)
