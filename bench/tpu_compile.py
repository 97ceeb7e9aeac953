"""The TPU compiler's view of elmo-jax, without a TPU: memory plans, FLOPs, traffic and a roofline estimate.

    python3 -m venv .venv-tpu && .venv-tpu/bin/pip install -e '.[tpu]'     # jax[tpu]: libtpu from PyPI
    .venv-tpu/bin/python bench/tpu_compile.py --results=bench/results_tpu_compile.jsonl   # every case, hours
    .venv-tpu/bin/python bench/tpu_compile.py --cases=v5e-8/large/bfloat16/8x1/1024 --top=15 --hlo_dir=bench/out/hlo
    .venv-tpu/bin/python bench/tpu_compile.py --cases=v5e-8/large/bfloat16/4x2/512 --revision=e241cae  # before
    .venv-tpu/bin/python bench/tpu_compile.py --table=bench/results_tpu_compile.jsonl      # the markdown table

A case is TOPOLOGY/WORKLOAD/DTYPE/DATAxMODEL/GLOBAL_BATCH[/VARIANT], e.g. v5e-8/large/bfloat16/8x1/1024;
workloads: large (configs/bilm_large.py), small (configs/bilm_small.py), embed (embed_file's program);
the variant "dense" turns the sparse softmax update off, "every_token" runs the char CNN over every token.
Results (bench/RESULTS_tpu_compile.md) record the revision of elmo_jax compiled.

`jax[tpu]` installs libtpu from PyPI; its compiler runs on any Linux x86-64 machine. For a named
topology (`TOPOLOGIES`) `jax.experimental.topologies.get_topology_desc` gives compile-only TPU devices;
the real jitted programs are lowered from ShapeDtypeStructs carrying their shardings and compiled
(`.lower(...).compile()`, nothing allocated): the train step of a config (`jitted_steps.jit_steps`, the
1B Word vocabulary of 793,471 words, the char CNN at 24 positions, a typical lm1b bucket, over the
distinct tokens a chip's share of a 1B Word batch is expected to hold: `distinct_slots`) or the
feature extractor (`embed_file`'s program: the original model, 40 tokens, batch split over the chips).
Each case runs in its own process with a timeout; one that fails or does not fit is a row saying so.

Per case, per chip: the compiler's memory plan (`memory_analysis()`: arguments + outputs - aliased +
temporaries, against the chip's HBM), compile time, and from the optimised program (`as_text()`,
read by `bench/hlo_cost.py`, which counts every loop body as often as it runs; XLA's own
`cost_analysis()`, also recorded, counts a loop body once):

- FLOPs: 2 per multiply-add of every matrix product; float32 products at `Precision.HIGHEST` take 6
  bfloat16 passes on a TPU matrix unit (documented by `jax.lax.Precision`), so they cost 6x the time;
- HBM bytes: what each instruction reads and writes in HBM (values the compiler keeps in on-chip
  memory are not counted, copies between the two are);
- the roofline: step time = max(FLOP time at the published bfloat16 peak, HBM bytes at the published
  bandwidth), ignoring collectives (their bytes are listed) and the gaps between kernels, so it is a
  lower bound of a real step; utilisation = FLOP time / step time; MFU = the model's FLOPs
  (`elmo_jax.model.flops`, nominal, each chip's share) at the peak / step time;
- the same with the read half of each scatter-add's read-modify-write counted (`scatter_read_bytes`);
- the serial roofline (`serial_ms`): each kernel's own max(FLOP time, HBM time), summed, as if no two
  kernels overlapped;
- the compiler's estimate (`estimated_ms`): each kernel's `estimated_cycles` (its backend config) times
  its loop trips at the chip's clock (`CHIPS`, derived from published figures, with sources), plus the
  serial time of the kernels it gives no estimate for (scatters, gathers, async copies, collectives);
  util. and MFU from it as above. Until a TPU runs the step (bench/tpu_first_run.py), the closest thing
  to a clock;
- collectives by kind and their time over the chip's published ICI bandwidth (`ici_ms`: bytes / the
  bidirectional per-chip figure, a rough lower bound, not added to any step time).

`--table` prints one row per case, the newest revision's (`--all_rows`: every row of the file); `--top=N`
prints a case's largest kernels by HBM bytes and by `--top_by` time; `--kernels=FILE` prints the stored
per-kernel tables (the 20 kernels with the largest estimated times of each current row).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/, configs/

from absl import app, flags  # noqa: E402

from bench import accelerators  # noqa: E402
from bench.accelerators import CHIPS, GIB, TOPOLOGIES, Chip  # noqa: E402,F401  (the tables, by their old names)

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "cases", [], "TOPOLOGY/WORKLOAD/DTYPE/DATAxMODEL/BATCH[/VARIANT] cases (default: --platform's DEFAULT_CASES)."
)
flags.DEFINE_enum("platform", "tpu", ["tpu", "cuda"], "Default cases: TPU (DEFAULT_CASES), NVIDIA GPU (GPU_CASES).")
flags.DEFINE_string("results", "", "Append each case's result to this JSON-lines file as it finishes.")
flags.DEFINE_string("table", "", "Print the markdown table of a results file (no compiling).")
flags.DEFINE_string(
    "reanalyse", "", "Recount the traffic of a results file's rows from their HLO files in --hlo_dir (no compiling)."
)
flags.DEFINE_string("hlo_dir", "", "Also write each case's optimised HLO here (CASE.hlo.txt).")
flags.DEFINE_integer(
    "top", 0, "Print each case's N largest instructions by HBM bytes and its per-kernel table (--top_by)."
)
flags.DEFINE_enum(
    "top_by", "estimated_ms", ["estimated_ms", "serial_ms", "flop_ms", "hbm_ms"], "The per-kernel table's order."
)
flags.DEFINE_string("kernels", "", "Print the per-kernel tables (--top, --top_by) of a results file's current rows.")
flags.DEFINE_bool("all_rows", False, "--table: every row of the file, not only each case's current one.")
flags.DEFINE_integer("timeout", 3600, "Seconds allowed per case.")
flags.DEFINE_integer("positions", 24, "Char CNN positions compiled for (char ids of a typical 1B Word batch).")
flags.DEFINE_string(
    "revision", "", "Compile another commit's elmo_jax and configs (git archive into bench/out/src/REV): before/after."
)
flags.DEFINE_string("child", None, "Internal: compile one case in this process and print its result as JSON.")
flags.DEFINE_string("source_dir", "", "Internal: import elmo_jax and configs from this directory.")

LM1B_VOCAB_SIZE = 793_471
EMBED_TOKENS = 40


WORKLOADS = {"large": "configs.bilm_large", "small": "configs.bilm_small"}  # and "embed"
# Variants change StepConfig settings from the default, for before/after figures of an optimisation.
# "every_token" runs the char CNN over every token instead of each device's distinct ones (`distinct_slots`).
# "triton" (GPU only) compiles the same step with Triton GEMMs (`accelerators.compiler_flags`).
VARIANTS: dict[str, dict] = {"dense": {"sparse_softmax_update": False}, "every_token": {}, "triton": {}}

# The train step is compiled for the distinct tokens a device's share of a 1B Word batch is expected to
# hold (`ComputeOptions.distinct_tokens`, rounded as the trainer rounds a batch's count): words drawn by
# Zipf's law (frequency ~ 1 / rank) from the 793,471-word vocabulary, rows from independent sentences.
# 5,120 tokens (128 rows x 20 steps x 2 directions): 2,934 distinct (57.3%), 3,200 slots.
ZIPF_EXPONENT = 1.0

DEFAULT_CASES = [
    # bilm_large at 128 rows per chip (configs/bilm_large.py:TPU_MESHES): Colab's single chips, the 8-chip
    # hosts, a pod slice; float32 for comparison on v5e; the 4 x 2 mesh recommended before (docs/TPU.md)
    *[f"{t}/large/bfloat16/1x1/128" for t in ("v5e-1", "v6e-1")],
    "v5e-8/large/bfloat16/8x1/1024",
    "v5e-8/large/bfloat16/4x2/512",
    "v5e-8/large/float32/4x2/512",
    "v6e-8/large/bfloat16/8x1/1024",
    "v4-8/large/bfloat16/4x1/512",
    "v5p-8/large/bfloat16/4x1/1024",
    "v5e-32/large/bfloat16/32x1/4096",
    "v5e-64/large/bfloat16/64x1/8192",
    # bilm_small as the training notebook runs it on a TPU: 128 rows per chip (configs/notebooks.py)
    *[f"{t}/small/{d}/1x1/128" for t in ("v5e-1", "v6e-1") for d in ("bfloat16", "float32")],
    # the feature extractor (embed_file's program) on one chip
    *[f"{t}/embed/{d}/1x1/{b}" for t in ("v5e-1", "v6e-1") for d in ("bfloat16", "float32") for b in (64, 512)],
]

# NVIDIA GPUs (--platform=cuda): bilm_small and bilm_large at 128 rows per GPU (as bilm-tf trained) on one
# GPU and an 8-GPU server, the feature extractor on one GPU; the cuBLAS program first, then the Triton-GEMM
# program of the one-GPU cases; then bilm_large's largest batches on one GPU (which fits 80 / 141 GB).
GPU_CASES = [
    *[f"{g}-{n}/small/bfloat16/{n}x1/{128 * n}" for g in ("h100", "h200") for n in (1, 8)],
    *[f"{g}-1/embed/bfloat16/1x1/512" for g in ("h100", "h200")],
    *[f"{g}-{n}/large/bfloat16/{n}x1/{128 * n}" for g in ("h100", "h200") for n in (1, 8)],
    "a100-1/small/bfloat16/1x1/128",
    *[f"{g}-1/{w}/bfloat16/1x1/128/triton" for w in ("small", "large") for g in ("h100", "h200")],
    "h100-1/embed/bfloat16/1x1/512/triton",
    *[f"h100-1/large/bfloat16/1x1/{b}" for b in (512, 1024)],
]


@dataclasses.dataclass(frozen=True)
class Case:
    topology: str
    workload: str
    dtype: str
    data: int
    model: int
    batch: int  # global rows
    variant: str = ""

    @classmethod
    def parse(cls, text: str) -> Case:
        parts = text.split("/")
        if len(parts) not in (5, 6):
            raise ValueError(f"case {text!r}: expected TOPOLOGY/WORKLOAD/DTYPE/DATAxMODEL/BATCH[/VARIANT]")
        topology, workload, dtype, mesh, batch = parts[:5]
        data, model = (int(x) for x in mesh.split("x"))
        case = cls(topology, workload, dtype, data, model, int(batch), parts[5] if len(parts) == 6 else "")
        if (
            topology not in TOPOLOGIES
            or workload not in (*WORKLOADS, "embed")
            or (case.variant and case.variant not in VARIANTS)
        ):
            raise ValueError(f"case {text!r}: unknown topology, workload or variant")
        gpu = case.chip.platform == "cuda"
        if (case.variant == "triton" and not gpu) or (gpu and dtype != "bfloat16"):
            # float32 products are weighted as a TPU runs them (`hlo_cost.mxu_passes`), not as a GPU does
            raise ValueError(f"case {text!r}: 'triton' is a GPU variant, and a GPU case compiles bfloat16")
        return case

    @property
    def name(self) -> str:
        tail = f"/{self.variant}" if self.variant else ""
        return f"{self.topology}/{self.workload}/{self.dtype}/{self.data}x{self.model}/{self.batch}{tail}"

    @property
    def chip(self) -> Chip:
        return accelerators.chip(self.topology)


# ------------------------------------------------------------------------------------------------ child


def expected_distinct(tokens: int, vocab: int = LM1B_VOCAB_SIZE, exponent: float = ZIPF_EXPONENT) -> float:
    """The expected number of distinct words among `tokens` drawn independently by Zipf's law from `vocab`
    words: the sum over words of P(drawn at least once)."""
    import numpy as np

    p = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** exponent
    p /= p.sum()
    return float(np.sum(-np.expm1(tokens * np.log1p(-p))))


def distinct_slots(case: Case, unroll_steps: int) -> int | None:
    """The char CNN's distinct-token slots per device the case is compiled for (None: every token)."""
    from elmo_jax.model.distinct_tokens import rounded_slots

    if case.variant == "every_token":
        return None
    per_device = 2 * case.batch * unroll_steps // case.data
    return rounded_slots(int(math.ceil(expected_distinct(per_device))), per_device)


def lower_train(case: Case, devices):
    """The lowered train step of the case's config on its mesh, and the model FLOPs of one step."""
    import importlib

    from elmo_jax.model.flops import train_flops
    from elmo_jax.training import jitted_steps, settings, sharding

    config = importlib.import_module(WORKLOADS[case.workload]).get_config()
    config.compute_dtype = case.dtype
    cfg = dataclasses.replace(settings.step_config(config, LM1B_VOCAB_SIZE), **VARIANTS.get(case.variant, {}))
    mesh = sharding.make_mesh(case.data, case.model, devices)
    sharding.check_training_mesh(mesh, case.batch, 1)
    steps = jitted_steps.jit_steps(mesh, cfg, settings.optimizer(config), case.batch)
    B, T = case.batch, cfg.unroll_steps
    batch = steps.abstract_batch(cfg)
    slots = distinct_slots(case, T)
    lowered = steps.train.lower(steps.abstract_state, batch, FLAGS.positions, slots)
    flops = train_flops(cfg.model, B, T, vocab_size=LM1B_VOCAB_SIZE, n_negative_samples=cfg.n_negative_samples)
    return lowered, flops, 2 * B * T, slots


def lower_embed(case: Case, devices):
    """The feature extractor as `embed_file` runs it (`batch_runner`'s char program: a one-axis mesh over
    the chips, each embedding its own rows, every layer returned) on `EMBED_TOKENS` tokens per row."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import elmo_jax
    from elmo_jax.features import batch_runner
    from elmo_jax.model.flops import embed_flops
    from elmo_jax.model.precision import ComputeOptions

    config = elmo_jax.BiLMConfig.preset("original")
    mesh = batch_runner.device_mesh(devices[: case.data * case.model])
    rows, replicated = (jax.NamedSharding(mesh, jax.P(*spec)) for spec in ((batch_runner.AXIS,), ()))
    weights = jax.eval_shape(lambda: elmo_jax.init_params(config, jax.random.key(0)).weights)
    weights = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), weights)
    C = config.max_characters_per_token
    chars = jax.ShapeDtypeStruct((case.batch, EMBED_TOKENS, C), jnp.int32, sharding=rows)  # bilm_layers adds <S>, </S>
    mix = jax.ShapeDtypeStruct((config.n_output_layers,), np.float32, sharding=replicated)
    compute = ComputeOptions(dtype=case.dtype, content_positions=FLAGS.positions)
    program = batch_runner._chars_program(mesh, "all", "float32")
    lowered = program.lower(config, compute, weights, chars, mix)
    return lowered, embed_flops(config, case.batch, EMBED_TOKENS), case.batch * EMBED_TOKENS, None


def cost_fields(text: str, chip: Chip) -> dict:
    """A result's figures read from the compiled program's text (`hlo_cost`), times at the chip's figures."""
    from bench import hlo_cost

    cost = hlo_cost.analyse(text)
    top = [
        {
            "name": i.name,
            "opcode": i.opcode,
            "where": i.where,
            "op": i.op_name[-80:],
            "count": i.count,
            "hbm_bytes": i.hbm_bytes,
            "flops": i.flops,
        }
        for i in cost.top(FLAGS.top or 12, "hbm_bytes")
    ]
    times = cost.times(chip.peak_flops, chip.hbm_bandwidth, chip.clock_hz)
    kernels = [
        {
            "name": i.name,
            "opcode": i.opcode,
            "where": i.where,
            "op": i.op_name[-80:],
            "count": i.count,
            "hbm_bytes": i.hbm_bytes + i.scatter_read_bytes,
            "flops": i.mxu_flops,
            "cycles": i.cycles,
            **{key.replace("_s", "_ms"): 1e3 * value for key, value in t.items()},
            **({"gpu_ms": [1e3 * x for x in i.estimates[""]]} if "" in i.estimates else {}),  # exec, compute, memory
        }
        for i, t in cost.top_by_time(
            max(FLAGS.top, 20),
            chip.peak_flops,
            chip.hbm_bandwidth,
            chip.clock_hz,
            key="estimated_s" if chip.clock_hz or chip.gpu_spec else "serial_s",
        )
    ]
    ms = lambda seconds: None if seconds is None else 1e3 * seconds  # noqa: E731
    return {
        "flops": cost.flops,
        "mxu_flops": cost.mxu_flops,
        "hbm_bytes": cost.hbm_bytes,
        "scatter_read_bytes": cost.scatter_read_bytes,
        "operand_bytes": cost.bytes,
        "collective_bytes": cost.collective_bytes,
        "collective_bytes_in_loops": cost.collective_bytes_in_loops,
        "collectives": cost.collectives_by_kind(),
        "serial_ms": ms(times["serial_s"]),
        "estimated_ms": ms(times["estimated_s"]),
        "unestimated_ms": ms(times["unestimated_s"]),
        "estimated_cycles": sum(i.cycles for i in cost.items if i.cycles is not None),
        "estimated_kernels": times["estimated_kernels"],
        "kernels_counted": len(cost.items),
        "clock_hz": chip.clock_hz,
        "launches": sum(i.count for i in cost.items),  # kernels run per step, loop trips counted
        # the GPU compiler's estimates summed per cost model (ms; "" its own), where it gives them
        "gpu_estimates": {
            model: {k.replace("_s", "_ms"): (v * 1e3 if k != "kernels" else v) for k, v in t.items()}
            for model, t in cost.gpu_estimates().items()
        },
        "loops": [[name, trips] for name, trips, _ in cost.loops],
        "top": top,
        "kernels": kernels,
        # the estimate by kind of kernel (`hlo_cost.by_kind`), ms: where a goal's time would have to come from
        "kinds": {
            name: {key.replace("_s", "_ms"): (value * 1e3 if key != "kernels" else value) for key, value in t.items()}
            for name, t in cost.by_kind(chip.peak_flops, chip.hbm_bandwidth, chip.clock_hz).items()
        },
    }


def hlo_path(case_name: str, revision: str) -> pathlib.Path:
    """Where --hlo_dir keeps a case's optimised HLO (a --revision run's name carries the revision)."""
    tail = f"@{revision}" if revision else ""
    return pathlib.Path(FLAGS.hlo_dir) / (case_name.replace("/", "_") + tail + ".hlo.txt")


def reanalyse(results: pathlib.Path, hlo_dir: pathlib.Path) -> None:
    """Rewrites the traffic figures of every row whose HLO file is in `hlo_dir` (after a change of hlo_cost)."""
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    for r in rows:
        path = hlo_dir / pathlib.Path(r.get("hlo", "")).name if r.get("hlo") else None
        if path and path.exists() and "error" not in r:
            r.update(cost_fields(path.read_text(), Case.parse(r["case"]).chip))
            print(f"{r['case']} ({r.get('revision')}): HBM {r['hbm_bytes'] / 1e9:.2f} GB", flush=True)
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))


def compile_case(case: Case) -> dict:
    """Compiles one case in this process; see the module docstring for what is measured."""

    devices = accelerators.devices(case.topology)
    chips = case.data * case.model
    if chips > len(devices):
        raise ValueError(f"{case.name}: the mesh needs {chips} chips, {case.topology} has {len(devices)}")
    start = time.perf_counter()
    lower = lower_embed if case.workload == "embed" else lower_train
    lowered, model_flops, tokens, slots = lower(case, devices[:chips] if case.workload != "embed" else devices)
    lower_s = time.perf_counter() - start
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start - lower_s
    m = compiled.memory_analysis()
    xla = compiled.cost_analysis()
    xla = (xla[0] if isinstance(xla, list) else xla) or {}  # the GPU compiler gives None without a device
    text = compiled.as_text()
    path = ""
    if FLAGS.hlo_dir:
        path = hlo_path(case.name, FLAGS.revision)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    import elmo_jax

    return {
        "case": case.name,
        # Relative to the repository (a results file must not name this machine's paths).
        "elmo_jax": os.path.relpath(pathlib.Path(elmo_jax.__file__).parent, REPO),
        "chips": chips,
        "device_kind": devices[0].device_kind,
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "total": total,
        "lower_s": round(lower_s, 1),
        "compile_s": round(compile_s, 1),
        "xla_flops": float(xla.get("flops", 0.0)),
        "xla_bytes": float(xla.get("bytes accessed", 0.0)),
        **cost_fields(text, case.chip),
        "hlo": str(path),
        "model_flops_per_chip": model_flops / chips,
        "tokens": tokens,
        "distinct_slots": slots,  # per chip (`distinct_slots`); None: the char CNN over every token
        **({"xla_flags": flags} if (flags := accelerators.compiler_flags(case.topology, case.variant)) else {}),
    }


# ----------------------------------------------------------------------------------------------- parent


def run_case(case: Case) -> dict:
    """`compile_case` in a child process (libtpu and the compiler's memory are the child's alone)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *accelerators.compiler_flags(case.topology, case.variant)])
    argv = [sys.executable, __file__, f"--child={case.name}", f"--positions={FLAGS.positions}"]
    argv += [f"--hlo_dir={FLAGS.hlo_dir}"] if FLAGS.hlo_dir else []
    argv += [f"--revision={FLAGS.revision}", f"--source_dir={_source(FLAGS.revision)}"] if FLAGS.revision else []
    argv += [f"--top={FLAGS.top}"] if FLAGS.top else []
    start = time.perf_counter()
    revision = FLAGS.revision or _revision()
    base = {"case": case.name, "date": datetime.date.today().isoformat(), "revision": revision}
    try:
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=FLAGS.timeout)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timed out after {FLAGS.timeout} s"}
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        return {**base, "error": _error_line(result.stderr)}
    return {**base, **json.loads(lines[-1]), "wall_s": round(time.perf_counter() - start, 1)}


def _error_line(stderr: str) -> str:
    """The compiler's or Python's last error line, e.g. RESOURCE_EXHAUSTED for a plan that does not fit."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if "RESOURCE_EXHAUSTED" in line or "Error" in line or "error" in line:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def roofline(r: dict) -> dict:
    """Step times, tokens/s, utilisation and MFU of a result, from its chip's published figures: the
    roofline (as before, and with scatter reads), the serial per-kernel roofline, the compiler's estimate
    and the collectives' ICI time (None where a row or a chip lacks the figure)."""
    chip = Case.parse(r["case"]).chip
    flop_s = r["mxu_flops"] / chip.peak_flops
    memory_s = r["hbm_bytes"] / chip.hbm_bandwidth
    step_s = max(flop_s, memory_s)
    scatter_s = max(flop_s, (r["hbm_bytes"] + r.get("scatter_read_bytes", 0.0)) / chip.hbm_bandwidth)
    util = lambda ms: None if ms is None else flop_s / (ms / 1e3)  # noqa: E731
    mfu = lambda ms: None if ms is None else r["model_flops_per_chip"] / chip.peak_flops / (ms / 1e3)  # noqa: E731
    serial_ms, estimated_ms = r.get("serial_ms"), r.get("estimated_ms")
    return {
        "flop_ms": 1e3 * flop_s,
        "memory_ms": 1e3 * memory_s,
        "step_ms": 1e3 * step_s,
        "tokens_per_s": r["tokens"] / step_s,
        "utilisation": flop_s / step_s,
        "mfu": r["model_flops_per_chip"] / chip.peak_flops / step_s,
        "headroom": 1.0 - r["total"] / chip.hbm_bytes,
        "scatter_step_ms": 1e3 * scatter_s if "scatter_read_bytes" in r else None,
        "scatter_utilisation": flop_s / scatter_s if "scatter_read_bytes" in r else None,
        "serial_ms": serial_ms,
        "serial_utilisation": util(serial_ms),
        "estimated_ms": estimated_ms,
        "estimated_utilisation": util(estimated_ms),
        "estimated_mfu": mfu(estimated_ms),
        "estimated_tokens_per_s": r["tokens"] / (estimated_ms / 1e3) if estimated_ms else None,
        "ici_ms": 1e3 * r["collective_bytes"] / chip.ici_bandwidth if chip.ici_bandwidth else None,
    }


COLUMNS = (
    "| case | revision | plan GiB (args + temp) | of HBM | compile s | GFLOP | MXU GFLOP | HBM GB | "
    "collectives GB | FLOP ms | HBM ms | step ms | tokens/s (slice) | util. | MFU | "
    "+ scatter reads GB | util. (scatter reads) | serial ms | serial util. | est. ms | est. util. | est. MFU | "
    "ICI ms | char CNN tokens per chip |"
)


def current_rows(results: list[dict]) -> list[dict]:
    """One row per case: the one of the newest revision (by commit time; a "+dirty" row after its commit;
    among rows of one revision, the last in the file). Older rows stay in the JSON-lines history."""
    best: dict[str, tuple] = {}
    for position, r in enumerate(results):
        revision = r.get("revision", "")
        key = (_commit_time(revision.removesuffix("+dirty")), revision.endswith("+dirty"), position)
        if r["case"] not in best or key > best[r["case"]][0]:
            best[r["case"]] = (key, r)
    return [r for _, r in sorted(best.values(), key=lambda kr: kr[1]["case"])]


_COMMIT_TIMES: dict[str, int] = {}


def _commit_time(revision: str) -> int:
    """The committer time of a revision (seconds), -1 if git does not know it."""
    if revision not in _COMMIT_TIMES:
        out = subprocess.run(
            ["git", "show", "-s", "--format=%ct", revision], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        _COMMIT_TIMES[revision] = int(out) if out.isdigit() else -1
    return _COMMIT_TIMES[revision]


def table(results: list[dict]) -> list[str]:
    head = COLUMNS
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    f = lambda value, spec, scale=1.0: "-" if value is None else format(value * scale, spec)  # noqa: E731
    for r in results:
        if "error" in r:
            lines.append(f"| {r['case']} | {r.get('revision', '')} | **{r['error']}** |" + " |" * (head.count("|") - 4))
            continue
        x = roofline(r)
        fits = "" if x["headroom"] >= 0.15 else " (under 15% headroom)"
        scatter = r.get("scatter_read_bytes")
        lines.append(
            f"| {r['case']} | {r.get('revision', '')} "
            f"| {r['total'] / GIB:.2f} ({r['arguments'] / GIB:.2f} + {r['temporaries'] / GIB:.2f}) | "
            f"{1 - x['headroom']:.0%}{fits} | {r['compile_s']:.0f} | {r['flops'] / 1e9:,.0f} | "
            f"{r['mxu_flops'] / 1e9:,.0f} | {r['hbm_bytes'] / 1e9:.2f} | {r['collective_bytes'] / 1e9:.2f} | "
            f"{x['flop_ms']:.1f} | {x['memory_ms']:.1f} | {x['step_ms']:.1f} | {x['tokens_per_s']:,.0f} | "
            f"{x['utilisation']:.1%} | {x['mfu']:.1%} | {f(scatter, '.2f', 1e-9)} | "
            f"{f(x['scatter_utilisation'], '.1%')} | "
            f"{f(x['serial_ms'], '.1f')} | {f(x['serial_utilisation'], '.1%')} | {f(x['estimated_ms'], '.1f')} | "
            f"{f(x['estimated_utilisation'], '.1%')} | {f(x['estimated_mfu'], '.1%')} | {f(x['ici_ms'], '.2f')} | "
            f"{char_cnn_tokens(r)} |"
        )
    return lines


GPU_COLUMNS = (
    "| case | revision | GEMMs | est. ms | own-estimate kernels: exec ms (compute, memory) | "
    "kernels without one (serial roofline) ms | kernels run per step | compiler's speed of light ms |"
)


def gpu_table(results: list[dict]) -> list[str]:
    """The GPU compiler's estimates of GPU rows: est. ms (its own per-kernel times, loop trips counted, plus
    the serial roofline of the kernels it gives none: cuBLAS calls, copies), the sums of its own times,
    and of its speed-of-light model's ("sol", kept apart: see `hlo_cost.Item.estimate_s`)."""
    lines = [GPU_COLUMNS, "|" + "---|" * (GPU_COLUMNS.count("|") - 1)]
    for r in results:
        if "error" in r or not r.get("gpu_estimates") or not Case.parse(r["case"]).chip.gpu_spec:
            continue  # (the A100's rows: no estimates, `accelerators.compiler_flags`)
        own, sol = r["gpu_estimates"].get("", {}), r["gpu_estimates"].get("sol", {})
        gemms = "Triton (default tiles)" if Case.parse(r["case"]).variant == "triton" else "cuBLAS"
        lines.append(
            f"| {r['case']} | {r.get('revision', '')} | {gemms} | {r['estimated_ms']:.2f} | "
            f"{own.get('exec_ms', 0):.2f} ({own.get('compute_ms', 0):.2f}, {own.get('memory_ms', 0):.2f}) "
            f"x{int(own.get('kernels', 0))} | {r['unestimated_ms']:.2f} "
            f"x{r['kernels_counted'] - int(own.get('kernels', 0))} | {r['launches']:,} | {sol.get('exec_ms', 0):.1f} |"
        )
    return lines


def char_cnn_tokens(r: dict) -> str:
    """The tokens a chip's char CNN runs on: its distinct-token slots, or all of them (rows before the
    slots were recorded, the "every_token" variant, the feature extractor)."""
    slots = r.get("distinct_slots")
    return "all" if slots is None else f"{slots:,} distinct of {r['tokens'] // Case.parse(r['case']).data:,}"


def print_top(r: dict) -> None:
    print(f"  largest HBM traffic of {r['case']} (bytes per step, all executions of the instruction):")
    for i in r["top"]:
        print(
            f"    {i['hbm_bytes'] / 1e9:7.3f} GB x{i['count']:<4} {i['opcode']:<12} "
            f"{i['where'][:70]:<70} {i['op'][-50:]}"
        )
    if r.get("kernels"):
        print_kernels(r, FLAGS.top_by, FLAGS.top)


def print_kernels(r: dict, key: str = "estimated_ms", n: int = 20) -> None:
    """The per-kernel table of a row (its `kernels`: the largest by the compiler's estimate when compiled),
    sorted by `key` (estimated_ms, serial_ms, flop_ms, hbm_ms)."""
    if r.get("kinds"):
        from bench import hlo_cost

        kinds = {name: {k.replace("_ms", "_s"): v for k, v in t.items()} for name, t in r["kinds"].items()}
        hlo_cost.print_kinds(kinds, f"{r['case']} ({r.get('revision', '')}) by kind of kernel, ms per step", scale=1)
    print(f"  kernels of {r['case']} ({r.get('revision', '')}) by {key}, per step, all executions:")
    print(f"    {'est. ms':>8} {'serial':>7} {'FLOP ms':>7} {'HBM ms':>7} {'Mcycles':>8} trips opcode       where / op")
    for k in sorted(r["kernels"], key=lambda k: -(k.get(key) or 0))[:n]:
        cycles = "-" if k["cycles"] is None else f"{k['cycles'] / 1e6:.2f}"
        print(
            f"    {k['estimated_ms']:8.3f} {k['serial_ms']:7.3f} {k['flop_ms']:7.3f} {k['hbm_ms']:7.3f} "
            f"{cycles:>8} x{k['count']:<4} {k['opcode']:<12} {k['where'][:60]:<60} {k['op'][-40:]}"
        )


def main(argv):
    del argv
    if FLAGS.child:
        if FLAGS.source_dir:  # before the first import of elmo_jax or configs
            sys.path.insert(0, FLAGS.source_dir)
        print(json.dumps(compile_case(Case.parse(FLAGS.child))), flush=True)
        return
    if FLAGS.reanalyse:
        reanalyse(pathlib.Path(FLAGS.reanalyse), pathlib.Path(FLAGS.hlo_dir))
        return
    if FLAGS.table:
        results = [json.loads(line) for line in pathlib.Path(FLAGS.table).read_text().splitlines() if line.strip()]
        rows = results if FLAGS.all_rows else current_rows(results)
        print("\n".join(table(rows)))
        if any("gpu_estimates" in r for r in rows):
            print("\n" + "\n".join(gpu_table(rows)))
        return
    if FLAGS.kernels:
        results = [json.loads(line) for line in pathlib.Path(FLAGS.kernels).read_text().splitlines() if line.strip()]
        for r in current_rows(results):
            if r.get("kernels") and (not FLAGS.cases or r["case"] in FLAGS.cases):
                print_kernels(r, FLAGS.top_by, FLAGS.top or 20)
        return
    import jax

    cases = [Case.parse(c) for c in (FLAGS.cases or (GPU_CASES if FLAGS.platform == "cuda" else DEFAULT_CASES))]
    versions = _compiler_versions()
    print(f"jax {jax.__version__}, {versions}; {len(cases)} cases, one process each", flush=True)
    results = []
    for case in cases:
        r = run_case(case)
        results.append(r)
        if FLAGS.results:
            with open(FLAGS.results, "a") as f:
                compiler = {k: v for k, v in versions.items() if (k == "libtpu") != (case.chip.platform == "cuda")}
                f.write(json.dumps({**r, "jax": jax.__version__, **compiler}) + "\n")
        print(table([r])[-1], flush=True)
        if FLAGS.top and "top" in r:
            print_top(r)
    print("\n".join(table(results)))


def _source(revision: str) -> pathlib.Path:
    """elmo_jax/ and configs/ of a commit, extracted once under bench/out/src/REVISION."""
    target = REPO / "bench" / "out" / "src" / revision
    if not target.exists():
        staging = target.with_name(f".{revision}.{os.getpid()}.tmp")
        staging.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", revision, "elmo_jax", "configs"], cwd=REPO, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
        staging.rename(target)
    return target


def _revision() -> str:
    """The last commit that changed elmo_jax/ or configs/, with "+dirty" when the working tree differs from it."""
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    last = git("log", "-1", "--format=%h", "--", "elmo_jax", "configs")  # the last commit that changed them
    return last + ("+dirty" if git("status", "--porcelain", "--", "elmo_jax", "configs") else "")


def _compiler_versions() -> dict[str, str]:
    """The installed compilers: libtpu's and the CUDA plugin's versions ("not installed" where absent)."""
    from importlib import metadata

    versions = {}
    for name in ("libtpu", "jax-cuda12-plugin"):
        try:
            versions[name.replace("-", "_")] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name.replace("-", "_")] = "not installed"
    return versions


if __name__ == "__main__":
    app.run(main)
