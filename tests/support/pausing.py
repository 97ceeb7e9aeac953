"""Runs a command with one function made to stop and wait at a chosen call, so that a test can kill a
real process at an exact moment, synchronised on a file rather than on time:

    python -m tests.support.pausing MODULE:ATTRIBUTE CALL MARKER -m COMMAND_MODULE ARGS...

On its CALL-th call (1 for the first), ATTRIBUTE of MODULE (a function, or `Class.method`) creates the
file MARKER and then waits until the process is killed; before, it runs as usual. The command runs as
`python -m COMMAND_MODULE ARGS` would run it. Nothing in the package knows of this: the patch is made
here, in the test's own process image, before the command starts.
"""

from __future__ import annotations

import importlib
import runpy
import sys
import time


def pause_at(target: str, call: int, marker: str) -> None:
    """Patches `target` ("module:Class.method" or "module:function") to pause at its `call`-th call."""
    module_name, attribute = target.split(":")
    owner = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    original, calls = getattr(owner, name), []

    def pausing(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            with open(marker, "w"):
                pass
            while True:  # until killed
                time.sleep(3600)
        return original(*args, **kwargs)

    setattr(owner, name, pausing)


def main(argv: list[str]) -> None:
    target, call, marker, flag, command, *args = argv
    if flag != "-m":
        raise SystemExit(f"usage: {__doc__}")
    pause_at(target, int(call), marker)
    sys.argv = [command, *args]
    runpy.run_module(command, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
