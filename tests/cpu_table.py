"""Regenerates docs/TESTING.md's table of CPU time per test file, the suite's budget unit.

    python tests/cpu_table.py                      # runs the README's pytest command, then rewrites the table
    python tests/cpu_table.py --report=cpu.json    # from a report a run already wrote (--cpu-report=cpu.json)
    python tests/cpu_table.py --check_only         # runs the suite and prints the figures, leaves the docs

The pytest command is the one after the README's test-command marker (the part from `.venv/bin/python -m
pytest`), with `--cpu-report` added; its total is the user + system time of pytest and of every process it
waited for, which is what the budget counts. Run it on a quiet machine: CPU time moves less than wall time
under load, but not nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "TESTING.md"
BEGIN, END = "<!-- cpu-table:begin -->", "<!-- cpu-table:end -->"


def readme_pytest_command() -> list[str]:
    """argv of the README's pytest invocation (after its test-command marker)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(line for line in text.split("<!-- test-command")[1].splitlines() if line.startswith("python3 "))
    return shlex.split(line.split("&& ")[-1])


def run_suite(report: str) -> dict:
    """Runs the README's pytest command; returns its exit code, wall seconds and CPU seconds."""
    argv = [*readme_pytest_command(), f"--cpu-report={report}"]
    print("+", shlex.join(argv), flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    code = subprocess.run(argv, cwd=ROOT).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {"code": code, "wall": wall, "user": user, "system": system}


def table(report: dict) -> list[str]:
    """Markdown rows: per test file, its tests, CPU seconds (and share), the slowest test, and the
    seconds JAX spent tracing, lowering and compiling in the pytest worker (wall time)."""
    files = collections.defaultdict(list)
    for row in report["tests"]:
        files[row["nodeid"].split("::")[0]].append(row)
    total = sum(row["cpu"] for row in report["tests"])
    rows = [
        "| file | tests | CPU s | share | slowest test (CPU s) | trace + lower + compile s |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, tests in sorted(files.items(), key=lambda item: -sum(t["cpu"] for t in item[1])):
        cpu = sum(t["cpu"] for t in tests)
        slowest = max(tests, key=lambda t: t["cpu"])
        jax_s = sum(t.get("trace", 0) + t.get("lower", 0) + t.get("compile", 0) for t in tests)
        rows.append(
            f"| {name.removeprefix('tests/')} | {len(tests)} | {cpu:.1f} | {cpu / total:.1%} | "
            f"`{slowest['nodeid'].split('::', 1)[1]}` ({slowest['cpu']:.1f}) | {jax_s:.1f} |"
        )
    outside = sum(report["workers"].values()) - total
    rows.append(f"| (start-up and collection, per worker) | | {outside:.1f} | | | |")
    rows.append(f"| **all tests** | {len(report['tests'])} | **{total:.1f}** | | | |")
    return rows


def rewrite(rows: list[str], summary: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        sys.exit(f"error: {DOC} has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + summary + "\n\n" + "\n".join(rows) + "\n" + END + tail, encoding="utf-8")
    print(f"rewrote the table in {DOC}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", help="a --cpu-report JSON file instead of running the suite")
    parser.add_argument("--check_only", action="store_true", help="print the figures, do not rewrite the docs")
    args = parser.parse_args(argv)
    if args.report:
        report_path, measured = args.report, None
    else:
        report_path = os.path.join(tempfile.mkdtemp(prefix="elmo_jax_cpu_"), "cpu.json")
        measured = run_suite(report_path)
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    rows = table(report)
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    summary = f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores ({cpu_model})"
    summary += "" if measured else ", from a report"
    if measured:
        summary += (
            f": the README's command took **{(measured['user'] + measured['system']) / 60:.1f} CPU-minutes** "
            f"({measured['user']:.0f} s user + {measured['system']:.0f} s system) and "
            f"{measured['wall'] / 60:.1f} minutes of wall time, exit code {measured['code']}."
        )
    summary += " CPU seconds per file (tests/support/cpu_time.py; a fixture counts in the first test that uses it):"
    print(summary)
    print("\n".join(rows))
    if not args.check_only:
        rewrite(rows, re.sub(r"\s+", " ", summary))
    return 0 if measured is None else measured["code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
