"""The demo's heldout perplexity per direction over seeds and summation orders: does training depend on luck?

    python bench/demo_seeds.py --root=/tmp/demo_seeds --out=bench/results_demo_seeds.json   # ~20 min, 2 cores

Trains `configs/demo.py` (600 steps on the embedded default corpus) once per seed (--seeds) and
summation order: the char CNN once per distinct token or over every token (`distinct_tokens` True and
False: the same numbers up to float32 rounding in one step), and on --devices CPU devices (8 forced
host devices: the batch split 8 ways, other sums in other orders). Each run is `python train.py` in a
process of its own. For each, the full-softmax heldout perplexity per direction of two weights of the
final checkpoint, both on the whole heldout set:

- `last step`: the parameters the last step left, what the trainer evaluated and exported before the
  weight average (`weight_average_decay` 0, bilm-tf's recipe; training itself is the same either way);
- `average`: the weights' moving average (`weight_average_decay` of configs/default.py), what the
  trainer evaluates and exports now.

It prints a table per weight kind, with each direction's spread (largest / smallest - 1) over every run,
and writes every figure as JSON with --out.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys

from absl import app, flags, logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # the repository root: bench/, configs/

from bench.common import train_demo  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("root", None, "Where the runs go (created).", required=True)
flags.DEFINE_list("seeds", ["0", "1", "2"], "config.seed of each run.")
flags.DEFINE_list("distinct_tokens", ["True", "False"], "config.distinct_tokens values (summation orders).")
flags.DEFINE_list("devices", ["1", "8"], "CPU device counts (config.mesh.data); 8 runs only with distinct tokens on.")
flags.DEFINE_integer("jobs", 2, "Runs at a time.")
flags.DEFINE_string("out", None, "Also write the results as JSON here.")


def _runs() -> list[dict]:
    runs = []
    for devices in map(int, FLAGS.devices):
        for seed in map(int, FLAGS.seeds):
            for distinct in FLAGS.distinct_tokens:
                if devices > 1 and distinct != "True":
                    continue  # the default's order on another device count is what differs there
                runs.append({"seed": seed, "distinct_tokens": distinct == "True", "devices": devices})
    return runs


def _workdir(run: dict) -> str:
    return os.path.join(FLAGS.root, f"seed{run['seed']}_distinct{int(run['distinct_tokens'])}_dev{run['devices']}")


def _train(run: dict) -> None:
    """`python train.py` of configs/demo.py for one run, in a process of its own (its device count)."""
    overrides = {"seed": run["seed"], "distinct_tokens": run["distinct_tokens"], "mesh.data": run["devices"]}
    train_demo(_workdir(run), overrides, devices=run["devices"])


def _evaluate(run: dict) -> dict:
    """The final checkpoint's heldout perplexities per direction, of the last step's weights and of the average."""
    from elmo_jax.data.training_corpus import open_training_data
    from elmo_jax.formats.vocab_file import Vocab
    from elmo_jax.training.heldout import heldout_perplexity
    from elmo_jax.training.start import load_trained, restore_checkpoint

    workdir = _workdir(run)
    average, cfg, config, vocab_file, step = load_trained(workdir)
    last = restore_checkpoint(workdir, step)[0].params
    heldout = open_training_data(config.data, workdir, write_files=False).heldout
    vocab = Vocab.load(vocab_file)
    row = {**run, "step": step}
    for name, params in (("last_step", last), ("average", average)):
        r = heldout_perplexity(params, cfg, heldout, vocab, config.batch_size)
        row[name] = {k: r[k] for k in ("forward_perplexity", "backward_perplexity", "perplexity", "tokens")}
    return row


def _table(rows: list[dict], kind: str) -> str:
    lines = [
        f"{kind}:",
        "| seed | distinct tokens | devices | forward | backward | both |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r[kind]
        lines.append(
            f"| {r['seed']} | {'on' if r['distinct_tokens'] else 'off'} | {r['devices']} | "
            f"{p['forward_perplexity']:.1f} | {p['backward_perplexity']:.1f} | {p['perplexity']:.1f} |"
        )
    for direction in ("forward", "backward"):
        values = [r[kind][f"{direction}_perplexity"] for r in rows]
        lines.append(f"{direction}: {min(values):.1f} .. {max(values):.1f}, spread {max(values) / min(values) - 1:.1%}")
    gaps = [r[kind]["backward_perplexity"] / r[kind]["forward_perplexity"] - 1 for r in rows]
    lines.append(f"backward / forward - 1: {min(gaps):+.1%} .. {max(gaps):+.1%}")
    return "\n".join(lines)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    os.makedirs(FLAGS.root, exist_ok=True)
    runs = _runs()
    with concurrent.futures.ThreadPoolExecutor(FLAGS.jobs) as pool:
        list(pool.map(_train, runs))
    rows = []
    for run in runs:
        rows.append(_evaluate(run))
        print(json.dumps(rows[-1]), flush=True)
    for kind in ("last_step", "average"):
        print("\n" + _table(rows, kind))
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    app.run(main)
