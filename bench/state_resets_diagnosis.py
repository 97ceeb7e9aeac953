"""Why a biLM trained without state resets can score a full-softmax perplexity of ~1e10 in one direction
while its sampled training loss looks normal (issue #18; bench/RESULTS.md, "State resets").

    python bench/state_resets_diagnosis.py --root=/tmp/resets_diag --runs=0:0 --steps=600
    python bench/state_resets_diagnosis.py --root=/tmp/resets_diag --runs=0:1,0.05:1,0:2,0.05:2 --steps=400

Each run (state_reset_probability:seed) trains configs/demo.py with a checkpoint every --every steps, then
prints, per checkpoint, the forward/backward full-softmax perplexity on the first 300 heldout sentences
(carried state and from a zero state), and for the last one: the forward direction's per-token loss
quantiles, which words are the argmax where the loss is above 20 nats, the median norm of each
direction's top-layer outputs, and the norms and biases of the offending softmax rows.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import numpy as np
from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_string("root", None, "Where the runs go (created).", required=True)
flags.DEFINE_list("runs", ["0:0"], "state_reset_probability:seed of each run.")
flags.DEFINE_integer("steps", 600, "Training steps per run.")
flags.DEFINE_integer("every", 200, "Checkpoint (and evaluation) interval.")
HELDOUT_SENTENCES, ROWS, BIG_LOSS = 300, 32, 20.0


def train(p: float, seed: int) -> str:
    from configs import demo
    from elmo_jax.training.loop import train_and_evaluate

    config = demo.get_config()
    config.update_from_flattened_dict(
        {
            "seed": seed,
            "state_reset_probability": p,
            "num_train_steps": FLAGS.steps,
            "checkpoint_every_steps": FLAGS.every,
            "data.cache_dir": os.path.join(FLAGS.root, "cache"),
        }
    )
    workdir = os.path.join(FLAGS.root, f"p{p:g}_s{seed}")
    train_and_evaluate(config, workdir)
    return workdir


def forward_analysis(params, cfg, sentences, vocab) -> dict:
    """Per-token forward losses from a zero state, the argmax words where they are large, output norms."""
    from elmo_jax.model.lstm import zero_state
    from elmo_jax.model.params import BiLMParams
    from elmo_jax.training.batch_feed import device_batch
    from elmo_jax.training.heldout import heldout_stream
    from elmo_jax.training.lm import lm_outputs
    from elmo_jax.training.softmax import full_softmax_loss

    stream = heldout_stream(sentences, vocab, cfg, ROWS, from_zero_state=True)
    lstm, bilm = zero_state(cfg.model, ROWS), BiLMParams(params["bilm"], cfg.model)
    W, b, V = params["softmax"]["W"], params["softmax"]["b"], len(vocab)
    losses, argmax, norms = [], [], {0: [], 1: []}
    for window in stream:
        batch, _ = device_batch(window, cfg.model.max_characters_per_token)
        out, lstm = lm_outputs(bilm, batch["char_ids"], batch["mask"], lstm, resets=batch["reset"])
        for d in (0, 1):
            mask = np.asarray(batch["mask"][d]).reshape(-1)
            h = out[d].reshape(-1, out.shape[-1])
            norms[d].append(np.linalg.norm(np.asarray(h), axis=1)[mask])
            if d == 0:
                y = batch["targets"][0].reshape(-1)
                losses.append(np.asarray(full_softmax_loss(W, b, h, y, V))[mask])
                argmax.append(np.asarray(h @ W[:V].T + b[:V]).argmax(1)[mask])
    loss, argmax = np.concatenate(losses), np.concatenate(argmax)
    big = loss > BIG_LOSS
    row_norms, biases = np.linalg.norm(np.asarray(W[:V]), axis=1), np.asarray(b[:V])
    top = Counter(argmax[big].tolist()).most_common(5)
    return {
        "forward_loss_quantiles_50_90_99_max": np.round(np.quantile(loss, [0.5, 0.9, 0.99, 1.0]), 2).tolist(),
        "tokens_over_20_nats": f"{int(big.sum())} of {len(loss)}",
        "argmax_words_there": [(vocab.words[i], n) for i, n in top],
        "their_row_norm_and_bias": [
            (vocab.words[i], round(float(row_norms[i]), 2), round(float(biases[i]), 2)) for i, _ in top
        ],
        "median_row_norm": round(float(np.median(row_norms)), 2),
        "median_output_norm_forward_backward": [round(float(np.median(np.concatenate(norms[d]))), 1) for d in (0, 1)],
    }


def main(argv):
    del argv
    from elmo_jax.data.training_corpus import open_training_data
    from elmo_jax.formats.vocab_file import Vocab
    from elmo_jax.training.heldout import heldout_perplexity
    from elmo_jax.training.start import load_trained

    logging.set_verbosity(logging.WARNING)
    for run in FLAGS.runs:
        p, seed = float(run.split(":")[0]), int(run.split(":")[1])
        workdir = train(p, seed)
        checkpoints = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())
        for step in checkpoints:
            params, cfg, run_config, vocab_file, _ = load_trained(workdir, step)
            heldout = open_training_data(run_config.data, workdir, write_files=False).heldout
            vocab = Vocab.load(vocab_file)
            sentences = [heldout[i] for i in range(min(HELDOUT_SENTENCES, len(heldout)))]
            row = {"p": p, "seed": seed, "step": step}
            for name, zero in (("carried_fw_bw", False), ("zero_state_fw_bw", True)):
                r = heldout_perplexity(params, cfg, sentences, vocab, ROWS, from_zero_state=zero)
                row[name] = [round(r["forward_perplexity"], 1), round(r["backward_perplexity"], 1)]
            print(json.dumps(row), flush=True)
        print(json.dumps({"p": p, "seed": seed, **forward_analysis(params, cfg, sentences, vocab)}), flush=True)


if __name__ == "__main__":
    app.run(main)
