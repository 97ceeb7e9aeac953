"""Where the train step's time goes: a `jax.profiler` trace of `train_step`, summed per XLA operation.

    python bench/profile_train_step.py                                  # small at 32x20 (--shape), the top 25 ops
    python bench/profile_train_step.py --model=large --shape=16x20 --top=40
    python bench/profile_train_step.py --trace_dir=/tmp/trace           # keep the trace for TensorBoard/Perfetto

It builds the same step as `bench/train_throughput.py` (the config's `StepConfig`, random weights, one
window of random English-like sentences), runs --warmup steps, then traces --steps steps with
`jax.profiler.trace` and reads the trace back (`jax`'s own xplane reader, no TensorBoard needed). Every
event that names an operation of the compiled step (a fusion, a dot, a copy, ...) is summed over all
threads and divided by the number of traced steps; the table joins each name to its shape and the
`op_name` metadata of the compiled HLO (which jnp call and which autodiff stage made it:
`jvp(...)` forward, `transpose(jvp(...))` backward), so a slow line points at source code.

On CPU the thread times add up to more than the wall time (the ops run on the intra-op thread pool); the
"share" column is of the summed op time. On GPU the device's own kernel events are summed the same way
when the trace has them.
"""

from __future__ import annotations

import collections
import pathlib
import re
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/, configs/

import jax
from absl import app, flags, logging

from bench import train_throughput
from bench.common import platform_line
from bench.workloads import synthetic_window
from elmo_jax.training import settings
from elmo_jax.training.batch_feed import device_batch
from elmo_jax.training.train_step import init_train_state, train_step

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "small", f"Training config: {', '.join(train_throughput.CONFIGS)}.")
flags.DEFINE_integer("steps", 2, "Steps traced (after the warm-up); times are per step.")
flags.DEFINE_integer("top", 25, "Operations listed, by time.")
flags.DEFINE_string("trace_dir", "", "Keep the trace here ('' = a temporary directory, removed).")
# train_throughput's flags (--shape, --vocab_size, --compute_dtype, --n_negative_samples, --warmup) apply too.

# Events of the runtime rather than of one operation of the program.
_RUNTIME_EVENT = re.compile(r"^(ThunkExecutor|SlinkyThreadPool|ThreadpoolListener|end: |\$|PjRt|Execute)")


def hlo_ops(compiled_text: str) -> dict[str, tuple[str, str]]:
    """{instruction name: (result shape, op_name metadata)} of every instruction in the compiled HLO."""
    ops = {}
    instruction = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*\)|\S+) ")
    op_name = re.compile(r'op_name="([^"]*)"')
    for line in compiled_text.splitlines():
        match = instruction.match(line)
        if match:
            name, shape = match.groups()
            meta = op_name.search(line)
            ops[name] = (shape.split("{")[0], meta.group(1) if meta else "")
    return ops


def op_times(trace_dir: str) -> collections.Counter:
    """Nanoseconds per operation name, summed over every thread of the newest trace under trace_dir."""
    from jax._src.lib import _profile_data  # jax's reader of its own xplane files

    files = sorted(pathlib.Path(trace_dir).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise RuntimeError(f"{trace_dir}: jax.profiler.trace wrote no *.xplane.pb file")
    totals = collections.Counter()
    for plane in _profile_data.ProfileData.from_file(str(files[-1])).planes:
        for line in plane.lines:
            for event in line.events:
                if not _RUNTIME_EVENT.match(event.name):
                    totals[event.name] += event.duration_ns
    return totals


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    if FLAGS.model not in train_throughput.CONFIGS:
        raise app.UsageError(f"--model={FLAGS.model!r}: expected one of {', '.join(train_throughput.CONFIGS)}")
    FLAGS.models = [FLAGS.model]
    config, cfg, B, T = train_throughput.resolve(FLAGS.model)
    optimizer = settings.optimizer(config)
    state = init_train_state(jax.random.key(0), cfg, optimizer, B)
    C = cfg.model.max_characters_per_token
    batch, positions = device_batch(synthetic_window(B, T, C, cfg.vocab_size), C)
    batch = jax.device_put(batch)
    kwargs = dict(cfg=cfg, optimizer=optimizer, content_positions=positions)
    compiled = train_step.lower(state, batch, **kwargs).compile()
    ops = hlo_ops(compiled.as_text())
    for _ in range(1 + FLAGS.warmup):
        state, metrics = train_step(state, batch, **kwargs)
        jax.block_until_ready((state, metrics))

    trace_dir = FLAGS.trace_dir or tempfile.mkdtemp(prefix="elmo_profile_")
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir):
        for _ in range(FLAGS.steps):
            state, metrics = train_step(state, batch, **kwargs)
            jax.block_until_ready((state, metrics))
    wall = (time.perf_counter() - start) / FLAGS.steps
    totals = {name: ns for name, ns in op_times(trace_dir).items() if name in ops}
    if not FLAGS.trace_dir:
        import shutil

        shutil.rmtree(trace_dir, ignore_errors=True)
    summed = sum(totals.values())
    print(
        f"{platform_line()}; {FLAGS.model} train step at {B}x{T}, S={positions}, V={cfg.vocab_size:,}, "
        f"compute_dtype={cfg.compute.dtype}"
    )
    print(
        f"wall {1e3 * wall:.1f} ms per step (traced); op time summed over threads "
        f"{summed / 1e6 / FLAGS.steps:.1f} ms per step\n"
    )
    header = f"{'ms/step':>9}{'share':>7}  {'operation':32} {'shape':28} op_name"
    print(header)
    print("-" * len(header))
    for name, ns in sorted(totals.items(), key=lambda kv: -kv[1])[: FLAGS.top]:
        shape, op_name = ops[name]
        print(f"{ns / 1e6 / FLAGS.steps:>9.1f}{ns / summed:>7.1%}  {name:32} {shape:28} {op_name[-90:]}")


if __name__ == "__main__":
    FLAGS.set_default("shape", "32x20")  # one window of a small CPU; --shape='' = the config's batch
    app.run(main)
