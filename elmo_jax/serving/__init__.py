"""ELMo as an HTTP service (`python -m elmo_jax.serve`, docs/SERVING.md): concurrent requests merged into
batches for the embedding library, the requests' checks and encodings, the ASGI app and its metrics. An
application over the embedding library (`features`); it imports no other application."""
