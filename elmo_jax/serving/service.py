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
# Integer settings: flag -> (lowest, highest or None). Anything else (a float, a bool) is refused too.
INTEGERS = {
    "port": (0, 65535),
    "batch_tokens": (1, None),
    "max_batch_tokens": (1, None),
    "max_queue_tokens": (1, None),
    "max_sentences": (1, None),
    "max_tokens": (1, None),
    "max_sentence_tokens": (1, None),
    "max_body_bytes": (1, None),
    "max_json_answer_bytes": (1, None),
    "max_connections": (1, None),
    "workers": (1, None),
    "tail_steps": (1, None),
}
# Float settings: flag -> (lowest, whether the lowest itself is allowed, highest). NaN and infinities
# are refused by the comparisons (a wait of 1e300 ms overflowed the batcher's Condition.wait).
FLOATS = {
    "max_wait_ms": (0.0, True, 60_000.0),
    "shutdown_timeout_s": (0.0, True, 86_400.0),
    "header_timeout_s": (0.0, False, 3600.0),
    "body_timeout_s": (0.0, False, 3600.0),
    "keep_alive_s": (0.0, False, 3600.0),
}
# Files the process holds besides its connections (the listening socket, logs, the runtime's own: a
# GPU runtime opens a few dozen device files): what --max_connections must leave of RLIMIT_NOFILE.
RESERVED_FILES = 128


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
    max_json_answer_bytes: int = 32 << 20
    max_connections: int = 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0
    workers: int = 2
    tail_steps: int = 16
    warmup: bool = True
    warmup_shapes: str = "auto"
    shutdown_timeout_s: float = 60.0
    compute_dtype: str = "float32"

    def check(self, environ=os.environ) -> str | None:
        """Checks the settings before anything is loaded (errors name the flags); returns the bearer token
        (None: none set)."""
        for name, (lowest, highest) in INTEGERS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lowest or value > (highest or value):
                expected = "a positive integer" if highest is None else f"{lowest} to {highest}"
                raise ValueError(f"--{name}={value}: expected {expected}")
        for name, (lowest, inclusive, highest) in FLOATS.items():
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and (lowest <= value if inclusive else lowest < value) and value <= highest):
                bound = ">=" if inclusive else ">"
                raise ValueError(f"--{name}={value}: expected {bound} {lowest:g} and <= {highest:g} (a finite number)")
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--compute_dtype={self.compute_dtype}: expected float32 or bfloat16")
        if self.warmup_shapes not in ("auto", "all", "common"):
            raise ValueError(f"--warmup_shapes={self.warmup_shapes}: expected auto, all or common")
        _check_file_limit(self.max_connections)
        token = read_token(self.auth_token_file, environ)
        if token is None and not is_loopback(self.host):
            raise ValueError(
                f"--host={self.host} is reachable from other machines: set a token with --auth_token_file or "
                f"${TOKEN_ENV} (requests then carry 'Authorization: Bearer TOKEN'), or listen on 127.0.0.1"
            )
        return token


def _check_file_limit(max_connections: int) -> None:
    """Each connection holds a file descriptor: the cap and the process's own files must fit the hard
    RLIMIT_NOFILE (`serve` raises the soft limit to what they need, `raise_file_limit`). Nothing to check
    where there is no `resource` module (Windows: no RLIMIT_NOFILE)."""
    try:
        import resource  # POSIX only: imported here so that the package imports on Windows
    except ImportError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and max_connections + RESERVED_FILES > hard:
        raise ValueError(
            f"--max_connections={max_connections}: with the {RESERVED_FILES} files the service needs besides, "
            f"over the {hard} files this process may open (RLIMIT_NOFILE); lower it to at most "
            f"{max(hard - RESERVED_FILES, 0)} or raise the limit (ulimit -Hn)"
        )


def raise_file_limit(max_connections: int) -> None:
    """Raises the soft RLIMIT_NOFILE to what `max_connections` connections and the service's own files
    need, when it is lower (the hard limit allows it: `ServiceConfig.check`); nothing to raise where there
    is no `resource` module (Windows)."""
    try:
        import resource  # POSIX only, as in `_check_file_limit`
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        logging.info(
            "raised the soft RLIMIT_NOFILE from %d to %d (--max_connections=%d)", soft, needed, max_connections
        )


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address or `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_names(address: str, port: int) -> frozenset[str] | None:
    """The Host header values a service listening on (`address`, `port`) answers: on a loopback address,
    its loopback names with the port (bare too on port 80), so that a web page reaching it through a
    name of its own (DNS rebinding) is refused; None (any) beyond loopback, where the token guards it."""
    if not is_loopback(address):
        return None
    names = {"localhost", "127.0.0.1", "[::1]", f"[{address}]" if ":" in address else address.lower()}
    return frozenset({f"{name}:{port}" for name in names} | (names if port == 80 else set()))


def read_token(path: str | None, environ=os.environ) -> str | None:
    """The bearer token: the first line of --auth_token_file, else $ELMO_JAX_SERVE_TOKEN, else None; either
    stripped of surrounding whitespace, and refused when blank or not ASCII (a client's header carries
    ASCII). A token file that others may read gets a warning."""
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.readline().strip()
                mode = os.fstat(f.fileno()).st_mode
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--auth_token_file={path}: cannot read it ({e})") from None
        if not token:
            raise ValueError(f"--auth_token_file={path}: its first line is empty; put the token there")
        if mode & 0o077:
            logging.warning("--auth_token_file=%s may be read by others (mode %o): chmod 600 it", path, mode & 0o777)
        return _ascii_token(token, f"--auth_token_file={path}")
    if TOKEN_ENV not in environ:
        return None
    token = environ[TOKEN_ENV].strip()
    if not token:
        raise ValueError(f"${TOKEN_ENV} is set but blank: put the token there, or unset it")
    return _ascii_token(token, f"${TOKEN_ENV}")


def _ascii_token(token: str, source: str) -> str:
    if not token.isascii() or not token.isprintable():
        raise ValueError(f"{source}: the token must be printable ASCII (an HTTP header carries it)")
    return token


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


def build_app(params, config: ServiceConfig, token: str | None, on_start=None, connections=None, allowed_hosts=None):
    """The ASGI application for a loaded biLM (`BiLMParams`): `config.workers` embedders of every layer
    (requests of any output mode share their batches), the batcher over them with its warm-up, and the
    request limits (a token's bytes bounded by the model's characters per token, a JSON answer's by the
    model's width). `connections`: the server's `ConnectionGuard`, whose refusals /metrics counts;
    `allowed_hosts`: the Host values answered (`host_names` of the bound address; None: any)."""
    from elmo_jax.features.sentences import SentenceEmbedder
    from elmo_jax.model.vocabulary import token_vocabulary
    from elmo_jax.serving.dynamic_batching import DynamicBatcher, warmup_set
    from elmo_jax.serving.embed_requests import Limits
    from elmo_jax.serving.http_service import make_app

    limits = Limits(
        max_sentences=config.max_sentences,
        max_tokens=config.max_tokens,
        max_sentence_tokens=config.max_sentence_tokens,
        max_characters_per_token=params.config.max_characters_per_token,  # longer tokens are cut and counted
        vocabulary=token_vocabulary(params),
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
        warmup=warmup_set(embedders[0], config.max_sentence_tokens, warmup_shapes(config, embedders[0]))
        if config.warmup
        else (),
    )
    return make_app(
        batcher,
        limits=limits,
        n_layers=params.config.n_output_layers,
        auth_token=token,
        on_start=on_start,
        dim=params.config.output_dim,
        max_json_answer_bytes=config.max_json_answer_bytes,
        body_timeout_s=config.body_timeout_s,
        connections=connections,
        allowed_hosts=allowed_hosts,
    )


def warmup_shapes(config: ServiceConfig, embedder) -> str:
    """The warm-up's set of shapes: --warmup_shapes, where "auto" is "common" on a CPU (each program
    costs seconds to compile there; the rest compile when first met) and "all" on an accelerator."""
    if config.warmup_shapes != "auto":
        return config.warmup_shapes
    return "common" if embedder.runner.devices[0].platform == "cpu" else "all"


def http_server(app, config: ServiceConfig, connections):
    """The uvicorn server the command runs `app` on (call `.run(sockets=[sock])`): uvicorn's h11 protocol
    under `connections` (the `ConnectionGuard` of --max_connections, --header_timeout_s and
    --body_timeout_s, the one `build_app` was given, so that /metrics counts its refusals), request heads
    of at most `MAX_HEAD_BYTES`, idle keep-alive connections closed after --keep_alive_s,
    --shutdown_timeout_s for the open requests after SIGTERM. uvicorn's log lines go to the process's
    logging (absl's handler in the command) rather than handlers of its own; no WebSocket."""
    import uvicorn

    from elmo_jax.serving.http_headers import MAX_HEAD_BYTES

    return uvicorn.Server(
        uvicorn.Config(
            app,
            lifespan="on",
            log_config=None,
            log_level="warning",
            http=connections.protocol,
            ws="none",
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            timeout_keep_alive=config.keep_alive_s,
            timeout_graceful_shutdown=config.shutdown_timeout_s,
        )
    )


def serve(config: ServiceConfig) -> None:
    """Runs the service (see the module doc): the settings checked, the socket bound, the model loaded,
    the app served until SIGTERM or Ctrl-C; returns once every accepted request has its answer (a 503
    for those still waiting for a warm-up that a signal ended), printing what became of them. Raises
    ValueError or OSError, naming the flag, for what cannot be served."""
    from elmo_jax.formats.model_source import ModelSource
    from elmo_jax.serving.connections import ConnectionGuard

    token = config.check()
    raise_file_limit(config.max_connections)
    sock = listening_socket(config.host, config.port)
    params = ModelSource(config.model, config.options, config.weights).load()
    host, port = sock.getsockname()[:2]
    message = f"serving on http://{host}:{port} (POST /v1/embed; ready after the warm-up: GET /readyz)"
    connections = ConnectionGuard(config.max_connections, config.header_timeout_s, config.body_timeout_s)
    app = build_app(
        params,
        config,
        token,
        on_start=lambda: print(message + (", bearer token required" if token else ""), flush=True),
        connections=connections,
        allowed_hosts=host_names(host, port),
    )
    server = http_server(app, config, connections)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again with the handler it
    # found: a no-op one here, so the process ends with 0 once every accepted request has its answer.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    server.run(sockets=[sock])
    if not server.started:
        raise OSError("the server did not start (see the lines above)")
    logging.info("%s", app.outcome)  # the lifespan has logged it as a warning when some were refused
    print(app.outcome, flush=True)
