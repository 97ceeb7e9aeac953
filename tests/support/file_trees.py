"""Small local file trees for the copy tests: write one file, read a whole tree back."""

from __future__ import annotations

import os
import stat


def write(path, text: str) -> None:
    """`text` at `path`, its directories made."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def tree(root, leave_out: str) -> dict[str, str]:
    """Every regular file under `root` (links not followed) but `leave_out` (a relative path, e.g. a copy's
    marker, which each copy has its own of): relative path -> content."""
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if relative != leave_out and stat.S_ISREG(os.lstat(path).st_mode):
                with open(path, encoding="utf-8") as f:
                    out[relative] = f.read()
    return out
