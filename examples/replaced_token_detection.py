"""A downstream task with and without ELMo: which tokens of a sentence were replaced by another word?

    python train.py --config=configs/demo.py --workdir=runs/demo          # the biLM (2-3 min on CPU)
    python examples/replaced_token_detection.py --biLM=runs/demo/export    # both taggers (a few min)

The task is made from text the biLM never trained on: the heldout split of the embedded default corpus
(`elmo_jax.default_corpus`, which `configs/demo.py` trains on; or --text=FILE, one tokenized sentence
per line). Sentences are split into task-train and task-test sets; in each copy of a sentence every
token is replaced with probability --replace_prob by a word drawn from the task-train text's unigram
distribution (a common word, so the replacement is rarely odd in itself; only the context gives it
away). A BiLSTM tagger labels each token "original" or "replaced", trained twice with the same seed,
batches and steps:

  (a) randomly initialised word embeddings only (words of the task-train text; others are UNK);
  (b) the same, concatenated with ELMo (`ElmoTaskLayers`: the frozen biLM and one learned scalar mix).

It prints token accuracy and precision/recall/F1 of the "replaced" class on the task-test set, one
JSON line per model, and the figures as a table. Bad flags and files exit 1 with one line of error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # a checkout runs it without installing

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS

PAD, UNK = 0, 1
LENGTH_BUCKET = 16  # batches are padded to a multiple of this many tokens, to bound recompilation


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a run depends on (the flags, for callers that do not parse any)."""

    bilm_dir: str
    text: str = ""
    steps: int = 600
    batch_size: int = 32
    train_copies: int = 4
    test_copies: int = 2
    test_fraction: float = 0.2
    replace_prob: float = 0.15
    seed: int = 0
    learning_rate: float = 3e-3
    max_tokens: int = 60


@dataclasses.dataclass
class TaskData:
    """Corrupted sentences and their labels (1 = replaced)."""

    sentences: list[list[str]]
    labels: list[np.ndarray]


def read_sentences(path: str, max_tokens: int) -> list[list[str]]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--text: {path} is not a file")
    with open(path, encoding="utf-8") as f:
        sentences = [line.split()[:max_tokens] for line in f if line.strip()]
    if len(sentences) < 10:
        raise ValueError(f"--text: {path} has {len(sentences)} sentences; the task needs at least 10")
    return sentences


def split_by_hash(sentences: list[list[str]], test_fraction: float) -> tuple[list[list[str]], list[list[str]]]:
    """(train, test) by a hash of each sentence's text, so the split does not depend on the file order."""
    train, test = [], []
    for sentence in sentences:
        digest = hashlib.sha256(" ".join(sentence).encode("utf-8")).digest()
        (test if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else train).append(sentence)
    if not train or not test:
        raise ValueError(f"--test_fraction={test_fraction} leaves an empty train or test set")
    return train, test


def corrupt(
    sentences: list[list[str]], copies: int, pool: np.ndarray, prob: float, rng: np.random.Generator
) -> TaskData:
    """`copies` corrupted versions of each sentence; replacements are drawn from `pool` (a token list,
    so by unigram frequency) and always differ from the token they replace."""
    out, labels = [], []
    for _ in range(copies):
        for sentence in sentences:
            replaced = rng.random(len(sentence)) < prob
            tokens = list(sentence)
            for t in np.nonzero(replaced)[0]:
                word = tokens[t]
                while word == tokens[t]:
                    word = str(pool[rng.integers(len(pool))])
                tokens[t] = word
            out.append(tokens)
            labels.append(replaced.astype(np.int32))
    return TaskData(out, labels)


def make_task(settings: Settings) -> tuple[TaskData, TaskData]:
    text = settings.text
    if not text:
        from elmo_jax.data import default_corpus

        with tempfile.TemporaryDirectory() as tmp:
            _, heldout = default_corpus.build_default_corpus(tmp)
            sentences = read_sentences(heldout, settings.max_tokens)
    else:
        sentences = read_sentences(text, settings.max_tokens)
    train, test = split_by_hash(sentences, settings.test_fraction)
    rng = np.random.default_rng(settings.seed)
    pool = np.array([w for s in train for w in s])
    return (
        corrupt(train, settings.train_copies, pool, settings.replace_prob, rng),
        corrupt(test, settings.test_copies, pool, settings.replace_prob, rng),
    )


def encode(data: TaskData, word_index: dict[str, int], rows: Sequence[int], max_chars: int):
    """Word ids, char ids, labels and mask of the given sentences, padded to a multiple of LENGTH_BUCKET."""
    import elmo_jax

    sentences = [data.sentences[i] for i in rows]
    T = -(-max(len(s) for s in sentences) // LENGTH_BUCKET) * LENGTH_BUCKET
    words = np.zeros((len(rows), T), np.int32)
    labels = np.zeros((len(rows), T), np.int32)
    for b, i in enumerate(rows):
        words[b, : len(data.sentences[i])] = [word_index.get(w, UNK) for w in data.sentences[i]]
        labels[b, : len(data.labels[i])] = data.labels[i]
    chars = elmo_jax.batch_to_ids(sentences, max_chars)
    chars = np.pad(chars, ((0, 0), (0, T - chars.shape[1]), (0, 0)))
    return words, chars, labels, words != PAD


def build_tagger(n_words: int, bilm):
    """A BiLSTM tagger class over word embeddings, plus ELMo when `bilm` is given."""
    import flax.linen as nn
    import jax.numpy as jnp

    import elmo_jax

    class Tagger(nn.Module):
        @nn.compact
        def __call__(self, words, chars, mask, *, deterministic: bool = True):
            x = nn.Embed(n_words, 64, name="word_embedding")(words)  # (B, T, 64)
            if bilm is not None:
                (elmo,), _ = elmo_jax.ElmoTaskLayers(bilm=bilm, dropout=0.5, l2_coef=0.001, name="elmo")(
                    chars, deterministic=deterministic
                )  # (B, T, 2P)
                x = jnp.concatenate([x, elmo], axis=-1)
            x = nn.Dropout(0.3)(x, deterministic=deterministic)
            lengths = jnp.sum(mask, axis=1)
            x = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(64)), nn.RNN(nn.OptimizedLSTMCell(64)))(
                x, seq_lengths=lengths
            )  # (B, T, 128)
            return nn.Dense(2)(x)  # (B, T, 2) logits

    return Tagger()


def train_and_test(
    name: str, bilm, train: TaskData, test: TaskData, word_index: dict[str, int], settings: Settings, max_chars: int
) -> dict:
    """Trains one tagger and returns its test figures."""
    import jax
    import jax.numpy as jnp
    import optax

    import elmo_jax

    model = build_tagger(len(word_index) + 2, bilm)
    key = jax.random.key(settings.seed)
    words, chars, _, mask = encode(train, word_index, [0], max_chars)
    variables = model.init(key, words, chars, mask)
    params = variables["params"]
    frozen = {k: v for k, v in variables.items() if k != "params"}  # the "bilm" collection, when ELMo is used
    optimizer = optax.adam(settings.learning_rate)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, words, chars, labels, mask, key):
        def loss_fn(p):
            logits, state = model.apply(
                {"params": p, **frozen},
                words,
                chars,
                mask,
                deterministic=False,
                rngs={"dropout": key},
                mutable=["losses"],
            )
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            return jnp.sum(jnp.where(mask, ce, 0.0)) / jnp.sum(mask) + elmo_jax.elmo_penalty(state)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    predict = jax.jit(lambda p, w, c, m: jnp.argmax(model.apply({"params": p, **frozen}, w, c, m), axis=-1))

    order_rng = np.random.default_rng(settings.seed)  # the same batches for both taggers
    order = np.zeros(0, np.int64)
    start = time.perf_counter()
    for i in range(settings.steps):
        if len(order) < settings.batch_size:
            order = np.concatenate([order, order_rng.permutation(len(train.sentences))])
        rows, order = order[: settings.batch_size], order[settings.batch_size :]
        batch = encode(train, word_index, rows, max_chars)
        params, opt_state, loss = step(params, opt_state, *batch, jax.random.fold_in(key, i))
    jax.block_until_ready(loss)
    train_s = time.perf_counter() - start

    counts = np.zeros((2, 2), np.int64)  # [gold, predicted]
    for lo in range(0, len(test.sentences), 64):
        words, chars, labels, mask = encode(test, word_index, range(lo, min(lo + 64, len(test.sentences))), max_chars)
        predicted = np.asarray(predict(params, words, chars, mask))
        np.add.at(counts, (labels[mask], predicted[mask]), 1)
    tp, fp, fn = counts[1, 1], counts[0, 1], counts[1, 0]
    precision = tp / max(tp + fp, 1)
    recall = tp / max(tp + fn, 1)
    return {
        "model": name,
        "accuracy": float(np.trace(counts) / counts.sum()),
        "precision": float(precision),
        "recall": float(recall),
        "f1": float(2 * precision * recall / max(precision + recall, 1e-12)),
        "final_train_loss": float(loss),
        "test_tokens": int(counts.sum()),
        "replaced_share": float(counts[1].sum() / counts.sum()),
        "train_seconds": round(train_s, 1),
    }


def load_bilm(bilm_dir: str):
    import elmo_jax

    if not bilm_dir:
        raise ValueError("--biLM is required: the directory train.py exports (WORKDIR/export)")
    if not os.path.isdir(bilm_dir):
        raise FileNotFoundError(
            f"--biLM: {bilm_dir} is not a directory (expected WORKDIR/export with options.json and weights.hdf5)"
        )
    return elmo_jax.load_hdf5(os.path.join(bilm_dir, "options.json"), os.path.join(bilm_dir, "weights.hdf5"))


def run(settings: Settings) -> list[dict]:
    """Builds the task, trains both taggers and returns their figures (also printed)."""
    bilm = load_bilm(settings.bilm_dir)
    if settings.steps < 1 or settings.batch_size < 1 or not 0 < settings.replace_prob < 1:
        raise ValueError("--steps and --batch_size must be >= 1 and --replace_prob in (0, 1)")
    train, test = make_task(settings)
    words = sorted({w for s in train.sentences for w in s})
    word_index = {w: i + 2 for i, w in enumerate(words)}  # 0 padding, 1 UNK
    print(
        f"task: {len(train.sentences)} train / {len(test.sentences)} test sentences, "
        f"{sum(len(s) for s in test.sentences)} test tokens, {len(word_index)} word types",
        flush=True,
    )
    max_chars = bilm.config.max_characters_per_token
    results = []
    for name, features in (("words only", None), ("words + ELMo", bilm)):
        result = train_and_test(name, features, train, test, word_index, settings, max_chars)
        print(json.dumps(result), flush=True)
        results.append(result)
    print(f"{'model':14} {'accuracy':>9} {'precision':>9} {'recall':>9} {'F1':>9}")
    for r in results:
        print(f"{r['model']:14} {r['accuracy']:9.4f} {r['precision']:9.4f} {r['recall']:9.4f} {r['f1']:9.4f}")
    print(f"(always 'original' would score accuracy {1 - results[0]['replaced_share']:.4f}, F1 0)")
    return results


def define_flags() -> None:
    """The CLI's flags, defined only when run as a script (so importing the module defines none)."""
    flags.DEFINE_string(
        "biLM", None, "Directory with the biLM's options.json and weights.hdf5 (train.py's WORKDIR/export)."
    )
    flags.DEFINE_string(
        "text",
        "",
        "Held-out text, one tokenized sentence per line; default: the default corpus's "
        "heldout split (what configs/demo.py did not train on).",
    )
    flags.DEFINE_integer("steps", 600, "Training steps of each tagger.")
    flags.DEFINE_integer("batch_size", 32, "Sentences per step.")
    flags.DEFINE_integer("train_copies", 4, "Corrupted copies of each task-train sentence.")
    flags.DEFINE_integer("test_copies", 2, "Corrupted copies of each task-test sentence.")
    flags.DEFINE_float("test_fraction", 0.2, "Share of the sentences (by a hash of their text) kept for the test set.")
    flags.DEFINE_float("replace_prob", 0.15, "Probability that a token is replaced.")
    flags.DEFINE_integer("seed", 0, "Seed of the corruption, the initialisation, dropout and the batch order.")
    flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate.")
    flags.DEFINE_integer("max_tokens", 60, "Longer sentences are cut to this many tokens.")


def main(argv: list[str]) -> None:
    from elmo_jax import cli

    settings = Settings(
        bilm_dir=FLAGS.biLM or "",
        text=FLAGS.text,
        steps=FLAGS.steps,
        batch_size=FLAGS.batch_size,
        train_copies=FLAGS.train_copies,
        test_copies=FLAGS.test_copies,
        test_fraction=FLAGS.test_fraction,
        replace_prob=FLAGS.replace_prob,
        seed=FLAGS.seed,
        learning_rate=FLAGS.learning_rate,
        max_tokens=FLAGS.max_tokens,
    )
    cli.run_main(lambda: run(settings), argv)


if __name__ == "__main__":
    define_flags()
    app.run(main)
