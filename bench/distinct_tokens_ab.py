"""The train step with the char CNN over every token against over each distinct token, in one process.

    python bench/distinct_tokens_ab.py                          # configs/bilm_small.py at 32 x 20, float32
    python bench/distinct_tokens_ab.py --model=large --shape=8x20 --rounds=3

One window of random sentences (`bench.workloads.synthetic_window`: words drawn Zipf-like from 5,000
types), the same fresh state for both sides; `train_step` with `distinct_tokens` None (every token) and
with the window's slots (`batch_feed.distinct_bucket`, one device) alternate, each the best of 3 steps'
process CPU time per round (CPU time: on a shared machine it moves far less than the wall time). Prints
the window's distinct tokens and slots, each side's best step and the median over rounds of every / distinct.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/, configs/

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from bench.workloads import synthetic_window  # noqa: E402
from elmo_jax.training import settings  # noqa: E402
from elmo_jax.training.batch_feed import device_batch, distinct_bucket  # noqa: E402
from elmo_jax.training.train_step import init_train_state, train_step  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "small", ["demo", "small", "medium", "large"], "Training config (configs/bilm_MODEL.py).")
flags.DEFINE_string("shape", "32x20", "Window BxT.")
flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "train_step's matmul dtype.")
flags.DEFINE_integer("vocab_size", 50_000, "Softmax rows (the window's words are among them).")
flags.DEFINE_integer("rounds", 5, "Alternating pairs.")


def main(argv):
    del argv
    module = "configs.demo" if FLAGS.model == "demo" else f"configs.bilm_{FLAGS.model}"
    config = importlib.import_module(module).get_config()
    config.compute_dtype = FLAGS.compute_dtype
    B, T = (int(x) for x in FLAGS.shape.split("x"))
    cfg = dataclasses.replace(settings.step_config(config, FLAGS.vocab_size), unroll_steps=T)
    optimizer = settings.optimizer(config)
    C = cfg.model.max_characters_per_token
    batch, positions = device_batch(synthetic_window(B, T, C, cfg.vocab_size), C)
    slots = distinct_bucket(batch, 1)
    exact = len(np.unique(np.swapaxes(batch["char_ids"], 0, 1).reshape(-1, C), axis=0))
    print(f"{FLAGS.model} {B}x{T} {FLAGS.compute_dtype}: {exact} distinct of {2 * B * T} tokens, {slots} slots")
    batch = jax.device_put(batch)
    sides = {"every": None, "distinct": slots}
    states = {k: init_train_state(jax.random.key(0), cfg, optimizer, B) for k in sides}

    def step(side):
        s, m = train_step(
            states[side], batch, cfg=cfg, optimizer=optimizer, content_positions=positions, distinct_tokens=sides[side]
        )
        jax.block_until_ready((s, m))
        states[side] = s

    for side in sides:  # compile and warm up
        step(side)
        step(side)
    best = {k: [] for k in sides}
    for _ in range(FLAGS.rounds):
        for side in sides:
            times = []
            for _ in range(3):
                start = time.process_time()
                step(side)
                times.append(time.process_time() - start)
            best[side].append(min(times))
    ratios = [a / b for a, b in zip(best["every"], best["distinct"])]
    print(
        f"best step, process CPU s: every token {min(best['every']):.3f}, distinct {min(best['distinct']):.3f}; "
        f"median every / distinct {statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})"
    )


if __name__ == "__main__":
    app.run(main)
