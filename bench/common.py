"""What the benchmarks share: the machine's measured matmul throughput and a one-line platform description.

Run the scripts from anywhere (`python bench/<name>.py`); each puts the repository root on `sys.path`
first, so `bench.common` and `configs` import without installing anything beyond `elmo_jax`.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp


def matmul_throughput(n: int = 4096, repeats: int = 5, dtype: str = "float32") -> float:
    """Best FLOP/s of an n x n x n product on the default device.

    float32 runs at full precision (`Precision.HIGHEST`: no TF32/bf16 passes on GPU/TPU), which is the
    ceiling float32 model code can reach; bfloat16 runs at the default precision (bf16 inputs, f32
    accumulation), the ceiling of `compute_dtype="bfloat16"`.
    """
    precision = jax.lax.Precision.HIGHEST if dtype == "float32" else jax.lax.Precision.DEFAULT
    a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, precision=precision, preferred_element_type=jnp.float32))
    f(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f(a, a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def platform_line() -> str:
    """E.g. "jax 0.6.2 on cpu x1 (cpu)": the version, the default device kind, the device count, the backend."""
    return f"jax {jax.__version__} on {jax.devices()[0].device_kind} x{jax.device_count()} ({jax.default_backend()})"


def train_demo(workdir: str, overrides: dict, devices: int = 1) -> None:
    """`python train.py --config=configs/demo.py --workdir=WORKDIR --config.KEY=VALUE ...` in a process of
    its own (on `devices` forced CPU devices when more than 1), its output in WORKDIR.log; raises
    CalledProcessError when it fails. The export leaves out extractor.jax."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    if devices > 1:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    values = {"export_extractor": False, **overrides}
    args = [sys.executable, os.path.join(repo, "train.py"), "--config=" + os.path.join(repo, "configs", "demo.py")]
    args += [f"--workdir={workdir}"] + [f"--config.{key}={value}" for key, value in values.items()]
    with open(workdir + ".log", "w") as log:
        subprocess.run(args, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=repo)
