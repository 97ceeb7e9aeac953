"""Fine-tuning with and without the source run's Adagrad accumulators: perplexity on the old and the new
domain before and after, for each way of starting.

    python bench/finetune_optimizer.py --workdir=/tmp/ft          # ~15 min of one CPU core at the defaults

Run again with the same --workdir, the finished base run is reused (it resumes at its last step), so
e.g. `--hdf5_learning_rates=0.05 --noworkdir_runs` adds runs without training the base again.

1. base: configs/demo.py trained --base_steps on the embedded default corpus (Python docstrings; the
   "old" domain), vocabulary counted from it.
2. the "new" domain: `bench/domain_text.py` sentences of --new_domain (default: the licence texts and
   copyright notices of a Debian/Ubuntu machine), split 1 in 20 into heldout.
3. fine-tuning, --finetune_steps each, on the new domain with the base's vocabulary (so a workdir's
   softmax is kept), started from
     workdir_kept    the base workdir, Adagrad accumulators continued (init_from_optimizer=True, the default;
                     bilm-tf's restart.py),
     workdir_fresh   the base workdir, accumulators restarted at 1.0 (init_from_optimizer=False),
     hdf5_lrX        the base's exported model directory (options.json + weights.hdf5: no optimiser state, a
                     fresh softmax), learning rate X for each X of --hdf5_learning_rates.
4. full-softmax heldout perplexity (carried state, as bilm-tf reports it) of each on both domains'
   heldout sets (the old one capped at --old_heldout_sentences).

Also printed: the base's effective Adagrad step sizes, learning_rate / sqrt(accumulator), per weight
(median and 10th percentile over the biLM's weights and the softmax rows of words seen in training).
Everything runs in this process on the default device; timings are not the point.
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
flags.DEFINE_integer("base_steps", 1000, "Steps of the base run on the old domain.")
flags.DEFINE_integer("finetune_steps", 300, "Steps of each fine-tuning run on the new domain.")
flags.DEFINE_list("hdf5_learning_rates", ["0.2", "0.05", "0.02"], "Learning rates of the runs from the HDF5 model.")
flags.DEFINE_string(
    "new_domain", "/usr/share/doc/*/copyright,/usr/share/common-licenses/*", "Globs of new-domain text."
)
flags.DEFINE_integer("old_heldout_sentences", 1000, "Cap on the old domain's heldout sentences.")
flags.DEFINE_bool("workdir_runs", True, "Run workdir_kept and workdir_fresh (--noworkdir_runs: only the HDF5 runs).")
flags.DEFINE_string("out", None, "Also write the results as JSON here.")


def perplexity(workdir: str, path: str) -> float:
    from elmo_jax.data.text_files import iter_sentences
    from elmo_jax.formats.vocab_file import Vocab
    from elmo_jax.training.heldout import heldout_perplexity
    from elmo_jax.training.start import load_trained

    params, cfg, config, vocab_file, _ = load_trained(workdir)
    sentences = [" ".join(tokens) for tokens in iter_sentences(path)]
    return heldout_perplexity(params, cfg, sentences, Vocab.load(vocab_file), config.batch_size)["perplexity"]


def effective_steps(workdir: str) -> dict[str, float]:
    """Median and 10th percentile of learning_rate / sqrt(accumulator) over the biLM's weights and over the
    softmax rows of words the run saw (rows never a target or candidate keep their initial value)."""
    import jax
    import numpy as np

    from elmo_jax.training.start import restore_checkpoint

    state, _, meta = restore_checkpoint(workdir)
    lr = meta["config"]["learning_rate"]
    accumulators = state.opt_state[1][0].sum_of_squares
    bilm = np.concatenate([np.ravel(x) for x in jax.tree.leaves(accumulators["bilm"])])
    softmax = np.asarray(accumulators["softmax"]["W"])[: meta["vocab_size"]].max(axis=1)
    out = {}
    for name, acc in (("bilm", bilm), ("softmax_rows", softmax)):
        steps = lr / np.sqrt(acc)
        out[f"{name}_median"], out[f"{name}_p10"] = float(np.median(steps)), float(np.percentile(steps, 10))
    return out


def main(argv):
    del argv
    from bench.domain_text import write_domain
    from configs import demo
    from elmo_jax.training.loop import train_and_evaluate

    logging.set_verbosity(logging.WARNING)
    root = os.path.abspath(FLAGS.workdir)
    cache = os.path.join(root, "cache")
    base = os.path.join(root, "base")
    new = write_domain(FLAGS.new_domain, os.path.join(root, "new_domain"))
    print("new domain:", {k: f"{n} sentences, {t} tokens" for k, (_, n, t) in new.items()}, flush=True)

    def config_for(**overrides):
        config = demo.get_config()
        config.data.cache_dir = cache
        config.update_from_flattened_dict(overrides)
        return config

    started = time.perf_counter(), time.process_time()
    train_and_evaluate(config_for(num_train_steps=FLAGS.base_steps, checkpoint_every_steps=FLAGS.base_steps), base)
    old_heldout = os.path.join(root, "old_heldout.txt")
    with open(os.path.join(cache, "default_corpus", "heldout.txt"), encoding="utf-8") as f:
        lines = f.readlines()[: FLAGS.old_heldout_sentences]
    with open(old_heldout, "w", encoding="utf-8") as f:
        f.writelines(lines)
    heldout = {"old": old_heldout, "new": new["heldout"][0]}
    results = {"base": {domain: perplexity(base, path) for domain, path in heldout.items()}}
    results["base"]["effective_steps"] = effective_steps(base)
    print("base:", json.dumps(results["base"]), flush=True)

    finetune = dict(
        num_train_steps=FLAGS.finetune_steps,
        checkpoint_every_steps=FLAGS.finetune_steps,
        **{
            "data.train_files": new["train"][0],
            "data.heldout_files": new["heldout"][0],
            "data.vocab_file": os.path.join(base, "vocab.txt"),
            "data.max_vocab_size": 0,
        },
    )
    runs = {
        **(
            {
                "workdir_kept": dict(init_from=base, init_from_optimizer=True),
                "workdir_fresh": dict(init_from=base, init_from_optimizer=False),
            }
            if FLAGS.workdir_runs
            else {}
        ),
        **{
            f"hdf5_lr{lr}": dict(init_from=os.path.join(base, "export"), learning_rate=float(lr))
            for lr in FLAGS.hdf5_learning_rates
        },
    }
    for name, overrides in runs.items():
        workdir = os.path.join(root, name)
        train_and_evaluate(config_for(**finetune, **overrides), workdir)
        results[name] = {domain: perplexity(workdir, path) for domain, path in heldout.items()}
        print(f"{name}:", json.dumps(results[name]), flush=True)
    results["seconds"] = {"wall": time.perf_counter() - started[0], "cpu": time.process_time() - started[1]}

    print(f"\n| start | old domain (docstrings) | new domain ({FLAGS.new_domain.split(',')[0]}) |\n|---|---|---|")
    for name, r in results.items():
        if name != "seconds":
            print(f"| {name} | {r['old']:.1f} | {r['new']:.1f} |")
    print(f"\n{results['seconds']['wall']:.0f} s wall, {results['seconds']['cpu']:.0f} s CPU")
    if FLAGS.out:
        with open(FLAGS.out, "w", encoding="utf-8") as f:
            json.dump({"flags": FLAGS.flag_values_dict(), "results": results}, f, indent=1, default=str)


if __name__ == "__main__":
    app.run(main)
