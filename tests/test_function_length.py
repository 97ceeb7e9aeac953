"""The package's functions stay short (issue #30 item 7): at most 1% of them over 50 lines, none over 80.

A function's length is its lines from `def` to its last line, docstring and comments included (what a
reader scrolls through). A long function is a sign that it does more than one job: split it by job, as
docs/ARCHITECTURE.md ("Short functions") asks, rather than raising the bounds here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "elmo_jax"
LONG, TOO_LONG, LONG_SHARE = 50, 80, 0.01


def function_lengths() -> dict[str, int]:
    """`path:line name` -> lines, for every function and method of the package."""
    lengths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
                lengths[where] = node.end_lineno - node.lineno + 1
    return lengths


def test_few_functions_are_long_and_none_is_too_long():
    lengths = function_lengths()
    assert len(lengths) > 500  # the walk found the package
    too_long = {name: n for name, n in lengths.items() if n > TOO_LONG}
    assert not too_long, f"functions over {TOO_LONG} lines: {too_long}"
    long = {name: n for name, n in lengths.items() if n > LONG}
    assert len(long) <= LONG_SHARE * len(lengths), f"{len(long)} of {len(lengths)} functions over {LONG} lines: {long}"
