"""Does the full `bilm_large` train step fit? XLA's per-device memory plan on a mesh of fake devices.

    python bench/compile_memory.py                               # 1, 8 and 256 devices, the meshes below
    python bench/compile_memory.py --cases=8:4x2,8:1x8           # devices:data x model

Each case runs in a child process with XLA_FLAGS=--xla_force_host_platform_device_count=N (XLA reads it
once per process), builds the real jitted train step of configs/bilm_large.py (the original model, the
793,471-word 1B Word vocabulary padded to 793,600 rows, 128 rows per data shard x 20 steps, 8192
sampled negatives) with `jitted_steps.jit_steps`, and compiles it from ShapeDtypeStructs carrying the
shardings: `.lower(...).compile()`, nothing allocated. It prints the bytes one device needs according to
`compiled.memory_analysis()`: arguments (the train state and the batch), outputs, the part of the
outputs that reuses the donated state's buffers, temporaries, and their total (arguments + outputs -
aliased + temporaries). The char CNN is compiled for all 50 character positions (the worst bucket)
unless --content_positions says otherwise.

These are the CPU backend's plans: TPU and GPU compilers fuse and schedule differently, so treat them as
estimates of the same program; the parameters and optimiser state are exact.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "cases",
    ["1:1x1", "4:4x1", "4:2x2", "8:8x1", "8:4x2", "8:2x4", "8:1x8", "256:256x1", "256:64x4", "256:32x8"],
    "devices:data x model meshes to compile.",
)
flags.DEFINE_integer("rows_per_shard", 128, "Batch rows per data shard (bilm-tf: 128 per GPU).")
flags.DEFINE_integer("vocab_size", 793_471, "Vocabulary size (bilm-tf's 1B Word vocabulary).")
flags.DEFINE_integer(
    "content_positions",
    0,
    "Char CNN positions compiled for (0: all 50, the worst bucket; 1B Word batches are mostly in the 24 or 32 bucket).",
)
flags.DEFINE_integer("timeout", 3600, "Seconds allowed per case.")
flags.DEFINE_string("child", None, "Internal: compile one case (devices:data x model) in this process.")

GIB = 2**30


def compile_case(case: str) -> dict:
    """Compiles the train step for one mesh in this process (which must have the devices)."""
    import jax
    import numpy as np

    from configs import bilm_large
    from elmo_jax.training import jitted_steps, settings, sharding

    devices, mesh_shape = case.split(":")
    data, model = (int(x) for x in mesh_shape.split("x"))
    config = bilm_large.get_config()
    batch_size = FLAGS.rows_per_shard * data
    cfg = settings.step_config(config, FLAGS.vocab_size)
    optimizer = settings.optimizer(config)
    mesh = sharding.make_mesh(data, model)
    sharding.check_training_mesh(mesh, batch_size, jax.process_count())
    start = time.perf_counter()
    steps = jitted_steps.jit_steps(mesh, cfg, optimizer, batch_size)
    batch = steps.abstract_batch(cfg)
    lowered = steps.train.lower(steps.abstract_state, batch, FLAGS.content_positions or None)
    lowered_s = time.perf_counter() - start
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start - lowered_s
    m = compiled.memory_analysis()
    state_bytes = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in jax.tree.leaves(steps.abstract_state))
    total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    return {
        "devices": int(devices),
        "mesh": [data, model],
        "batch_size": batch_size,
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "total": total,
        "global_state": state_bytes,
        "lower_s": round(lowered_s, 1),
        "compile_s": round(compile_s, 1),
    }


def run_case(case: str) -> dict:
    """`compile_case` in a child process with the case's device count."""
    devices = int(case.split(":")[0])
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    start = time.perf_counter()
    try:
        result = subprocess.run(
            [
                sys.executable,
                __file__,
                f"--child={case}",
                f"--rows_per_shard={FLAGS.rows_per_shard}",
                f"--vocab_size={FLAGS.vocab_size}",
                f"--content_positions={FLAGS.content_positions}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=FLAGS.timeout,
        )
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"timed out after {FLAGS.timeout} s"}
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        return {"case": case, "error": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no output"}
    return {**json.loads(lines[-1]), "child_s": round(time.perf_counter() - start, 1)}


def main(argv):
    del argv
    if FLAGS.child:
        print(json.dumps(compile_case(FLAGS.child)), flush=True)
        return
    print(
        f"bilm_large train step, vocabulary {FLAGS.vocab_size:,}, {FLAGS.rows_per_shard} rows per data shard x 20 "
        f"steps, char CNN over {FLAGS.content_positions or 50} positions; XLA CPU memory plan per device (GiB)"
    )
    print(
        "| devices | mesh (data x model) | global batch | arguments | outputs | aliased | temporaries | total "
        "| compile s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for case in FLAGS.cases:
        r = run_case(case)
        if "error" in r:
            print(f"| {case} | error: {r['error']} |", flush=True)
            continue
        gib = lambda key, r=r: f"{r[key] / GIB:.2f}"
        print(
            f"| {r['devices']} | {r['mesh'][0]} x {r['mesh'][1]} | {r['batch_size']} | {gib('arguments')} | "
            f"{gib('outputs')} | {gib('aliased')} | {gib('temporaries')} | **{gib('total')}** | "
            f"{r['lower_s'] + r['compile_s']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    app.run(main)
