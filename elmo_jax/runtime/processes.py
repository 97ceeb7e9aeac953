"""The few things `embed_file` needs from the other processes of a multi-process run (`--distributed`).

Each process embeds its own share of the lines on its own devices, with no collective in any program; the
processes meet only to agree on the input, to wait for each other, and to tell process 0 where their
parts are. With one process every function here is a no-op or returns at once. (The trainer's
`runtime/multihost.py` does the same for training; features cannot import it.)

When another process of the run dies (killed, crashed), the next meeting fails at once (gloo: the
connection was closed by the peer) and raises `ProcessLost` naming it, so the survivors stop instead
of waiting for it; the command then exits at once (JAX's own shutdown would wait for the dead process's
heartbeat to time out, 100 s, and then abort).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

MAX_TEXT_BYTES = 4096  # a path or digest exchanged between processes


class ProcessLost(RuntimeError):
    """Another process of this run stopped or failed: a meeting of the processes could not complete."""


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
        with _meeting(name):
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
    with _meeting("exchanging paths and digests"):
        gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(jax.process_count(), -1)
    return [bytes(row[2 : 2 + int(row[0]) * 256 + int(row[1])]).decode("utf-8") for row in gathered]


@contextlib.contextmanager
def _meeting(name: str) -> Iterator[None]:
    """A collective of every process: its failure (a runtime error of the collective) is `ProcessLost`."""
    try:
        yield
    except Exception as e:  # jax.errors.JaxRuntimeError from the collective
        index, count = share()
        other = f"process {1 - index} of 2" if count == 2 else f"another of the {count} processes"
        cause = " ".join(str(e).split())
        raise ProcessLost(
            f"{other} of this run stopped or failed while process {index} waited for it at {name!r} ({cause})"
        ) from e


def check_same(what: str, value: str) -> None:
    """Raises ValueError unless every process has the same `value` (e.g. the input's digest)."""
    values = gather_text(value)
    if len(set(values)) > 1:
        differing = [i for i, v in enumerate(values) if v != values[0]]
        raise ValueError(
            f"the processes see different {what}: process 0 and process(es) {differing} differ; every process "
            "must read the same input with the same arguments"
        )
