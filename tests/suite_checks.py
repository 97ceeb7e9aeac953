"""Counts the suite's checks, to show that a change to the tests dropped none (docs/TESTING.md).

    python tests/suite_checks.py              # the working tree
    python tests/suite_checks.py --rev=HEAD~5 # a revision (read with git show; nothing is checked out)

Prints, for the test modules and their helpers (tests/**/*.py): test functions (`def test_*`, before
parametrization), and assertions as written: `assert` statements, calls of a function whose name starts
with `assert` (`np.testing.assert_allclose`, `assert_trees_equal`, ...), `pytest.raises` and
`pytest.warns` blocks, and `error_line` checks of a refused command. A helper's assertions count once,
however many tests call it; parametrized cases are counted by pytest (`pytest --collect-only -q`).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sources(rev: str | None) -> dict[str, str]:
    """{path: text} of tests/**/*.py in the working tree or at `rev`."""
    if rev is None:
        return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted((ROOT / "tests").rglob("*.py"))}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "tests"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    return {
        name: subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        for name in names
        if name.endswith(".py")
    }


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def count(source: str) -> Counter:
    """The checks of one module."""
    counts = Counter()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            counts["test functions"] += 1
        elif isinstance(node, ast.Assert):
            counts["assert statements"] += 1
        elif isinstance(node, ast.Call):
            name = _called_name(node)
            if name.startswith("assert"):
                counts["assert_* calls"] += 1
            elif name in ("raises", "warns") and isinstance(node.func, ast.Attribute):
                counts["pytest.raises/warns"] += 1
            elif name == "error_line":
                counts["error_line checks"] += 1
    return counts


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="a git revision (default: the working tree)")
    args = parser.parse_args(argv)
    total = Counter()
    for source in _sources(args.rev).values():
        total += count(source)
    checks = sum(v for k, v in total.items() if k != "test functions")
    print(f"{args.rev or 'working tree'}: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
    print(f"assertions in all: {checks}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
