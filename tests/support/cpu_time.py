"""CPU time per test, the suite's budget unit (docs/TESTING.md): a pytest plugin, loaded by conftest.

Each test is charged the user + system time of its process and of the child processes it waited for
(`resource.getrusage`), from its setup to its teardown: fixtures are charged to the first test that
builds them. With pytest-xdist the figures travel to the controller in each test's report
(`user_properties`), so one command gets them all.

- `--cpu-report=PATH` writes them as JSON (one row per test, with the seconds JAX spent tracing,
  lowering and compiling in the test's own process; and each worker's total, which includes start-up
  and collection); `python tests/cpu_table.py` turns that into docs/TESTING.md's table.
- The `slow` marker means "over SLOW_CPU_SECONDS of CPU". A test over it without the marker is listed
  at the end of the run ("CPU guard"); `--cpu-guard=fail` fails the run on one instead (the CPU varies
  2x between our machines, so the default only reports).
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

SLOW_CPU_SECONDS = 5.0
_KEY = "cpu_seconds"
_START = pytest.StashKey[dict]()  # `_snapshot()` when the test's protocol began


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    group = parser.getgroup("cpu time")
    group.addoption("--cpu-report", metavar="PATH", help="write each test's CPU seconds to PATH (JSON)")
    group.addoption(
        "--cpu-guard",
        choices=("report", "fail", "off"),
        default="report",
        help=f"unmarked tests over {SLOW_CPU_SECONDS:g} CPU-s: list them (report), fail the run (fail), or not",
    )


# Seconds this process spent in JAX's tracing, lowering and XLA compiles (wall time, summed by event):
# where a test's CPU goes, when it is not its own arithmetic.
_COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_compile_seconds = dict.fromkeys(_COMPILE_EVENTS.values(), 0.0)


def _on_event_duration(event: str, duration: float, **kwargs) -> None:
    name = _COMPILE_EVENTS.get(event)
    if name is not None:
        _compile_seconds[name] += duration


def _snapshot() -> dict:
    return {"cpu": cpu_seconds(), "wall": time.perf_counter(), **_compile_seconds}


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_START] = _snapshot()
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown" and _START in item.stash:  # before the teardown report copies the properties
        start, end = item.stash[_START], _snapshot()
        item.user_properties.append((_KEY, {k: round(end[k] - start[k], 3) for k in end}))
    yield


class _Collector:
    """On the controller (or a run without xdist): every test's figures and every worker's total."""

    def __init__(self, config):
        self.config = config
        self.rows: dict[str, dict] = {}
        self.workers: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":
            return
        for key, value in report.user_properties:
            if key == _KEY:
                self.rows[report.nodeid] = {"nodeid": report.nodeid, **value, "slow": "slow" in report.keywords}

    @pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: a run with -p no:xdist has none
    def pytest_testnodedown(self, node, error):  # pytest-xdist: a worker finished
        total = getattr(node, "workeroutput", {}).get("cpu_seconds")
        if total is not None:
            self.workers[node.gateway.id] = total

    def unmarked_slow(self) -> list[dict]:
        rows = [r for r in self.rows.values() if not r["slow"] and r["cpu"] > SLOW_CPU_SECONDS]
        return sorted(rows, key=lambda r: -r["cpu"])

    def pytest_sessionfinish(self, session):
        if not self.workers:  # no xdist: this process ran the tests
            self.workers["main"] = cpu_seconds()
        path = self.config.getoption("--cpu-report")
        if path:
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"tests": sorted(self.rows.values(), key=lambda r: r["nodeid"]), "workers": self.workers}, f)
        if self.config.getoption("--cpu-guard") == "fail" and self.unmarked_slow():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        mode = self.config.getoption("--cpu-guard")
        slow = self.unmarked_slow()
        if mode == "off" or not slow:
            return
        terminalreporter.section(f"CPU guard: unmarked tests over {SLOW_CPU_SECONDS:g} CPU-s (mark them slow)")
        for row in slow:
            terminalreporter.line(f"{row['cpu']:7.1f} s  {row['nodeid']}")


def pytest_configure(config):
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_on_event_duration)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(_Collector(config), "elmo_jax_cpu_collector")


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: its total goes to the controller
        session.config.workeroutput["cpu_seconds"] = cpu_seconds()
