"""Turning text into ELMo vectors: `embed`, the token cache, scalar mixes and task layers, and the
library half of embedding whole files (input checks, length buckets). Builds on `model` and `formats`."""
