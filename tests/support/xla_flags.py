"""`XLA_FLAGS` of the test processes: the forced CPU devices, and compile settings chosen by what the
running XLA accepts.

XLA reads `XLA_FLAGS` when its first backend starts and ends the process on a flag it does not know
(`Unknown flag in XLA_FLAGS`), and flags come and go between jaxlib releases: 0.6.0 and 0.10.2 know
`--xla_cpu_use_fusion_emitters`, 0.12.1 refuses it. So each compile setting is probed once per test
session, in a small process that starts XLA's CPU client with it (jaxlib alone, ~0.15 CPU-s), and the
answer is kept in the environment, which every pytest-xdist worker and every command a test starts
inherits. Imports nothing of jax: conftest sets `XLA_FLAGS` before anything does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence

# XLA compiles are most of the suite's CPU time (docs/TESTING.md): hundreds of small programs, each
# run for microseconds. These settings make them cheaper without changing what XLA computes:
# - LLVM at -O0 (a cold configs/tiny.py training run: 26 s of CPU at the default level, 14 s at 0);
# - fusions emitted by XLA's older elemental IR emitter instead of the MLIR fusion emitters, which build
#   an MLIR context and pass pipeline per fusion (embed of a new shape: 1.2 s of CPU against 0.8 s).
# Every tolerance test passes with and without each (the same HLO, the same operations per element).
# Every process of a test session uses the same ones: in-process results are compared bit for bit with
# those of the commands the tests start.
COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")

# The settings this session's XLA accepts, space-separated (empty: none); set by the first process.
CHOSEN_VARIABLE = "ELMO_JAX_TEST_XLA_COMPILE_FLAGS"

# Starts XLA's CPU client, which parses XLA_FLAGS; through jax where jaxlib has no make_cpu_client.
_PROBE = """
try:
    from jaxlib.xla_client import make_cpu_client
except ImportError:
    import jax
    make_cpu_client = jax.devices
make_cpu_client()
"""

_REFUSED = "Unknown flag in XLA_FLAGS"


def xla_accepts(flag: str) -> bool:
    """Whether the running jaxlib's XLA starts with `flag` as its `XLA_FLAGS` (one small process).

    Raises:
      RuntimeError: the probe failed for another reason than the flag (its last line of stderr).
    """
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return True
    if _REFUSED in result.stderr:
        return False
    last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise RuntimeError(f"probing XLA_FLAGS={flag}: exit {result.returncode} not caused by the flag: {last}")


def compile_flags(accepts: Callable[[str], bool] = xla_accepts, candidates: Sequence[str] = COMPILE_FLAGS) -> str:
    """The `candidates` the running XLA accepts, space-separated: probed with `accepts` on the session's
    first call, then read from `CHOSEN_VARIABLE`."""
    if CHOSEN_VARIABLE not in os.environ:
        os.environ[CHOSEN_VARIABLE] = " ".join(flag for flag in candidates if accepts(flag))
    return os.environ[CHOSEN_VARIABLE]


def xla_flags(devices: int) -> str:
    """`XLA_FLAGS` of a test process: `devices` forced CPU devices, the compile settings XLA accepts."""
    return f"--xla_force_host_platform_device_count={devices} {compile_flags()}".rstrip()
