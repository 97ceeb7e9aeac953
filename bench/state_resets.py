"""What `state_reset_probability` buys: heldout perplexity read the way bilm-tf evaluates (each row's state
carried across sentences) and the way `embed` reads text (every sentence from a zero state), for models
trained with and without resets.

    python bench/state_resets.py --workdir=/tmp/resets                 # ~2 x 600 demo steps

Each probability of --probabilities trains configs/demo.py (the embedded default corpus: Python
standard-library docstrings, real English) for --steps steps with the same seed, then evaluates the
final checkpoint on the whole heldout set both ways with the full softmax (`heldout.heldout_perplexity`,
`from_zero_state`). With --seeds > 1 each setting is trained once per seed.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags, logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Where the runs go (created).", required=True)
flags.DEFINE_list("probabilities", ["0.0", "0.05"], "state_reset_probability values to train with.")
flags.DEFINE_integer("steps", 600, "Training steps per run (configs/demo.py's default).")
flags.DEFINE_integer("seeds", 1, "Runs per probability (seeds 0, 1, ...).")
flags.DEFINE_string("out", None, "Also write the results as JSON here.")


def main(argv):
    del argv
    from configs import demo
    from elmo_jax.data.training_corpus import open_training_data
    from elmo_jax.formats.vocab_file import Vocab
    from elmo_jax.training.heldout import heldout_perplexity
    from elmo_jax.training.loop import train_and_evaluate
    from elmo_jax.training.start import load_trained

    logging.set_verbosity(logging.WARNING)
    root = os.path.abspath(FLAGS.workdir)
    results = []
    for seed in range(FLAGS.seeds):
        for p in map(float, FLAGS.probabilities):
            config = demo.get_config()
            config.update_from_flattened_dict(
                {
                    "seed": seed,
                    "state_reset_probability": p,
                    "num_train_steps": FLAGS.steps,
                    "checkpoint_every_steps": FLAGS.steps,
                    "data.cache_dir": os.path.join(root, "cache"),
                }
            )
            workdir = os.path.join(root, f"p{p:g}_seed{seed}")
            start = time.process_time()
            train_and_evaluate(config, workdir)
            params, cfg, run_config, vocab_file, _ = load_trained(workdir)
            heldout = open_training_data(run_config.data, workdir, write_files=False).heldout
            vocab = Vocab.load(vocab_file)
            row = {"probability": p, "seed": seed}
            for name, zero in (("carried", False), ("zero_state", True)):
                r = heldout_perplexity(params, cfg, heldout, vocab, config.batch_size, from_zero_state=zero)
                for key in ("perplexity", "forward_perplexity", "backward_perplexity"):
                    row[f"{name}_{key}"] = r[key]
                row["tokens"] = r["tokens"]
            row["cpu_s"] = time.process_time() - start
            results.append(row)
            print(json.dumps(row), flush=True)

    print("\n| state_reset_probability | seed | heldout ppl, carried (fw / bw) | heldout ppl, zero state (fw / bw) |")
    print("|---|---|---|---|")
    for r in results:
        print(
            f"| {r['probability']:g} | {r['seed']} | {r['carried_perplexity']:.1f} "
            f"({r['carried_forward_perplexity']:.1f} / {r['carried_backward_perplexity']:.1f}) "
            f"| {r['zero_state_perplexity']:.1f} "
            f"({r['zero_state_forward_perplexity']:.1f} / {r['zero_state_backward_perplexity']:.1f}) |"
        )
    if FLAGS.out:
        with open(FLAGS.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    app.run(main)
