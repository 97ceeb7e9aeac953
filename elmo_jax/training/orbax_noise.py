"""Keeping what orbax leaves behind after a failed checkpoint write out of the one-line error.

When one array write fails (a full disk, a read-only directory), orbax-checkpoint 0.12 raises the
first failure to `wait`/`save`, which `checkpoint.Checkpoints` reports in one line. But the writes run
as asyncio tasks gathered with `asyncio.gather`, which does not cancel the others, on an event loop
that orbax then closes with those tasks still pending. Later, at no predictable moment (up to
interpreter exit), two kinds of reports about the abandoned tasks appear:
  - asyncio's "Task exception was never retrieved" / "Task was destroyed but it is pending!" (logger
    "asyncio"), for tasks whose coroutine is orbax's;
  - TensorStore's "RuntimeError: Event loop is closed", an unraisable exception: a write that finishes
    cannot wake its task on the closed loop (`loop.call_soon_threadsafe`).
Both repeat a failure already reported; `install` drops exactly those and nothing else (other tasks'
reports and other unraisable errors still print).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback

_ABANDONED_TASK = ("Task exception was never retrieved", "Task was destroyed but it is pending!")
# The task's line in asyncio's report: "future: <Task finished ... coro=<f() done, defined at FILE:LINE> ..."
# or "task: <Task pending ... coro=<f() running at FILE:LINE> ...".
_TASK_CORO_FILE = re.compile(
    r"^(?:future|task): <Task .*?coro=<\S+ (?:done, defined|running) at (?P<file>.+?):\d+>", re.MULTILINE
)
_ORBAX_SOURCE = f"{os.sep}orbax{os.sep}checkpoint{os.sep}"


class AbandonedOrbaxTasks(logging.Filter):
    """Drops asyncio's reports about tasks whose coroutine is orbax-checkpoint's."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_ABANDONED_TASK):
            return True
        task = _TASK_CORO_FILE.search(message)
        return not (task and _ORBAX_SOURCE in task["file"])


def is_closed_loop_callback(unraisable) -> bool:
    """An unraisable `RuntimeError: Event loop is closed` raised in `loop.call_soon_threadsafe`."""
    return (
        unraisable.object is None
        and isinstance(unraisable.exc_value, RuntimeError)
        and str(unraisable.exc_value) == "Event loop is closed"
        and any(
            frame.f_code.co_name == "call_soon_threadsafe" for frame, _ in traceback.walk_tb(unraisable.exc_traceback)
        )
    )


def install() -> None:
    """Installs both filters, once per process."""
    asyncio_logger = logging.getLogger("asyncio")
    if not any(isinstance(f, AbandonedOrbaxTasks) for f in asyncio_logger.filters):
        asyncio_logger.addFilter(AbandonedOrbaxTasks())
    if not getattr(sys.unraisablehook, "_elmo_jax_orbax_noise", False):
        previous = sys.unraisablehook

        def hook(unraisable):
            if not is_closed_loop_callback(unraisable):
                previous(unraisable)

        hook._elmo_jax_orbax_noise = True
        sys.unraisablehook = hook
