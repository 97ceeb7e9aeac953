"""Serve ELMo vectors over HTTP: concurrent requests merged into batches on every local device.

    pip install -e '.[serve]'     # the serve extra, in a clone (a wheel: pip install 'WHEEL[serve]'; BUILD.md)
    python -m elmo_jax.serve --model=small --nowarmup            # a quick try: ready in seconds (or elmo-serve)
    python -m elmo_jax.serve --model=small                       # http://127.0.0.1:8080, after the warm-up
    curl -s localhost:8080/v1/embed -H 'Content-Type: application/json' -d '{"texts": ["The bank ."]}'
    ELMO_JAX_SERVE_TOKEN=... python -m elmo_jax.serve --model=original --host=0.0.0.0 --port=8080

The model is any --model the other commands take (a published name, a model directory), or --options
and --weights; no request can name a file or a model. The service listens on 127.0.0.1; binding to any
other address needs a token (--auth_token_file, or the ELMO_JAX_SERVE_TOKEN environment variable) that
every request to /v1/embed and /metrics must carry as `Authorization: Bearer TOKEN`, and is refused at
start-up without one; on loopback, only requests to its loopback names are answered (the Host header).
Only JSON bodies (Content-Type: application/json) are read; connections are bounded (--max_connections,
--header_timeout_s, --body_timeout_s). It is ready (GET /readyz) once the warm-up has compiled the common
shapes (its progress in the log and /readyz; requests meanwhile get 503 with Retry-After); --nowarmup
skips it, each shape then compiling when a request first meets it.
SIGTERM or Ctrl-C stop it gracefully: no new connections, every accepted request answered, exit 0.

The API, the limits, the figures and deployment notes: docs/SERVING.md.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from elmo_jax import cli
from elmo_jax.serving import TOKEN_ENV, ServiceConfig, serve

FLAGS = flags.FLAGS


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
        "max_json_answer_bytes",
        32 << 20,
        "Bytes of a JSON answer at most, estimated at 24 a number before anything runs (413 beyond: ask .npy).",
    )
    flags.DEFINE_integer(
        "max_connections",
        1024,
        "Open connections at most: one more pushes out the one waiting longest for a request head (503 to it).",
    )
    flags.DEFINE_float("header_timeout_s", 10.0, "A request head must arrive within this (408 beyond).")
    flags.DEFINE_float(
        "body_timeout_s", 60.0, "A request body must arrive within this after its head, an answer be read (408)."
    )
    flags.DEFINE_float("keep_alive_s", 5.0, "An idle connection is closed after this since its last answer.")
    flags.DEFINE_integer(
        "workers", 2, "Batches in flight: one is formed and dispatched while another's results are awaited."
    )
    flags.DEFINE_integer(
        "tail_steps",
        16,
        "A small batch's rows are rounded up to a 1/N of a full batch's: a larger N pads less and warms up more"
        " programs (small model: 168 with 16, 105 with 8).",
    )
    flags.DEFINE_bool("warmup", True, "Compile the common shapes before reporting ready (--nowarmup: ready at once).")
    flags.DEFINE_enum(
        "warmup_shapes",
        "auto",
        ["auto", "all", "common"],
        "The warm-up's shapes: all (168 programs for the small model), common (batches of up to 8 rows of up to 64"
        " steps: 30; the rest compile when first met), auto (common on a CPU, all on an accelerator).",
    )
    flags.DEFINE_float("shutdown_timeout_s", 60.0, "After SIGTERM: how long open requests may take to finish.")
    flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "Matmul precision.")


def run() -> None:
    serve(ServiceConfig(**{field.name: getattr(FLAGS, field.name) for field in dataclasses.fields(ServiceConfig)}))


def main(argv: list[str]) -> None:
    cli.run_main(run, argv, interrupted=" before serving")


def start() -> None:
    """The command: `elmo-serve` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.serve`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
