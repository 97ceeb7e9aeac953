"""The demo's heldout perplexity next to a unigram model of the same corpus and vocabulary.

    python bench/demo_vs_unigram.py --workdir=runs/demo            # after `train.py --config=configs/demo.py`
    python bench/demo_vs_unigram.py --workdir=/tmp/d --train        # trains the demo first

The unigram model is `elmo_jax.training.heldout.unigram_perplexity` (what training logs beside each
evaluation): estimated on the training sentences with the run's vocabulary (OOV -> <UNK>) and add-one
smoothing, over the same targets the biLM predicts: every word and `</S>` (forward; the backward
direction's targets have the same unigram distribution, with `<S>` in place of `</S>`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A demo training workdir.", required=True)
flags.DEFINE_bool("train", False, "Run `train.py --config=configs/demo.py` into --workdir first.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    del argv
    sys.path.insert(0, REPO)
    from configs import demo
    from elmo_jax.data.training_corpus import open_training_data
    from elmo_jax.training.heldout import unigram_counts, unigram_perplexity

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
        f"{unigram_perplexity(unigram_counts(data.train, data.vocab), data.heldout, data.vocab):.1f}"
    )


if __name__ == "__main__":
    app.run(main)
