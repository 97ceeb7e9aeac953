"""The demo's heldout perplexity next to a unigram model of the same corpus and vocabulary.

    python bench/demo_vs_unigram.py --workdir=runs/demo            # after `train.py --config=configs/demo.py`
    python bench/demo_vs_unigram.py --workdir=/tmp/d --train        # trains the demo first

The unigram model is estimated on the training sentences with the run's vocabulary (OOV -> <UNK>) and
add-one smoothing, over the same targets the biLM predicts: every word and `</S>` (forward; the
backward direction's targets have the same unigram distribution, with `<S>` in place of `</S>`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A demo training workdir.", required=True)
flags.DEFINE_bool("train", False, "Run `train.py --config=configs/demo.py` into --workdir first.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unigram_perplexity(train, heldout, vocab) -> float:
    counts = np.zeros(len(vocab), np.int64)
    for i in range(len(train)):
        np.add.at(counts, vocab.encode(train[i].split()), 1)
        counts[vocab.eos_id] += 1
    log_p = np.log((counts + 1) / (counts.sum() + len(vocab)))
    nll, n = 0.0, 0
    for i in range(len(heldout)):
        ids = vocab.encode(heldout[i].split() + ["</S>"])
        nll -= float(log_p[ids].sum())
        n += len(ids)
    return math.exp(nll / n)


def main(argv):
    del argv
    sys.path.insert(0, REPO)
    from configs import demo
    from elmo_jax.data.training_corpus import open_training_data

    if FLAGS.train:
        subprocess.run(
            [
                sys.executable,
                os.path.join(REPO, "train.py"),
                "--config=" + os.path.join(REPO, "configs/demo.py"),
                "--workdir=" + FLAGS.workdir,
            ],
            check=True,
        )
    evals = [json.loads(line) for line in open(os.path.join(FLAGS.workdir, "metrics.jsonl"), encoding="utf-8")]
    evals = [r for r in evals if r.get("kind") == "eval"]
    if not evals:
        raise SystemExit(f"error: no evaluation in {FLAGS.workdir}/metrics.jsonl; train first (--train)")
    data = open_training_data(demo.get_config().data, FLAGS.workdir, write_files=False)
    last = evals[-1]
    print(
        f"biLM after step {last['step']}: heldout perplexity {last['perplexity']:.1f} "
        f"(forward {last['forward_perplexity']:.1f}, backward {last['backward_perplexity']:.1f})"
    )
    print(
        f"unigram (add-one, same vocabulary of {len(data.vocab)}): "
        f"{unigram_perplexity(data.train, data.heldout, data.vocab):.1f}"
    )


if __name__ == "__main__":
    app.run(main)
