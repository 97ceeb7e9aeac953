"""The few things `embed_file` needs from the other processes of a multi-process run (`--distributed`).

Each process embeds its own share of the lines on its own devices, with no collective in any program; the
processes meet only to agree on the input, to wait for each other, and to tell process 0 where their
parts are. With one process every function here is a no-op or returns at once. (The trainer's
`training/multihost.py` does the same for training; features cannot import it.)
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils

MAX_TEXT_BYTES = 4096  # a path or digest exchanged between processes


def share() -> tuple[int, int]:
    """(this process's index, the number of processes)."""
    return jax.process_index(), jax.process_count()


def owns(line: int, index: int, count: int) -> bool:
    """Whether process `index` of `count` embeds `line` (0-based): lines are dealt round-robin, which
    spreads every length and width bucket evenly over the processes."""
    return line % count == index


def barrier(name: str) -> None:
    """Waits until every process gets here."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def gather_text(text: str) -> list[str]:
    """Every process's `text`, by process index (every process must call it)."""
    if jax.process_count() == 1:
        return [text]
    data = text.encode("utf-8")
    if len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"internal error: {len(data)} bytes to exchange between processes, at most {MAX_TEXT_BYTES}")
    padded = np.zeros(MAX_TEXT_BYTES + 2, np.uint8)
    padded[:2] = divmod(len(data), 256)
    padded[2 : 2 + len(data)] = np.frombuffer(data, np.uint8)
    gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(jax.process_count(), -1)
    return [bytes(row[2 : 2 + int(row[0]) * 256 + int(row[1])]).decode("utf-8") for row in gathered]


def check_same(what: str, value: str) -> None:
    """Raises ValueError unless every process has the same `value` (e.g. the input's digest)."""
    values = gather_text(value)
    if len(set(values)) > 1:
        differing = [i for i, v in enumerate(values) if v != values[0]]
        raise ValueError(
            f"the processes see different {what}: process 0 and process(es) {differing} differ; every process "
            "must read the same input with the same arguments"
        )
