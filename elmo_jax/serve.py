"""Serve ELMo vectors over HTTP: concurrent requests merged into batches on every local device.

    pip install 'elmo-jax[serve]'
    python -m elmo_jax.serve --model=small                       # http://127.0.0.1:8080
    curl -s localhost:8080/v1/embed -d '{"sentences": [["The", "bank", "."]], "layers": "average"}'
    ELMO_JAX_SERVE_TOKEN=... python -m elmo_jax.serve --model=original --host=0.0.0.0 --port=8080

The model is any --model the other commands take (a published name, a model directory), or --options
and --weights; no request can name a file or a model. The service listens on 127.0.0.1; binding to any
other address needs a token (--auth_token_file, or the ELMO_JAX_SERVE_TOKEN environment variable) that
every request to /v1/embed and /metrics must carry as `Authorization: Bearer TOKEN`, and is refused at
start-up without one. It is ready (GET /readyz) once the warm-up has compiled the common shapes.
SIGTERM or Ctrl-C stop it gracefully: no new connections, every accepted request answered, exit 0.

The API, the limits, the figures and deployment notes: docs/SERVING.md.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket

from absl import flags, logging

from elmo_jax import cli

FLAGS = flags.FLAGS
TOKEN_ENV = "ELMO_JAX_SERVE_TOKEN"


def define_flags() -> None:
    cli.define_model_flags()
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on; anything but loopback needs a token.")
    flags.DEFINE_integer("port", 8080, "Port to listen on (0: any free port, printed at start).")
    flags.DEFINE_string(
        "auth_token_file", None, f"A file holding the bearer token requests must carry (or ${TOKEN_ENV})."
    )
    flags.DEFINE_integer("batch_tokens", 4096, "Time steps per device batch (rows x row length): device memory.")
    flags.DEFINE_integer("max_batch_tokens", 4096, "A merged batch closes once it holds this many tokens ...")
    flags.DEFINE_float("max_wait_ms", 5.0, "... or once its oldest request has waited this long.")
    flags.DEFINE_integer("max_queue_tokens", 262144, "Tokens waiting for a batch at most; beyond: 503 + Retry-After.")
    flags.DEFINE_integer("max_sentences", 256, "Sentences per request at most (413 beyond).")
    flags.DEFINE_integer("max_tokens", 16384, "Tokens per request at most (413 beyond).")
    flags.DEFINE_integer("max_sentence_tokens", 512, "Tokens per sentence at most (413 beyond).")
    flags.DEFINE_integer("max_body_bytes", 8 << 20, "Bytes per request body at most (413 beyond).")
    flags.DEFINE_integer(
        "workers", 2, "Batches in flight: one is formed and dispatched while another's results are awaited."
    )
    flags.DEFINE_integer(
        "tail_steps",
        16,
        "A small batch's rows are rounded up to a 1/N of a full batch's: a larger N pads less and warms up more"
        " programs (small model: 171 with 16, 108 with 8).",
    )
    flags.DEFINE_bool("warmup", True, "Compile the common shapes before reporting ready.")
    flags.DEFINE_float("shutdown_timeout_s", 60.0, "After SIGTERM: how long open requests may take to finish.")
    flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "Matmul precision.")


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


def check_flags() -> str | None:
    """Checks the flags before anything is loaded; returns the token (None: none set)."""
    for name in (
        "batch_tokens",
        "max_batch_tokens",
        "max_queue_tokens",
        "max_sentences",
        "max_tokens",
        "workers",
        "tail_steps",
    ):
        if getattr(FLAGS, name) < 1:
            raise ValueError(f"--{name}={getattr(FLAGS, name)}: expected a positive integer")
    if FLAGS.max_sentence_tokens < 1 or FLAGS.max_body_bytes < 1:
        raise ValueError("--max_sentence_tokens and --max_body_bytes must be positive")
    if FLAGS.max_wait_ms < 0:
        raise ValueError(f"--max_wait_ms={FLAGS.max_wait_ms}: expected >= 0")
    if not 0 <= FLAGS.port < 65536:
        raise ValueError(f"--port={FLAGS.port}: expected 0 to 65535")
    token = read_token(FLAGS.auth_token_file)
    if token is None and not is_loopback(FLAGS.host):
        raise ValueError(
            f"--host={FLAGS.host} is reachable from other machines: set a token with --auth_token_file or "
            f"${TOKEN_ENV} (requests then carry 'Authorization: Bearer TOKEN'), or listen on 127.0.0.1"
        )
    return token


def build_app(params, token: str | None, on_start=None):
    """The application for a loaded biLM, from the flags: embedders, batcher, limits."""
    from elmo_jax.features.sentences import SentenceEmbedder
    from elmo_jax.serving.dynamic_batching import DynamicBatcher, warmup_sentences
    from elmo_jax.serving.embed_requests import Limits
    from elmo_jax.serving.http_service import make_app

    C = params.config.max_characters_per_token
    limits = Limits(
        max_sentences=FLAGS.max_sentences,
        max_tokens=FLAGS.max_tokens,
        max_sentence_tokens=FLAGS.max_sentence_tokens,
        max_token_bytes=C - 2,
        max_body_bytes=FLAGS.max_body_bytes,
    )
    embedders = [
        SentenceEmbedder(
            params,
            layers="all",
            batch_tokens=FLAGS.batch_tokens,
            compute_dtype=FLAGS.compute_dtype,
            tail_steps=FLAGS.tail_steps,
        )
        for _ in range(FLAGS.workers)
    ]
    batcher = DynamicBatcher(
        embedders,
        max_batch_tokens=FLAGS.max_batch_tokens,
        max_wait_s=FLAGS.max_wait_ms / 1000,
        max_queue_tokens=FLAGS.max_queue_tokens,
        warmup=warmup_sentences(embedders[0], FLAGS.max_sentence_tokens) if FLAGS.warmup else (),
    )
    return make_app(
        batcher,
        limits=limits,
        n_layers=params.config.n_output_layers,
        auth_token=token,
        on_start=on_start,
    )


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


def run() -> None:
    import uvicorn

    from elmo_jax.formats.model_source import ModelSource

    token = check_flags()
    sock = listening_socket(FLAGS.host, FLAGS.port)
    params = ModelSource(FLAGS.model, FLAGS.options, FLAGS.weights).load()
    host, port = sock.getsockname()[:2]
    message = f"serving on http://{host}:{port} (POST /v1/embed; ready after the warm-up: GET /readyz)"
    app = build_app(
        params, token, on_start=lambda: print(message + (", bearer token required" if token else ""), flush=True)
    )
    config = uvicorn.Config(app, lifespan="on", log_level="warning", timeout_graceful_shutdown=FLAGS.shutdown_timeout_s)
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again with the handler it
    # found: a no-op one here, so the process ends with 0 once every accepted request has its answer.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    server.run(sockets=[sock])
    if not server.started:
        raise OSError("the server did not start (see the lines above)")
    logging.info("stopped: every accepted request was answered")
    print("stopped: every accepted request was answered", flush=True)


def main(argv: list[str]) -> None:
    cli.run_main(run, argv, interrupted=" before serving")


if __name__ == "__main__":
    cli.start(main, define_flags)
