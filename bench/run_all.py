"""The benchmark suite in one command: feature extraction and training throughput, compile time, peak
memory and achieved model FLOP/s against the device's matmul speed, as one markdown table.

    python bench/run_all.py --output=bench/results_cpu.md            # CPU: 8 cases, 5-10 minutes on 2 cores
    python bench/run_all.py --quick --output=/tmp/quick.md           # CPU: the two headline rows, ~1 minute
    python bench/run_all.py --output=bench/results_gpu.md            # the same command on a GPU or TPU host

The backend (cpu/gpu/tpu) is detected and picks the cases (`cases()`): on CPU the published small and
original shapes at 32x20 and 64x40 (feature extraction) and 32x20 / 64x20 (training, 50k vocabulary);
on an accelerator feature extraction at batch 64 and 512 and training at 256 rows per device with the
1B Word vocabulary (793,471), each in float32 and bfloat16.

Each case runs in a fresh child process (so compile time is the case's own, and peak memory is the
case's: the process's peak RSS on CPU, `device.memory_stats()['peak_bytes_in_use']` on GPU/TPU). The
child alternates --rounds times between one n^3 matmul and one timed call of the measured function, and
keeps the best of each: on a shared, noisy machine both sides then see the same quiet moments, which is
what the fraction needs. The timed function is the real `elmo_jax.embed` / jitted `train_step`, inputs
already on the device; compile time is the first call's time less the best call's.

Columns: tokens/s (embed: B x T; training: target tokens of both directions, 2 x B x T per step),
GFLOP/s of nominal model FLOPs (`elmo_jax.model.flops`: every char CNN position counted; training 3 x
forward), "of matmul" against the float32 (`Precision.HIGHEST`) or bfloat16 n^3 matmul measured in the
same child, and on GPU/TPU "of peak" against the published dense peak of the device kind
(`PUBLISHED_PEAKS`: bfloat16 for bfloat16 cases, float32 non-tensor-core for float32 ones; TPUs have
no separate float32 peak, so none is shown). "vs AllenNLP": AllenNLP 2.10's tokens/s at the same shape
on the 2-core CPU machine class of bench/RESULTS.md, where we have it.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/, configs/

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("output", "", "Write the markdown table here too (atomically); '' = print only.")
flags.DEFINE_bool("quick", False, "Only the headline cases (CPU: original embed 64x40, small train 32x20).")
flags.DEFINE_integer("rounds", 0, "Matmul/call alternations per case (0 = 5 on CPU, 10 on GPU/TPU; --quick 3).")
flags.DEFINE_integer("matmul_size", 0, "n of the reference n^3 matmul (0 = 4096 on CPU, 8192 on GPU/TPU).")
flags.DEFINE_list("only", [], "Run only cases whose name contains one of these strings, e.g. train,small.")
flags.DEFINE_integer("timeout", 1200, "Seconds allowed per case.")
flags.DEFINE_string("child", None, "Internal: run one case (JSON) in this process and print its result as JSON.")

# Published dense (no sparsity) peaks in FLOP/s by device kind substring, first match wins:
# (bfloat16 tensor core / MXU, float32 without TF32 or None). H100/H200: the SXM figures (989 TFLOP/s
# bf16, 67 fp32); A100: 312 / 19.5. TPUs publish no separate float32 peak (float32 at HIGHEST runs as
# several bf16 passes), so their float32 rows show the measured-matmul fraction only.
PUBLISHED_PEAKS = {
    "H200": (989e12, 67e12),
    "H100": (989e12, 67e12),
    "A100": (312e12, 19.5e12),
    "TPU v6 lite": (918e12, None),
    "TPU v6e": (918e12, None),
    "TPU v5 lite": (197e12, None),
    "TPU v5e": (197e12, None),
    "TPU v5p": (459e12, None),
    "TPU v5": (459e12, None),
    "TPU v4": (275e12, None),
}
# AllenNLP 2.10 (PyTorch, CPU) on the 2-core machine class: tokens/s of feature extraction (bench/RESULTS.md).
ALLENNLP_TOKENS_PER_S = {("embed", "small", 32, 20): 1350.0, ("embed", "original", 32, 20): 280.0}
LM1B_VOCAB_SIZE = 793_471
CPU_VOCAB_SIZE = 50_000
TRAIN_CONFIGS = {"small": "configs.bilm_small", "original": "configs.bilm_large"}


def cases(backend: str, quick: bool) -> list[dict]:
    """The cases this backend runs: dicts with kind (embed/train), size, B, T, dtype."""

    def case(kind, size, B, T, dtype="float32"):
        return {"kind": kind, "size": size, "B": B, "T": T, "dtype": dtype, "name": f"{kind} {size} {B}x{T} {dtype}"}

    if backend == "cpu":
        if quick:
            return [case("embed", "original", 64, 40), case("train", "small", 32, 20)]
        return [
            case("embed", "small", 32, 20),
            case("embed", "small", 64, 40),
            case("embed", "original", 32, 20),
            case("embed", "original", 64, 40),
            case("embed", "original", 64, 40, "bfloat16"),
            case("train", "small", 32, 20),
            case("train", "small", 64, 20),
            case("train", "original", 32, 20),
        ]
    dtypes = ("bfloat16",) if quick else ("bfloat16", "float32")
    out = []
    for dtype in dtypes:
        out += [case("embed", "original", B, 40, dtype) for B in ((512,) if quick else (64, 512))]
        out += [case("train", size, 256, 20, dtype) for size in (("original",) if quick else ("small", "original"))]
    return out


def published_peak(device_kind: str, dtype: str) -> float | None:
    for kind, (bf16, f32) in PUBLISHED_PEAKS.items():
        if kind.lower() in device_kind.lower():
            return bf16 if dtype == "bfloat16" else f32
    return None


# ---------------------------------------------------------------------------------------------- child


def _matmul_fn(n: int, dtype: str):
    """A compiled n^3 product at the model code's precision (float32: HIGHEST), and its operand."""
    import jax
    import jax.numpy as jnp

    precision = jax.lax.Precision.HIGHEST if dtype == "float32" else jax.lax.Precision.DEFAULT
    a = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, precision=precision, preferred_element_type=jnp.float32))
    f(a, a).block_until_ready()
    return lambda: f(a, a).block_until_ready()


def _embed_case(c: dict):
    """(call, flops per call, tokens per call, content bucket) of `embed` on random words."""
    import jax

    import elmo_jax
    from bench.workloads import word_batch
    from elmo_jax.model.flops import embed_flops

    params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(c["size"]), jax.random.key(0))
    ids = jax.device_put(word_batch(c["B"], c["T"]))
    call = lambda: jax.block_until_ready(elmo_jax.embed(params, ids, compute_dtype=c["dtype"]))
    return call, embed_flops(params.config, c["B"], c["T"]), c["B"] * c["T"]


def _train_case(c: dict, backend: str):
    """(call, flops per step, tokens per step) of the jitted `train_step` on one synthetic window."""
    import dataclasses
    import importlib

    import jax

    from bench.workloads import synthetic_window
    from elmo_jax.model.flops import train_flops
    from elmo_jax.training import settings
    from elmo_jax.training.batch_feed import device_batch
    from elmo_jax.training.train_step import init_train_state, train_step

    config = importlib.import_module(TRAIN_CONFIGS[c["size"]]).get_config()
    vocab_size = CPU_VOCAB_SIZE if backend == "cpu" else LM1B_VOCAB_SIZE
    cfg = settings.step_config(config, vocab_size)
    cfg = dataclasses.replace(cfg, unroll_steps=c["T"], compute=dataclasses.replace(cfg.compute, dtype=c["dtype"]))
    optimizer = settings.optimizer(config)
    state = init_train_state(jax.random.key(0), cfg, optimizer, c["B"])
    C = cfg.model.max_characters_per_token
    batch, positions = device_batch(synthetic_window(c["B"], c["T"], C, vocab_size), C)
    batch = jax.device_put(batch)
    holder = [state]

    def call():  # the state is donated: each step consumes the previous one's
        holder[0], metrics = train_step(holder[0], batch, cfg=cfg, optimizer=optimizer, content_positions=positions)
        jax.block_until_ready((holder[0], metrics))

    flops = train_flops(cfg.model, c["B"], c["T"], vocab_size=vocab_size, n_negative_samples=cfg.n_negative_samples)
    return call, flops, 2 * c["B"] * c["T"]


def run_child(spec: str) -> dict:
    """Times one case in this process; see the module docstring."""
    import jax

    c = json.loads(spec)
    backend = jax.default_backend()
    start = time.perf_counter()
    call, flops, tokens = _embed_case(c) if c["kind"] == "embed" else _train_case(c, backend)
    setup_s = time.perf_counter() - start
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    matmul = _matmul_fn(c["matmul_size"], c["dtype"])
    best_call = best_matmul = float("inf")
    for _ in range(c["rounds"]):
        start = time.perf_counter()
        matmul()
        best_matmul = min(best_matmul, time.perf_counter() - start)
        start = time.perf_counter()
        call()
        best_call = min(best_call, time.perf_counter() - start)
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    peak = (
        stats.get("peak_bytes_in_use")
        if backend != "cpu"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {
        **c,
        "backend": backend,
        "device_kind": device.device_kind,
        "setup_s": setup_s,
        "compile_s": first - best_call,
        "call_s": best_call,
        "flops": flops,
        "tokens": tokens,
        "matmul_flops_per_s": 2 * c["matmul_size"] ** 3 / best_matmul,
        "peak_bytes": peak,
    }


# --------------------------------------------------------------------------------------------- parent


def table(rows: list[dict], accelerator: bool) -> list[str]:
    """Markdown table rows of the results."""
    head = ["case", "tokens/s", "step ms", "compile s", "peak GiB", "model GFLOP/s", "matmul GFLOP/s", "of matmul"]
    head += ["of peak"] if accelerator else []
    head += ["vs AllenNLP"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error']} |" + " |" * (len(head) - 2))
            continue
        achieved = r["flops"] / r["call_s"]
        tokens_per_s = r["tokens"] / r["call_s"]
        cells = [
            r["name"],
            f"{tokens_per_s:,.0f}",
            f"{1e3 * r['call_s']:,.1f}",
            f"{r['compile_s']:.1f}",
            f"{r['peak_bytes'] / 2**30:.2f}" if r["peak_bytes"] else "-",
            f"{achieved / 1e9:,.1f}",
            f"{r['matmul_flops_per_s'] / 1e9:,.1f}",
            f"{achieved / r['matmul_flops_per_s']:.1%}",
        ]
        if accelerator:
            peak = published_peak(r["device_kind"], r["dtype"])
            cells.append(f"{achieved / peak:.1%}" if peak else "-")
        ref = ALLENNLP_TOKENS_PER_S.get((r["kind"], r["size"], r["B"], r["T"]))
        cells.append(f"{tokens_per_s / ref:.2f}x" if ref and r["backend"] == "cpu" else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv):
    del argv
    if FLAGS.child:
        print(json.dumps(run_child(FLAGS.child)))
        return
    import jax

    from bench.common import platform_line

    backend = jax.default_backend()
    accelerator = backend != "cpu"
    rounds = FLAGS.rounds or (3 if FLAGS.quick else 5 if backend == "cpu" else 10)
    matmul_size = FLAGS.matmul_size or (4096 if backend == "cpu" else 8192)
    todo = [c for c in cases(backend, FLAGS.quick) if not FLAGS.only or any(s in c["name"] for s in FLAGS.only)]
    if not todo:
        raise app.UsageError(f"--only={','.join(FLAGS.only)}: matches none of the {backend} cases")
    device_kind = jax.devices()[0].device_kind
    header = [
        f"# elmo-jax benchmark suite: {backend}",
        "",
        f"`python bench/run_all.py{' --quick' if FLAGS.quick else ''}`, {time.strftime('%Y-%m-%d %H:%M')}; "
        f"{platform_line()}; {device_kind}; {os.cpu_count()} host CPUs; Python {platform.python_version()}; "
        f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
    ]
    print("\n".join(header), flush=True)
    rows = []
    for c in todo:
        c = {**c, "rounds": rounds, "matmul_size": matmul_size}
        start = time.perf_counter()
        try:
            result = subprocess.run(
                [sys.executable, __file__, f"--child={json.dumps(c)}"],
                capture_output=True,
                text=True,
                timeout=FLAGS.timeout,
            )
            if result.returncode != 0:
                raise RuntimeError(
                    result.stderr.strip().splitlines()[-1]
                    if result.stderr.strip()
                    else f"exit status {result.returncode}"
                )
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            rows.append({**c, "error": str(e)[:200]})
        print(f"  {c['name']}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    peaks = "; ".join(
        f"{k} {v[0] / 1e12:g} bf16" + (f" / {v[1] / 1e12:g} fp32" if v[1] else "") for k, v in PUBLISHED_PEAKS.items()
    )
    notes = [
        "",
        f"Reference matmul: {matmul_size}^3 in the case's dtype (float32 at Precision.HIGHEST), best of "
        f"{rounds}, alternating with the {rounds} timed calls of the same child process.",
        "Model FLOPs: elmo_jax.model.flops (nominal: every char CNN position; training = 3 x forward, sampled "
        f"softmax with 8192 negatives, vocabulary {CPU_VOCAB_SIZE if backend == 'cpu' else LM1B_VOCAB_SIZE:,}).",
        "Peak memory: "
        + (
            "peak RSS of the case's process (JAX runtime, weights, optimiser state, buffers)."
            if backend == "cpu"
            else "device peak_bytes_in_use of the case's process."
        ),
        *([f"Published dense peaks (TFLOP/s): {peaks}."] if accelerator else []),
        f"Load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}.",
    ]
    text = "\n".join(header + table(rows, accelerator) + notes) + "\n"
    print("\n".join(table(rows, accelerator) + notes))
    if FLAGS.output:
        from elmo_jax.storage.atomic import write_text

        write_text(FLAGS.output, text)
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
