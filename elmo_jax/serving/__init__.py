"""ELMo as an HTTP service (`python -m elmo_jax.serve`, docs/SERVING.md): concurrent requests merged into
batches for the embedding library, the requests' checks and encodings, the ASGI app and its metrics. An
application over the embedding library (`features`); it imports no other application.

Its face, what the command, the benchmarks and the tests use:
- `service`: the settings (`ServiceConfig`, the command's flags as one value, checked before anything
  loads), `build_app` (embedders, batcher, limits and app for a loaded biLM), `http_server` (the uvicorn
  server the command runs it on), `serve` (the whole run), and the socket, file-limit and token rules
  (`listening_socket`, `raise_file_limit`, `is_loopback`, `host_names`, `read_token`, `TOKEN_ENV`);
- `dynamic_batching.DynamicBatcher` and its warm-up (`warmup_sentences`), `http_service.make_app`,
  `embed_requests.Limits`, `connections.ConnectionGuard` (the connections' timeouts and cap).
The rest (`embed_requests`' parsing and encodings, `http_headers`' rules, the app's handlers and
metrics) is the service's own. `service` costs the standard library alone and is imported here; the
others import JAX, Starlette, uvicorn or NumPy and are imported on first use (a module `__getattr__`),
so the command's `--help` costs no JAX.
"""

import importlib

from elmo_jax.serving.service import (
    TOKEN_ENV,
    ServiceConfig,
    build_app,
    host_names,
    http_server,
    is_loopback,
    listening_socket,
    raise_file_limit,
    read_token,
    serve,
)

# Name -> the module of this package that defines it, imported when the name is first used.
_ON_USE = {
    "ConnectionGuard": "connections",
    "DynamicBatcher": "dynamic_batching",
    "warmup_sentences": "dynamic_batching",
    "make_app": "http_service",
    "Limits": "embed_requests",
}

__all__ = [
    "ConnectionGuard",
    "DynamicBatcher",
    "Limits",
    "ServiceConfig",
    "TOKEN_ENV",
    "build_app",
    "host_names",
    "http_server",
    "is_loopback",
    "listening_socket",
    "make_app",
    "raise_file_limit",
    "read_token",
    "serve",
    "warmup_sentences",
]


def __getattr__(name: str):
    if name not in _ON_USE:
        raise AttributeError(f"module 'elmo_jax.serving' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"elmo_jax.serving.{_ON_USE[name]}"), name)
    globals()[name] = value  # later uses are plain attribute reads
    return value
