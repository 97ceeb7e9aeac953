"""Do the notebooks' train steps fit a single-chip Colab TPU? The TPU compiler's per-chip memory plan, no TPU needed.

    python3 -m venv .venv-tpu && .venv-tpu/bin/pip install 'jax[tpu]==0.10.2' && .venv-tpu/bin/pip install -e .
    .venv-tpu/bin/python bench/notebook_tpu_sizes.py                       # every case below
    .venv-tpu/bin/python bench/notebook_tpu_sizes.py --topologies=v5e:1x1 --cases=train_bilm_lm1b

For each TPU topology (v5e:1x1 and v6e:1x1: Colab's v5e-1 and v6e-1 runtimes) and each case (the config
a notebook trains with on a TPU, from configs/notebooks.py, with the vocabulary size it meets), this
builds the real jitted train step (`training.jitted_steps.jit_steps`, the notebook's mesh) on the devices
of `jax.experimental.topologies.get_topology_desc(topology, platform="tpu")` and compiles it from
ShapeDtypeStructs: `.lower(...).compile()` by libtpu's compiler, nothing allocated, no TPU attached.
`compiled.memory_analysis()` gives the bytes one chip needs: arguments (the train state and the batch),
outputs, the part of the outputs that reuses the donated state, temporaries, and their total. The char
CNN is compiled for all 50 character positions (the worst bucket). Each case runs in its own process.

HBM per chip: v5e 16 GiB, v6e 32 GiB (Google Cloud's TPU v5e and v6e pages).
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

# case -> (notebooks, configs/notebooks.py function and arguments, vocabulary size it trains with)
CASES = {
    "train_bilm_default_corpus": ("train_bilm", "train_bilm", {"lm1b": False}, 14_682),
    "train_bilm_lm1b": ("train_bilm", "train_bilm", {"lm1b": True}, 793_471),
    "demo_bilm": ("elmo_features (no model given), domain_finetuning", "demo_bilm", {}, 14_682),
}
HBM_GIB = {"v5e": 16, "v6e": 32}
GIB, MIB = 2**30, 2**20

FLAGS = flags.FLAGS
flags.DEFINE_list("topologies", ["v5e:1x1", "v6e:1x1"], "TPU topologies (get_topology_desc names).")
flags.DEFINE_list("cases", list(CASES), f"Cases: {', '.join(CASES)}.")
flags.DEFINE_integer("timeout", 1800, "Seconds allowed per case.")
flags.DEFINE_string("child", None, "Internal: compile one TOPOLOGY/CASE in this process.")


def compile_case(topology: str, case: str) -> dict:
    """Compiles one case's train step for `topology` in this process; returns its memory plan."""
    import jax
    from jax.experimental import topologies

    from configs import notebooks
    from elmo_jax.training import jitted_steps, settings, sharding

    _, function, kwargs, vocab_size = CASES[case]
    # One host holds the whole (single-chip) slice, as on a Colab runtime; libtpu's default host is 2x2.
    bounds = (1, 1, 1) if topology.endswith(":1x1") else (2, 2, 1)
    devices = topologies.get_topology_desc(topology_name=topology, platform="tpu", chips_per_host_bounds=bounds).devices
    config = getattr(notebooks, function)("tpu", len(devices), **kwargs)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model, devices=devices)
    sharding.check_training_mesh(mesh, config.batch_size, 1)
    cfg = settings.step_config(config, vocab_size)
    start = time.perf_counter()
    steps = jitted_steps.jit_steps(mesh, cfg, settings.optimizer(config), config.batch_size)
    batch = steps.abstract_batch(cfg)
    compiled = steps.train.lower(steps.abstract_state, batch, None).compile()
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    return {
        "topology": topology,
        "case": case,
        "device_kind": devices[0].device_kind,
        "chips": len(devices),
        "mesh": dict(mesh.shape),
        "batch_size": config.batch_size,
        "unroll_steps": cfg.unroll_steps,
        "vocab_size": vocab_size,
        "negatives": config.n_negative_samples,
        "model": {"lstm_dim": cfg.model.lstm_dim, "projection_dim": cfg.model.projection_dim},
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "total": total,
        "compile_s": round(time.perf_counter() - start, 1),
        "versions": {"jax": jax.__version__, "libtpu": _version("libtpu")},
    }


def _version(package: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run_case(topology: str, case: str) -> dict:
    """`compile_case` in a child process (libtpu keeps per-process state; one compile at a time)."""
    # No TPU is attached: the topology's devices are only compile targets, so libtpu's one-process-per-host
    # lock file (/tmp/libtpu_lockfile) need not be taken, and another compile may run beside this one.
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    try:
        result = subprocess.run(
            [sys.executable, __file__, f"--child={topology}/{case}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=FLAGS.timeout,
        )
    except subprocess.TimeoutExpired:
        return {"topology": topology, "case": case, "error": f"timed out after {FLAGS.timeout} s"}
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        tail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no output"
        return {"topology": topology, "case": case, "error": tail}
    return json.loads(lines[-1])


def main(argv):
    del argv
    if FLAGS.child:
        topology, case = FLAGS.child.split("/")
        print(json.dumps(compile_case(topology, case)), flush=True)
        return
    unknown = sorted(set(FLAGS.cases) - set(CASES))
    if unknown:
        raise app.UsageError(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    print("TPU compiler's memory plan per chip (MiB); char CNN over all 50 positions; HBM: v5e 16 GiB, v6e 32 GiB")
    print(
        "| topology | case (notebooks) | model H/P | batch x T | vocabulary | arguments | temporaries | total | HBM |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for topology in FLAGS.topologies:
        for case in FLAGS.cases:
            r = run_case(topology, case)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if "error" in r:
                print(f"| {topology} | {case} | error: {r['error']} |", flush=True)
                continue
            hbm = HBM_GIB.get(topology.split(":")[0])
            share = f"{100 * r['total'] / (hbm * GIB):.1f}%" if hbm else "?"
            print(
                f"| {topology} | {case} ({CASES[case][0]}) | {r['model']['lstm_dim']}/{r['model']['projection_dim']} "
                f"| {r['batch_size']} x {r['unroll_steps']} | {r['vocab_size']:,} | {r['arguments'] / MIB:,.0f} "
                f"| {r['temporaries'] / MIB:,.0f} | **{r['total'] / MIB:,.0f}** | {share} |",
                flush=True,
            )


if __name__ == "__main__":
    app.run(main)
