"""The package's cache on this machine: one directory for everything elmo-jax keeps between runs.

    cache_dir()    # $ELMO_JAX_CACHE, else $XDG_CACHE_HOME/elmo_jax, else ~/.cache/elmo_jax

What lives in it: the published models (`formats.pretrained`: CACHE/models, CACHE/downloads,
CACHE/known_files.json) and the persistent compilation cache (`storage.compile_cache`:
CACHE/compilation_cache). Nothing is created here: each owner creates its own part when it first needs it.
"""

from __future__ import annotations

import os

CACHE_VARIABLE = "ELMO_JAX_CACHE"


def cache_dir() -> str:
    """The package's cache directory (absolute): $ELMO_JAX_CACHE, else $XDG_CACHE_HOME/elmo_jax, else
    ~/.cache/elmo_jax (created by whoever first writes into it)."""
    if os.environ.get(CACHE_VARIABLE):
        return os.path.abspath(os.path.expanduser(os.environ[CACHE_VARIABLE]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(base, "elmo_jax"))
