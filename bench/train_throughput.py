"""Training throughput of the jitted `train_step`, and how close it runs to the machine's matmul speed.

    python bench/train_throughput.py                                   # demo, small, large at the configs' batches
    python bench/train_throughput.py --shape=32x20                     # a small CPU: 32 x 20 windows for all
    python bench/train_throughput.py --models=large --compute_dtype=bfloat16

For each training config (configs/demo.py; the published small shape, configs/bilm_small.py; the original
shape, configs/bilm_large.py) it builds the config's `StepConfig` (`settings.step_config`: model, sampled
softmax with the config's n_negative_samples, dropout, ...) and a fresh train state, and times
`train_step` on one window of both directions that `data.BiLMBatchStream` makes of random sentences
(lowercase words of 1-10 letters, English-like lengths, so the char CNN's content bucket is a real
one), already on the device: compile excluded, --warmup steps, then the best of --repeats steps. It runs on the default
device (`jax.devices()[0]`; `train_step` is not sharded, so one device of several is used).

tokens/s counts the target tokens of both directions, 2 x B x T per step, as the trainer's progress line
does. Model FLOPs per step (`elmo_jax.model.flops.train_flops`; forward + backward ≈ 3 x forward):

    3 x [ 2·B·T · char_cnn + B·T · lstm + 2·B·T · 2·P·(n_negative_samples + 1) ]

with char_cnn and lstm the nominal forward FLOPs per token of `elmo_jax.model.flops` (lstm sums both
directions; every convolution start counted, whatever the content bucket skips) and the sampled softmax's
logits for the true class and the candidates (V instead of n_negative_samples + 1 for a full softmax).
The achieved model FLOP/s is shown as a fraction of the float32 matmul throughput measured in the same
run (and of the bfloat16 one with --compute_dtype=bfloat16), before and after the models; the better
of the two is the reference, so a machine that was busy for one of them does not inflate the fraction.
"peak GiB" is the device's peak memory in use so far in this process (where the backend reports it:
GPU, TPU), so run one model for its own.

Vocabulary: the softmax is V x P, and every step updates all of it (the gradient of the gathered rows
is scattered into a dense V x P array, then clipped and fed to Adagrad): memory traffic the FLOP count
does not see. --vocab_size=0 uses configs/demo.py's max_vocab_size for demo and, for small and large,
bilm-tf's 1B Word vocabulary (793,471) on GPU/TPU but 50,000 on CPU, where the full one would dominate.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/, configs/

import jax
from absl import app, flags, logging

from bench.common import matmul_throughput, platform_line
from bench.workloads import synthetic_window
from elmo_jax.model.flops import train_flops
from elmo_jax.training import settings
from elmo_jax.training.batch_feed import device_batch, distinct_bucket
from elmo_jax.training.train_step import init_train_state, train_step

CONFIGS = {
    "demo": "configs.demo",
    "small": "configs.bilm_small",
    "medium": "configs.bilm_medium",
    "large": "configs.bilm_large",
}
LM1B_VOCAB_SIZE = 793_471  # bilm-tf's vocabulary file for the 1B Word Benchmark
CPU_VOCAB_SIZE = 50_000
SHORT_DTYPE = {"float32": "f32", "bfloat16": "bf16"}

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["demo", "small", "large"], f"Training configs to time: {', '.join(CONFIGS)}.")
flags.DEFINE_string(
    "shape", "", "Window BxT for every model, e.g. 32x20 ('' = each config's batch_size x unroll_steps)."
)
flags.DEFINE_integer(
    "vocab_size",
    0,
    "Softmax vocabulary V for small/medium/large (0 = 793,471 on GPU/TPU, "
    "50,000 on CPU); demo always uses its config's max_vocab_size.",
)
flags.DEFINE_integer("n_negative_samples", -1, "Sampled-softmax negatives (-1 = each config's).")
flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "train_step's matmul dtype.")
flags.DEFINE_integer("warmup", 1, "Steps after the compiling one, before timing.")
flags.DEFINE_integer("repeats", 3, "Timed steps per model; the best is reported.")
flags.DEFINE_integer("matmul_size", 4096, "n of the n x n x n matmul whose throughput is the reference.")


def parse_shape(shape: str) -> tuple[int, int]:
    """ "32x20" -> (32, 20)."""
    try:
        B, T = (int(v) for v in shape.lower().split("x"))
        if B < 1 or T < 1:
            raise ValueError
    except ValueError:
        raise app.UsageError(f"--shape={shape!r}: expected BxT with positive integers, e.g. 32x20") from None
    return B, T


def resolve(name: str):
    """(config, StepConfig, B, T) of one model, with the flags' overrides."""
    config = importlib.import_module(CONFIGS[name]).get_config()
    if name == "demo":
        vocab_size = config.data.max_vocab_size
    elif FLAGS.vocab_size:
        vocab_size = FLAGS.vocab_size
    else:
        vocab_size = CPU_VOCAB_SIZE if jax.default_backend() == "cpu" else LM1B_VOCAB_SIZE
    cfg = settings.step_config(config, vocab_size)
    overrides = {"compute": dataclasses.replace(cfg.compute, dtype=FLAGS.compute_dtype)}
    if FLAGS.n_negative_samples >= 0:
        overrides["n_negative_samples"] = FLAGS.n_negative_samples
    cfg = dataclasses.replace(cfg, **overrides)
    B, T = parse_shape(FLAGS.shape) if FLAGS.shape else (config.batch_size, config.unroll_steps)
    return config, dataclasses.replace(cfg, unroll_steps=T), B, T


def time_train_step(config, cfg, B: int, T: int) -> dict[str, float]:
    """Compile seconds, best step seconds, tokens, content bucket and peak device memory of `train_step`."""
    optimizer = settings.optimizer(config)
    state = init_train_state(jax.random.key(0), cfg, optimizer, B)
    batch, positions = device_batch(
        synthetic_window(B, T, cfg.model.max_characters_per_token, cfg.vocab_size), cfg.model.max_characters_per_token
    )
    tokens = int(batch["mask"].sum())
    # As the trainer runs it: the char CNN over the window's distinct tokens (one device's, one block).
    distinct = distinct_bucket(batch, 1) if config.distinct_tokens else None
    batch = jax.device_put(batch)

    def step(state):
        state, metrics = train_step(
            state, batch, cfg=cfg, optimizer=optimizer, content_positions=positions, distinct_tokens=distinct
        )
        jax.block_until_ready((state, metrics))
        return state

    start = time.perf_counter()
    state = step(state)
    first = time.perf_counter() - start
    for _ in range(FLAGS.warmup):
        state = step(state)
    best = best_cpu = float("inf")
    for _ in range(FLAGS.repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        state = step(state)
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
    stats = jax.devices()[0].memory_stats() or {}
    return {
        "compile_s": first - best,
        "step_s": best,
        "cpu_s": best_cpu,
        "positions": positions,
        "tokens": tokens,
        "peak_bytes": stats.get("peak_bytes_in_use"),
    }


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    unknown = sorted(set(FLAGS.models) - set(CONFIGS))
    if unknown:
        raise app.UsageError(f"--models: unknown {unknown}; expected some of {', '.join(CONFIGS)}")
    if FLAGS.shape:
        parse_shape(FLAGS.shape)  # a bad flag fails before the matmul and the compiles
    print(f"{platform_line()}; train_step on {jax.devices()[0]}, compute_dtype={FLAGS.compute_dtype}")
    dtypes = ["float32"] + (["bfloat16"] if FLAGS.compute_dtype == "bfloat16" else [])
    before = {d: matmul_throughput(FLAGS.matmul_size, dtype=d) for d in dtypes}
    rows = []
    for name in FLAGS.models:
        config, cfg, B, T = resolve(name)
        r = time_train_step(config, cfg, B, T)
        r.update(
            name=name,
            cfg=cfg,
            B=B,
            T=T,
            flops=train_flops(
                cfg.model,
                B,
                T,
                vocab_size=cfg.vocab_size,
                n_negative_samples=None if cfg.full_softmax else cfg.n_negative_samples,
            ),
        )
        rows.append(r)
        print(
            f"  {name}: {1e3 * r['step_s']:.1f} ms per step, {r['tokens'] / r['step_s']:,.0f} tokens/s "
            f"(process CPU time {1e3 * r['cpu_s']:.1f} ms per step)",
            flush=True,
        )
    after = {d: matmul_throughput(FLAGS.matmul_size, dtype=d) for d in dtypes}
    print_table(rows, before, after)


def print_table(rows: list[dict], before: dict[str, float], after: dict[str, float]) -> None:
    """The results, with model FLOP/s against the better of the matmul figures taken before and after."""
    peaks = {d: max(before[d], after[d]) for d in before}
    n = FLAGS.matmul_size
    print(
        f"\nmeasured matmul throughput, {n}^3, before / after the models: "
        + "; ".join(f"{d} {before[d] / 1e9:,.1f} / {after[d] / 1e9:,.1f} GFLOP/s" for d in before)
        + " (the better one is the reference); tokens = target tokens of both directions (2 x B x T per step)\n"
    )
    of_peaks = "".join(f"{'of ' + SHORT_DTYPE[d]:>9}" for d in peaks)
    header = (
        f"{'model':7}{'BxT':>8}{'V':>9}{'neg':>6}{'S':>4}{'compile s':>10}{'step ms':>9}{'tokens/s':>10}"
        f"{'GFLOP/step':>11}{'GFLOP/s':>9}{of_peaks}{'peak GiB':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        cfg, achieved = r["cfg"], r["flops"] / r["step_s"]
        negatives = "full" if cfg.full_softmax else str(cfg.n_negative_samples)
        memory = f"{r['peak_bytes'] / 2**30:.2f}" if r["peak_bytes"] else "-"
        fractions = "".join(f"{achieved / peak:>9.1%}" for peak in peaks.values())
        shape = f"{r['B']}x{r['T']}"
        print(
            f"{r['name']:7}{shape:>8}{cfg.vocab_size:>9,}{negatives:>6}{r['positions']:>4}"
            f"{r['compile_s']:>10.1f}{1e3 * r['step_s']:>9.1f}{r['tokens'] / r['step_s']:>10,.0f}"
            f"{r['flops'] / 1e9:>11.1f}{achieved / 1e9:>9.1f}{fractions}{memory:>9}"
        )


if __name__ == "__main__":
    app.run(main)
