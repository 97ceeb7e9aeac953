"""The first thing to run on a real TPU or GPU VM: measured train-step times beside the compiler-side estimates.

    pip install -e '.[tpu]'
    python bench/tpu_first_run.py                         # every train case of the results table this slice runs
    python bench/tpu_first_run.py --cases=v5e-8/large/bfloat16/8x1/1024 --steps=20
    pip install -e . 'jax[cuda12]'                        # an NVIDIA GPU VM (docs/GPU.md)
    python bench/tpu_first_run.py --estimates=bench/results_gpu_compile.jsonl
    python bench/tpu_first_run.py --smoke                 # CPU, configs/tiny.py, seconds: checks the script

bench/tpu_compile.py estimated each case's step without the accelerator (bench/RESULTS_tpu_compile.md,
bench/RESULTS_gpu_compile.md): the roofline (the larger of FLOP time and HBM time, scatter reads counted),
the serial per-kernel roofline and the compiler's own per-kernel estimate. This script runs the same train
step (`jitted_steps.jit_steps` on the case's mesh, the config's model and optimiser, bilm-tf's 1B Word
vocabulary of 793,471 words, the char CNN at the case's 24 positions) on the devices it finds: for every
current row of the results file (--estimates) whose device type (`device_kind`, `accelerators.same_kind`)
and device count match this machine, smallest batch first, it initialises a state, builds one window of
random sentences (`bench.workloads.synthetic_window`), runs --warmup steps (the first compiles), then
times --steps steps one by one (each waited for) and prints the median and best step time beside the
three estimates, with the measured util. (FLOP time at the chip's peak / measured time). It starts no case
after --minutes (the whole run stays near that), and a case that fails (out of memory) is a line saying
so. Each case is also a JSON line in --output, so the first real run calibrates the estimates (which of
them predicts a step time, and by how much it is off).

On a GPU the step runs as JAX compiles it there (Triton and cuBLAS GEMMs autotuned); its rows' estimates
are of the cuBLAS program, and the Triton-GEMM program's estimate (the variant "triton", untuned tiles)
is printed beside them. `XLA_FLAGS=--xla_gpu_enable_triton_gemm=false` times the cuBLAS program itself.
JAX lets a GPU process take 75% of its memory by default; this script raises that to 95%
(XLA_PYTHON_CLIENT_MEM_FRACTION, unless set), as the rows' memory plans are judged against the whole.

--smoke runs configs/tiny.py, cut to one LSTM layer, two filters, no highway layer and 4 x 2 windows of
random 4-letter words, its 100-word softmax updated densely, on the default device (CPU) with a 1 x 1
mesh: no estimates to compare with, but the rest of the script runs (tests/test_tpu_first_run.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/, configs/

from absl import app, flags  # noqa: E402

from bench import accelerators, tpu_compile  # noqa: E402  (tpu_compile defines --cases and --positions, used here too)

FLAGS = flags.FLAGS


def define_flags() -> None:
    """This script's own flags (defined when it runs, not when a test imports it)."""
    flags.DEFINE_string("estimates", str(REPO / "bench" / "results_tpu_compile.jsonl"), "bench/tpu_compile.py's rows.")
    flags.DEFINE_integer("warmup", 2, "Untimed steps first (the first one compiles).")
    flags.DEFINE_integer("steps", 10, "Timed steps.")
    flags.DEFINE_string(
        "output", str(REPO / "bench" / "out" / "tpu_first_run.jsonl"), "Append a JSON line per case here ('': none)."
    )
    flags.DEFINE_bool("smoke", False, "CPU smoke run: configs/tiny.py cut smaller, 1 x 1 mesh, 4 rows, no estimates.")
    flags.DEFINE_float("minutes", 9.0, "Start no case after this many minutes (0: no limit).")


@dataclasses.dataclass(frozen=True)
class Options:
    cases: tuple[str, ...] = ()  # default: every train case of `estimates` that fits this machine
    estimates: str = str(REPO / "bench" / "results_tpu_compile.jsonl")
    warmup: int = 2
    steps: int = 10
    positions: int = 24  # the char CNN's positions, as bench/tpu_compile.py compiles
    output: str = ""
    smoke: bool = False
    minutes: float = 0.0  # start no case after this long (0: no limit)


SMOKE_CASE = "smoke/tiny/float32/1x1/4"


def load_rows(path: str) -> list[dict]:
    """The current row of each case in a results file (bench/tpu_compile.py's choice), or [] if none."""
    p = pathlib.Path(path)
    if not p.exists():
        return []
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return tpu_compile.current_rows([r for r in rows if "error" not in r])


def estimates(row: dict | None) -> dict:
    """The three estimated step times of a results row (ms; None where the row lacks one) and its FLOP time."""
    if row is None:
        return {"roofline_ms": None, "serial_ms": None, "estimated_ms": None, "flop_ms": None}
    x = tpu_compile.roofline(row)
    return {
        "roofline_ms": x["scatter_step_ms"] if x["scatter_step_ms"] is not None else x["step_ms"],
        "serial_ms": x["serial_ms"],
        "estimated_ms": x["estimated_ms"],
        "flop_ms": x["flop_ms"],
    }


def runnable_cases(rows: list[dict], device_kind: str, n_devices: int) -> list[str]:
    """Train cases (not the feature extractor's, nor the Triton-GEMM variant of a GPU row: the same step) of
    rows compiled for this device type and count, smallest batch first."""
    cases = [
        r["case"]
        for r in rows
        if accelerators.same_kind(r.get("device_kind", ""), device_kind)
        and r.get("chips") == n_devices
        and r["case"].split("/")[1] != "embed"
        and not r["case"].endswith("/triton")
    ]
    return sorted(cases, key=lambda c: (tpu_compile.Case.parse(c).batch, c.split("/")[1] != "small"))


def time_case(case_name: str, o: Options, row: dict | None = None) -> dict:
    """Runs a case's train step: compile and warm-up, then `o.steps` timed steps; their times in seconds.

    The char CNN runs on the distinct-token slots the estimate was compiled for (`row`'s distinct_slots)
    when the window's distinct tokens fit in them (the same program), else on the window's own bucket
    (`batch_feed.distinct_bucket`, as the trainer would); "every_token" cases on every token.
    """
    import jax

    from elmo_jax.training import jitted_steps, settings, sharding
    from elmo_jax.training.batch_feed import distinct_bucket

    if o.smoke:
        case, module, vocab_size = tpu_compile.Case("v5e-1", "tiny", "float32", 1, 1, 4), "configs.tiny", 100
    else:
        case = tpu_compile.Case.parse(case_name)
        module, vocab_size = tpu_compile.WORKLOADS[case.workload], tpu_compile.LM1B_VOCAB_SIZE
    config = importlib.import_module(module).get_config()
    if o.smoke:  # smaller still than configs/tiny.py: its compiles are most of the smoke run's time
        config.model.filters, config.model.n_highway, config.model.n_layers = ((1, 4), (2, 4)), 0, 1
        config.unroll_steps = 2
    config.compute_dtype = case.dtype
    # The smoke run updates its 100-word softmax densely: a smaller program to compile.
    variant = {"sparse_softmax_update": False} if o.smoke else tpu_compile.VARIANTS.get(case.variant, {})
    cfg = dataclasses.replace(settings.step_config(config, vocab_size), **variant)
    mesh = sharding.make_mesh(case.data, case.model, jax.devices()[: case.data * case.model])
    steps = jitted_steps.jit_steps(mesh, cfg, settings.optimizer(config), case.batch)
    start = time.perf_counter()
    state = steps.init(jax.random.key(0), None, None)
    host_batch = _smoke_batch(cfg, case.batch) if o.smoke else _window(cfg, case.batch)
    slots = None
    if config.distinct_tokens and case.variant != "every_token":
        slots = distinct_bucket(host_batch, steps.local_token_shards)
        estimated = (row or {}).get("distinct_slots")
        slots = estimated if estimated is not None and slots is not None and slots <= estimated else slots
    batch = jax.device_put(host_batch, steps.batch)
    positions = min(o.positions, cfg.model.max_characters_per_token)
    times, first = [], None
    for k in range(o.warmup + o.steps):
        t = time.perf_counter()
        state, metrics = steps.train(state, batch, positions, slots)
        jax.block_until_ready((state, metrics))
        first = time.perf_counter() - start if first is None else first
        if k >= o.warmup:
            times.append(time.perf_counter() - t)
    return {"first_s": first, "step_s": times, "tokens": 2 * case.batch * cfg.unroll_steps, "distinct_slots": slots}


def _window(cfg, rows: int) -> dict:
    """One window of both directions of random sentences, as training feeds it (`device_batch`)."""
    from bench.workloads import synthetic_window
    from elmo_jax.training.batch_feed import device_batch

    C = cfg.model.max_characters_per_token
    return device_batch(synthetic_window(rows, cfg.unroll_steps, C, cfg.vocab_size), C)[0]


def _smoke_batch(cfg, rows: int) -> dict:
    """A random window (words of 4 characters) without the data pipeline, for the smoke run."""
    import numpy as np

    from elmo_jax.model.chars import BOW_CHAR, EOW_CHAR, PAD_CHAR

    rng = np.random.default_rng(0)
    D, T, C = 2, cfg.unroll_steps, cfg.model.max_characters_per_token
    char_ids = np.full((D, rows, T, C), PAD_CHAR, np.int32)
    char_ids[..., 0], char_ids[..., 5] = BOW_CHAR, EOW_CHAR
    char_ids[..., 1:5] = rng.integers(0, 256, (D, rows, T, 4))
    return {
        "char_ids": char_ids,
        "targets": rng.integers(0, cfg.vocab_size, (D, rows, T)).astype(np.int32),
        "mask": np.ones((D, rows, T), bool),
        "carry": np.zeros((D, rows), bool),
        "reset": np.zeros((D, rows, T), bool),
    }


def report(case_name: str, measured: dict, row: dict | None, device_kind: str, triton: dict | None = None) -> dict:
    """One case's JSON line: measured times and the estimates of its results row (and of its Triton-GEMM
    variant's row on a GPU, `triton`), all in ms."""
    median_ms = 1e3 * statistics.median(measured["step_s"])
    e = estimates(row)
    ratio = lambda ms: None if ms is None else median_ms / ms  # noqa: E731
    return {
        "case": case_name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device_kind": device_kind,
        "revision": _revision(),
        "estimates_revision": row.get("revision") if row else None,
        "steps": len(measured["step_s"]),
        "first_step_s": measured["first_s"],
        "median_ms": median_ms,
        "best_ms": 1e3 * min(measured["step_s"]),
        "tokens_per_s": measured["tokens"] / (median_ms / 1e3),
        "distinct_slots": measured["distinct_slots"],  # per device; None: the char CNN over every token
        **e,
        "measured_util": None if e["flop_ms"] is None else e["flop_ms"] / median_ms,
        "measured_over_roofline": ratio(e["roofline_ms"]),
        "measured_over_serial": ratio(e["serial_ms"]),
        "measured_over_estimated": ratio(e["estimated_ms"]),
        "estimated_triton_ms": estimates(triton)["estimated_ms"],
    }


def line(r: dict) -> str:
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    return (
        f"| {r['case']} | {r['median_ms']:.2f} | {r['best_ms']:.2f} | {r['tokens_per_s']:,.0f} | "
        f"{f(r['roofline_ms'], '.2f')} | {f(r['serial_ms'], '.2f')} | {f(r['estimated_ms'], '.2f')} | "
        f"{f(r['measured_util'], '.1%')} | {f(r['measured_over_estimated'], '.2f')} | "
        f"{f(r.get('estimated_triton_ms'), '.2f')} |"
    )


HEAD = (
    "| case | measured ms (median) | best ms | tokens/s | roofline ms | serial ms | compiler-estimated ms | "
    "measured util. | measured / estimated | estimated ms, Triton GEMMs (GPU) |\n" + "|---" * 10 + "|"
)


def run(o: Options) -> list[dict]:
    """Every case this machine runs (prints the table) and the JSON lines (also appended to o.output)."""
    import jax

    device_kind = "cpu (smoke)" if o.smoke else jax.devices()[0].device_kind
    rows = {r["case"]: r for r in load_rows(o.estimates)}
    if o.smoke:
        cases = [SMOKE_CASE]
    else:
        cases = list(o.cases) or runnable_cases(list(rows.values()), device_kind, jax.device_count())
    if not cases:
        raise app.UsageError(
            f"no case of {o.estimates} was compiled for {jax.device_count()} x {device_kind}: name one with --cases"
        )
    print(f"jax {jax.__version__}, {jax.device_count()} x {device_kind}; {len(cases)} cases", flush=True)
    print(HEAD, flush=True)
    out, start = [], time.monotonic()
    for case in cases:
        if o.minutes and time.monotonic() - start > 60 * o.minutes:
            print(f"| {case} | not started: past --minutes={o.minutes:g} |", flush=True)
            continue
        try:
            measured = time_case(case, o, rows.get(case))
        except Exception as e:  # noqa: BLE001  (out of memory, most likely: the next case may fit)
            print(f"| {case} | **{type(e).__name__}: {str(e).splitlines()[0][:200]}** |", flush=True)
            continue
        r = report(case, measured, rows.get(case), device_kind, rows.get(f"{case}/triton"))
        out.append(r)
        print(line(r), flush=True)
        if o.output:
            path = pathlib.Path(o.output)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(json.dumps(r) + "\n")
    return out


def _revision() -> str:
    import subprocess

    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("log", "-1", "--format=%h") + ("+dirty" if git("status", "--porcelain", "--", "elmo_jax") else "")


def main(argv):
    del argv
    import os

    # Before JAX starts a GPU backend: the memory plans are judged against all of a GPU's memory, not 75%.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    run(
        Options(
            cases=tuple(FLAGS.cases),
            estimates=FLAGS.estimates,
            warmup=FLAGS.warmup,
            steps=FLAGS.steps,
            positions=FLAGS.positions,
            output=FLAGS.output,
            smoke=FLAGS.smoke,
            minutes=FLAGS.minutes,
        )
    )


if __name__ == "__main__":
    define_flags()
    app.run(main)
