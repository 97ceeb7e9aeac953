"""The service as one value and one call: its settings (`ServiceConfig`, what `python -m elmo_jax.serve`'s
flags give, with their checks before anything is loaded: every error names its flag), the application
composed for a loaded biLM (`build_app`: the embedders, the batcher, the request limits and the ASGI
app) and the whole run (`serve`: the checks, the socket bound before the model loads, uvicorn until
SIGTERM or Ctrl-C, every accepted request answered).

    config = ServiceConfig(model="small", port=0, workers=1)
    serve(config)                                    # what the command does with its flags

Importing this module costs the standard library alone: the command defines its flags from the
config's defaults before JAX is imported (`build_app` and `serve` import the rest when called).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import signal
import socket

from absl import logging

TOKEN_ENV = "ELMO_JAX_SERVE_TOKEN"
POSITIVE = (
    "batch_tokens",
    "max_batch_tokens",
    "max_queue_tokens",
    "max_sentences",
    "max_tokens",
    "workers",
    "tail_steps",
)


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """The service's settings. Each field is the command's flag of that name, with its default (the
    flags' help and docs/SERVING.md say what each does); `model`, `options` and `weights` name the biLM
    as every command's --model, --options and --weights do."""

    model: str | None = None
    options: str | None = None
    weights: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    auth_token_file: str | None = None
    batch_tokens: int = 4096
    max_batch_tokens: int = 4096
    max_wait_ms: float = 5.0
    max_queue_tokens: int = 262144
    max_sentences: int = 256
    max_tokens: int = 16384
    max_sentence_tokens: int = 512
    max_body_bytes: int = 8 << 20
    workers: int = 2
    tail_steps: int = 16
    warmup: bool = True
    shutdown_timeout_s: float = 60.0
    compute_dtype: str = "float32"

    def check(self, environ=os.environ) -> str | None:
        """Checks the settings before anything is loaded (errors name the flags); returns the bearer token
        (None: none set)."""
        for name in POSITIVE:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}={getattr(self, name)}: expected a positive integer")
        if self.max_sentence_tokens < 1 or self.max_body_bytes < 1:
            raise ValueError("--max_sentence_tokens and --max_body_bytes must be positive")
        if self.max_wait_ms < 0:
            raise ValueError(f"--max_wait_ms={self.max_wait_ms}: expected >= 0")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port={self.port}: expected 0 to 65535")
        token = read_token(self.auth_token_file, environ)
        if token is None and not is_loopback(self.host):
            raise ValueError(
                f"--host={self.host} is reachable from other machines: set a token with --auth_token_file or "
                f"${TOKEN_ENV} (requests then carry 'Authorization: Bearer TOKEN'), or listen on 127.0.0.1"
            )
        return token


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address or `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: str | None, environ=os.environ) -> str | None:
    """The bearer token: the first line of --auth_token_file, else $ELMO_JAX_SERVE_TOKEN, else None."""
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--auth_token_file={path}: cannot read it ({e})") from None
        if not token:
            raise ValueError(f"--auth_token_file={path}: its first line is empty; put the token there")
        return token
    return environ.get(TOKEN_ENV) or None


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), so the port is known (and taken) before the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"--host={host} --port={port}: cannot listen there ({e.strerror})") from None
    sock.listen(2048)
    return sock


def build_app(params, config: ServiceConfig, token: str | None, on_start=None):
    """The ASGI application for a loaded biLM (`BiLMParams`): `config.workers` embedders of every layer
    (requests of any output mode share their batches), the batcher over them with its warm-up, and the
    request limits (a token's bytes bounded by the model's characters per token)."""
    from elmo_jax.features.sentences import SentenceEmbedder
    from elmo_jax.serving.dynamic_batching import DynamicBatcher, warmup_sentences
    from elmo_jax.serving.embed_requests import Limits
    from elmo_jax.serving.http_service import make_app

    limits = Limits(
        max_sentences=config.max_sentences,
        max_tokens=config.max_tokens,
        max_sentence_tokens=config.max_sentence_tokens,
        max_token_bytes=params.config.max_characters_per_token - 2,  # less its begin and end marks
        max_body_bytes=config.max_body_bytes,
    )
    embedders = [
        SentenceEmbedder(
            params,
            layers="all",
            batch_tokens=config.batch_tokens,
            compute_dtype=config.compute_dtype,
            tail_steps=config.tail_steps,
        )
        for _ in range(config.workers)
    ]
    batcher = DynamicBatcher(
        embedders,
        max_batch_tokens=config.max_batch_tokens,
        max_wait_s=config.max_wait_ms / 1000,
        max_queue_tokens=config.max_queue_tokens,
        warmup=warmup_sentences(embedders[0], config.max_sentence_tokens) if config.warmup else (),
    )
    return make_app(batcher, limits=limits, n_layers=params.config.n_output_layers, auth_token=token, on_start=on_start)


def serve(config: ServiceConfig) -> None:
    """Runs the service (see the module doc): the settings checked, the socket bound, the model loaded,
    the app served until SIGTERM or Ctrl-C; returns once every accepted request has its answer. Raises
    ValueError or OSError, naming the flag, for what cannot be served."""
    import uvicorn

    from elmo_jax.formats.model_source import ModelSource

    token = config.check()
    sock = listening_socket(config.host, config.port)
    params = ModelSource(config.model, config.options, config.weights).load()
    host, port = sock.getsockname()[:2]
    message = f"serving on http://{host}:{port} (POST /v1/embed; ready after the warm-up: GET /readyz)"
    app = build_app(
        params,
        config,
        token,
        on_start=lambda: print(message + (", bearer token required" if token else ""), flush=True),
    )
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="on", log_level="warning", timeout_graceful_shutdown=config.shutdown_timeout_s)
    )
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again with the handler it
    # found: a no-op one here, so the process ends with 0 once every accepted request has its answer.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    server.run(sockets=[sock])
    if not server.started:
        raise OSError("the server did not start (see the lines above)")
    logging.info("stopped: every accepted request was answered")
    print("stopped: every accepted request was answered", flush=True)
