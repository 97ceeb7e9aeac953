"""Why the demo's heldout perplexity depended on luck: its last-step weights, checkpoint by checkpoint.

    python bench/demo_swings.py --root=/tmp/demo_swings --first=500          # ~10 min, 2 cores

Trains `configs/demo.py` (seed --seed) with the char CNN once per distinct token and over every token
(the same numbers up to float32 rounding in one step), a checkpoint every --every steps, the gradient
norm logged at every step. Then, for each checkpoint from --first on, and per direction on the whole
heldout set (full softmax, carried state, the last step's weights `TrainState.params`):

- the perplexity, split into the loss at the sentence boundary each direction predicts (`</S>` for the
  forward LM, `<S>` for the backward one) and the mean loss everywhere else;
- the boundary word's mean logit where it is the target, its softmax bias, row norm and Adagrad
  accumulators (mean over the row's, and the bias's);
- the target words whose loss moved the perplexity most since the previous checkpoint;

and over the run: how often the global norm clip (10) was active, and the heldout perplexity of the
weights' moving average (`TrainState.average`, `weight_average_decay`) beside the last step's.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # the repository root: bench/, configs/

from bench.common import train_demo  # noqa: E402
from elmo_jax.model.lstm import zero_state  # noqa: E402
from elmo_jax.model.params import BiLMParams  # noqa: E402
from elmo_jax.training.batch_feed import device_batch  # noqa: E402
from elmo_jax.training.heldout import heldout_stream  # noqa: E402
from elmo_jax.training.lm import lm_outputs  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("root", None, "Where the runs go (created).", required=True)
flags.DEFINE_integer("seed", 0, "config.seed.")
flags.DEFINE_integer("every", 10, "Checkpoint interval (steps).")
flags.DEFINE_integer("first", 500, "First checkpoint analysed.")
flags.DEFINE_string("out", None, "Also write the per-checkpoint figures as JSON here.")
ROWS = 32


def _train(workdir: str, distinct: bool) -> None:
    overrides = {
        "seed": FLAGS.seed,
        "distinct_tokens": distinct,
        "checkpoint_every_steps": FLAGS.every,
        "keep_checkpoints": 1000,
        "log_every_steps": 1,
    }
    train_demo(workdir, overrides)


@jax.jit
def _score(W, b, h, y):
    """(full-softmax loss, target logit) per row of h (N, P) for targets y (N,); W (V, P), b (V,) are
    arguments, so that one program serves every checkpoint."""
    logits = h @ W.T + b[None]
    true = jnp.take_along_axis(logits, y[:, None], 1)[:, 0]
    return jax.nn.logsumexp(logits, axis=1) - true, true


# Jitted once: run eagerly, each window's LSTM scan would be compiled again.
_lm_outputs = jax.jit(lm_outputs)


def _token_losses(params: dict, cfg, heldout, vocab) -> dict:
    """Per direction: (loss, target, target logit) of every heldout target, full softmax, carried state."""
    V = len(vocab)
    W, b = params["softmax"]["W"][:V], params["softmax"]["b"][:V]
    stream = heldout_stream(heldout, vocab, cfg, ROWS)  # the trainer's heldout pass: carried state
    lstm, bilm = zero_state(cfg.model, ROWS), BiLMParams(params["bilm"], cfg.model)
    out = {d: {"loss": [], "y": [], "logit": []} for d in (0, 1)}
    for window in stream:
        batch, _ = device_batch(window, cfg.model.max_characters_per_token)
        h, lstm = _lm_outputs(bilm, batch["char_ids"], batch["mask"], lstm, resets=batch["reset"])
        for d in (0, 1):
            mask = np.asarray(batch["mask"][d]).reshape(-1)
            y = np.asarray(batch["targets"][d]).reshape(-1)
            loss, logit = _score(W, b, h[d].reshape(-1, h.shape[-1]), jnp.asarray(y))
            for key, value in (("loss", loss), ("y", y), ("logit", logit)):
                out[d][key].append(np.asarray(value)[mask])
    return {d: {k: np.concatenate(v) for k, v in out[d].items()} for d in (0, 1)}


def _checkpoint_row(workdir: str, step: int, previous: dict | None, context: dict) -> tuple[dict, dict]:
    from elmo_jax.training.start import restore_checkpoint

    state = restore_checkpoint(workdir, step)[0]
    params = state.params
    accumulators = state.opt_state[1][0].sum_of_squares["softmax"]
    vocab = context["vocab"]
    losses = _token_losses(params, context["cfg"], context["heldout"], vocab)
    row = {"step": step}
    for d, (name, boundary) in enumerate((("forward", vocab.eos_id), ("backward", vocab.bos_id))):
        loss, y, logit = losses[d]["loss"], losses[d]["y"], losses[d]["logit"]
        at = y == boundary
        row[name] = {
            "perplexity": float(np.exp(loss.mean())),
            "boundary_loss": float(loss[at].mean()),
            "other_loss": float(loss[~at].mean()),
            "boundary_logit": float(logit[at].mean()),
            "boundary_bias": float(params["softmax"]["b"][boundary]),
            "boundary_row_norm": float(np.linalg.norm(np.asarray(params["softmax"]["W"][boundary]))),
            "boundary_accumulator_row_mean": float(np.mean(np.asarray(accumulators["W"][boundary]))),
            "boundary_accumulator_bias": float(accumulators["b"][boundary]),
        }
        if previous is not None:  # which target words moved the perplexity since the previous checkpoint
            delta = np.bincount(y, weights=loss - previous[d]["loss"], minlength=len(vocab)) / len(y)
            top = np.argsort(-np.abs(delta))[:3]
            row[name]["largest_moves"] = [(vocab.words[i], round(float(delta[i]), 4)) for i in top]
    return row, losses


def _clipping(workdir: str) -> dict:
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if '"train"' in line]
    out = {}
    for low, high in ((0, 100), (100, 300), (300, 600)):
        norms = [r["grad_norm"] for r in records if low < r["step"] <= high]
        out[f"steps {low + 1}-{high}"] = {
            "clipped": sum(n > 10.0 for n in norms),
            "of": len(norms),
            "median_norm": float(np.median(norms)),
        }
    return out


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from elmo_jax.data.training_corpus import open_training_data
    from elmo_jax.formats.vocab_file import Vocab
    from elmo_jax.training.heldout import heldout_perplexity
    from elmo_jax.training.start import load_trained

    os.makedirs(FLAGS.root, exist_ok=True)
    results = {}
    for distinct in (True, False):
        workdir = os.path.join(FLAGS.root, f"seed{FLAGS.seed}_distinct{int(distinct)}")
        _train(workdir, distinct)
        average, cfg, config, vocab_file, last = load_trained(workdir)
        context = {
            "cfg": cfg,
            "vocab": Vocab.load(vocab_file),
            "heldout": open_training_data(config.data, workdir, write_files=False).heldout,
        }
        rows, previous = [], None
        for step in range(FLAGS.first, last + 1, FLAGS.every):
            row, previous = _checkpoint_row(workdir, step, previous, context)
            rows.append(row)
            print(json.dumps({"distinct_tokens": distinct, **row}), flush=True)
        mean = heldout_perplexity(average, cfg, context["heldout"], context["vocab"], config.batch_size)
        results[f"distinct_tokens={distinct}"] = {
            "checkpoints": rows,
            "clipping": _clipping(workdir),
            "average_at_last_step": {k: mean[k] for k in ("forward_perplexity", "backward_perplexity")},
        }
        print(json.dumps({"distinct_tokens": distinct, "clipping": results[f"distinct_tokens={distinct}"]["clipping"]}))
        print(
            json.dumps(
                {"distinct_tokens": distinct, "average": results[f"distinct_tokens={distinct}"]["average_at_last_step"]}
            )
        )
    for name, result in results.items():
        header = "| step | forward ppl (</S> loss, rest) | backward ppl (<S> loss, rest; <S> logit at its targets) |"
        print(f"\n{name}: {header}")
        for r in result["checkpoints"]:
            f, b = r["forward"], r["backward"]
            print(
                f"| {r['step']} | {f['perplexity']:.1f} ({f['boundary_loss']:.2f}, {f['other_loss']:.3f}) | "
                f"{b['perplexity']:.1f} ({b['boundary_loss']:.2f}, {b['other_loss']:.3f}; {b['boundary_logit']:.2f}) |"
            )
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    app.run(main)
