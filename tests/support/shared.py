"""Work done once per test session, whatever the number of pytest-xdist workers.

Session fixtures are per process: with N workers a trained run would be trained N times. `once` builds
a directory under the root every worker of the session shares (the parent of each worker's base
temporary directory, as pytest-xdist's documentation suggests), under a file lock: the first worker
to ask builds it, the others wait and then read it. What it returns must be JSON (it is stored beside
the directory); tests only read the directory.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def session_root(tmp_path_factory) -> Path:
    """A directory every worker of this pytest session sees (the base temporary directory without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> tuple[Path, object]:
    """`build(directory)` run once per session for `name`; returns (directory, what it returned).

    A build that raised leaves nothing behind: the next worker to ask builds again (and fails the same
    way, in its own test).
    """
    root = session_root(tmp_path_factory)
    directory, result_file = root / name, root / f"{name}.result.json"
    with FileLock(str(root / f"{name}.lock")):
        if result_file.exists():
            return directory, json.loads(result_file.read_text(encoding="utf-8"))
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        try:
            result = build(directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        result_file.write_text(json.dumps(result), encoding="utf-8")
        return directory, result
