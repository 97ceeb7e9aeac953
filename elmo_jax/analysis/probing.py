"""What each layer of a biLM knows: the layer analysis of Peters et al. (2018), section 5.3, for any
labelled targets (`probe_data`).

For every layer (the token layer, each LSTM layer) and for a learned mix of them, a target's vector is
its token's (or the mean of its span's) vector in that layer, and two classifiers are scored on the test
items:

- **1-nearest-neighbour** by cosine similarity, among the training items of the same word (the paper's
  word-sense set-up); a test word never seen in training backs off to the most frequent training label
  (the paper backs off to WordNet's first sense, which a generic probe does not have).
- **linear**: softmax regression (optax Adam, fixed seed), with early stopping on a held-out tenth of the
  training items; the classes a word can take are those seen with it in training (all classes for an
  unseen word). For the mix, the softmax-normalised layer weights and the scale are learnt with the
  classifier (as a task learns ELMo's mix), and the 1-NN uses the learnt mix.

Baselines: the majority class, and the most frequent training label of the target's word (majority for
unseen words). All accuracies are over the test items.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.analysis.probe_data import ProbeItem
from elmo_jax.features.embed import embed
from elmo_jax.features.length_buckets import BucketBatcher, Piece
from elmo_jax.features.mix import mix_weights, scalar_mix
from elmo_jax.model.char_cnn import content_bucket
from elmo_jax.model.params import BiLMParams
from elmo_jax.model.vocabulary import pad_id, token_vocabulary

DEV_FRACTION = 0.1
BATCH_SIZE = 256
MAX_EPOCHS = 300
PATIENCE = 15  # epochs without a better dev accuracy before stopping
LEARNING_RATE = 1e-2


@dataclasses.dataclass(frozen=True)
class Split:
    """The items of one split as arrays: vectors float32 (L+1, N, D), label ids (N,), word ids (N,)."""

    vectors: np.ndarray
    labels: np.ndarray
    words: np.ndarray


def layer_names(n_layers: int) -> list[str]:
    """["token", "lstm_1", ..., "lstm_L"] for a biLM with L LSTM layers."""
    return ["token"] + [f"lstm_{k}" for k in range(1, n_layers + 1)]


def probe(
    params: BiLMParams,
    train: Sequence[ProbeItem],
    test: Sequence[ProbeItem],
    *,
    seed: int = 0,
    batch_tokens: int = 4096,
) -> dict:
    """Accuracy of each layer, the learned mix and the baselines on `test`, trained on `train`.

    Returns:
      {"layers": {name: {"nearest_neighbour": acc, "linear": acc}} for each layer and "mix",
       "mix_weights": the learnt softmax(s) (L+1,) and "mix_gamma", "baselines": {"majority", "per_word"},
       "counts": {"train", "test", "labels", "test_unseen_words"}}.

    Raises:
      ValueError: a test label that no training item has (it could not be learnt), or no items.
    """
    labels = check_items(train, test)
    label_id = {label: i for i, label in enumerate(labels)}
    word_id = {word: i for i, word in enumerate(sorted({item.word for item in train}))}
    vectors = target_vectors(params, list(train) + list(test), batch_tokens)
    split = lambda items, v: Split(
        v,
        np.array([label_id[i.label] for i in items]),  # noqa: E731
        np.array([word_id.get(i.word, -1) for i in items]),
    )
    fit, evaluate = split(train, vectors[:, : len(train)]), split(test, vectors[:, len(train) :])
    candidates = _candidates(fit, len(labels))
    names = layer_names(params.config.n_layers)
    results = {}
    for j, name in enumerate(names):
        one = [dataclasses.replace(s, vectors=s.vectors[j : j + 1]) for s in (fit, evaluate)]
        accuracy, _, _ = linear_probe(*one, candidates, seed=seed)
        results[name] = {
            "nearest_neighbour": nearest_neighbour(fit.vectors[j], fit, evaluate.vectors[j], evaluate),
            "linear": accuracy,
        }
    accuracy, scalars, gamma = linear_probe(fit, evaluate, candidates, seed=seed, mix=True)
    mixed = lambda s: np.asarray(_mixed(jnp.asarray(s.vectors), scalars, gamma))  # noqa: E731
    results["mix"] = {
        "nearest_neighbour": nearest_neighbour(mixed(fit), fit, mixed(evaluate), evaluate),
        "linear": accuracy,
    }
    return {
        "layers": results,
        "mix_weights": [float(w) for w in mix_weights(scalars)],
        "mix_gamma": float(gamma),
        "baselines": baselines(fit, evaluate),
        "counts": {
            "train": len(train),
            "test": len(test),
            "labels": len(labels),
            "test_unseen_words": int(np.sum(evaluate.words < 0)),
        },
    }


def check_items(train: Sequence[ProbeItem], test: Sequence[ProbeItem]) -> list[str]:
    """The training items' labels, sorted. Raises ValueError for no items, or a test label that no
    training item has (a classifier could not learn it)."""
    if not train or not test:
        raise ValueError("the training and the test items must not be empty")
    labels = sorted({item.label for item in train})
    unknown = sorted({item.label for item in test} - set(labels))
    if unknown:
        raise ValueError(
            f"{len(unknown)} test labels have no training item (e.g. {unknown[0]!r}); a classifier can only "
            "learn labels it sees in training"
        )
    return labels


def target_vectors(params: BiLMParams, items: Sequence[ProbeItem], batch_tokens: int = 4096) -> np.ndarray:
    """float32 (L+1, N, 2P): each item's target vector in every layer (the mean over its span). Each
    distinct sentence is embedded once, in length x width buckets (a few compiled shapes), from a zero
    state."""
    sentences = sorted({item.tokens for item in items})
    index = {tokens: i for i, tokens in enumerate(sentences)}
    layers = sentence_layers(params, sentences, batch_tokens)
    out = np.empty((params.config.n_output_layers, len(items), params.config.output_dim), np.float32)
    for n, item in enumerate(items):
        out[:, n] = layers[index[item.tokens]][:, item.start : item.end].mean(axis=1)
    return out


def sentence_layers(params: BiLMParams, sentences: list[tuple[str, ...]], batch_tokens: int) -> list[np.ndarray]:
    """(L+1, n, 2P) of each sentence, in order."""
    vocabulary = token_vocabulary(params)  # the model's text -> ids
    batcher, out = BucketBatcher(batch_tokens, vocabulary.width), [None] * len(sentences)

    def run(batch):
        layers = np.asarray(embed(params, batch.chars)[0])
        for row, piece in enumerate(batch.pieces):
            out[piece.line] = layers[row, :, : piece.n_tokens]

    for i, tokens in enumerate(sentences):
        ids = np.array([vocabulary.token_ids(token) for token in tokens], np.int32).reshape(-1, vocabulary.width)
        S = content_bucket(ids, vocabulary.C, pad_id(params.config))  # the model's padding id
        for batch in batcher.add(Piece(i, 0, ids, S)):
            run(batch)
    for batch in batcher.flush():
        run(batch)
    return out


def nearest_neighbour(train_vectors: np.ndarray, train: Split, test_vectors: np.ndarray, test: Split) -> float:
    """Accuracy of the 1-NN by cosine similarity among training items of the same word (a test word seen
    in no training item gets the majority label). Vectors (N, D)."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # noqa: E731
    similarity = unit(test_vectors) @ unit(train_vectors).T  # (N_test, N_train)
    same_word = test.words[:, None] == train.words[None, :]
    similarity = np.where(same_word, similarity, -np.inf)
    nearest = np.argmax(similarity, axis=1)  # the first of tied items
    majority = np.bincount(train.labels).argmax()
    predicted = np.where(test.words >= 0, train.labels[nearest], majority)
    return float(np.mean(predicted == test.labels))


def baselines(train: Split, test: Split) -> dict[str, float]:
    """The majority class, and each word's most frequent training label (majority for unseen words)."""
    majority = np.bincount(train.labels).argmax()
    per_word = {}
    for word, counts in _label_counts(train).items():
        per_word[word] = max(counts, key=lambda label: (counts[label], -label))
    predicted = np.array([per_word.get(int(w), majority) for w in test.words])
    return {"majority": float(np.mean(test.labels == majority)), "per_word": float(np.mean(predicted == test.labels))}


def _label_counts(split: Split) -> dict[int, collections.Counter]:
    counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for word, label in zip(split.words, split.labels):
        counts[int(word)][int(label)] += 1
    return counts


def _candidates(train: Split, n_labels: int) -> np.ndarray:
    """bool (W + 1, K): the labels each training word was seen with; the last row (unseen words) allows all."""
    mask = np.zeros((int(train.words.max()) + 2, n_labels), bool)
    mask[train.words, train.labels] = True
    mask[-1] = True
    return mask


def linear_probe(
    train: Split, test: Split, candidates: np.ndarray, *, seed: int = 0, mix: bool = False
) -> tuple[float, np.ndarray, float]:
    """Test accuracy of softmax regression on `train.vectors` (1 or L+1 layers: with `mix`, their learnt
    scalar mix), early-stopped on a held-out tenth of `train`. Returns (accuracy, the mix's scalars s (L,),
    gamma); without `mix`, s is (0.,) and gamma 1."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(train.labels))
    n_dev = max(1, int(round(DEV_FRACTION * len(order))))
    dev, fit = order[:n_dev], order[n_dev:] if len(order) > n_dev else order
    L, _, D = train.vectors.shape
    K = candidates.shape[1]
    key_w, _ = jax.random.split(jax.random.key(seed))
    params = {
        "s": jnp.zeros((L,)),
        "gamma": jnp.ones(()),
        "W": 0.01 * jax.random.normal(key_w, (D, K)),
        "b": jnp.zeros((K,)),
    }
    state = _OPTIMIZER.init(params)
    masks = lambda words: jnp.asarray(candidates[words])  # noqa: E731  (-1, unseen, is the last row)
    train_x, train_y = jnp.asarray(train.vectors), jnp.asarray(train.labels)

    def accuracy(p, vectors, labels, words):
        return float(_accuracy(p, jnp.asarray(vectors), jnp.asarray(labels), masks(words), mix))

    best, best_params, waited = -1.0, params, 0
    for _ in range(MAX_EPOCHS):
        for batch in _batches(rng.permutation(fit), BATCH_SIZE):
            index = jnp.asarray(batch)
            weight = jnp.asarray(batch != -1, jnp.float32)
            params, state = _step(
                params, state, train_x[:, index], train_y[index], masks(train.words[batch]), weight, mix
            )
        score = accuracy(params, train.vectors[:, dev], train.labels[dev], train.words[dev])
        if score > best:
            best, best_params, waited = score, params, 0
        else:
            waited += 1
            if waited >= PATIENCE:
                break
    scalars = np.asarray(best_params["s"]) if mix else np.zeros((1,), np.float32)
    gamma = float(best_params["gamma"]) if mix else 1.0
    return accuracy(best_params, test.vectors, test.labels, test.words), scalars, gamma


_OPTIMIZER = optax.adam(LEARNING_RATE)


@functools.partial(jax.jit, static_argnames=("mix",))
def _step(params, state, x, y, mask, weight, mix: bool):
    """One Adam step on the weighted mean cross-entropy of a batch (x (L, B, D), y (B,), mask (B, K))."""

    def loss(p):
        log_p = jnp.take_along_axis(jax.nn.log_softmax(_logits(p, x, mask, mix)), y[:, None], axis=1)[:, 0]
        return -jnp.sum(weight * log_p) / jnp.sum(weight)

    updates, state = _OPTIMIZER.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state


@functools.partial(jax.jit, static_argnames=("mix",))
def _accuracy(p, x, y, mask, mix: bool):
    return jnp.mean(jnp.argmax(_logits(p, x, mask, mix), axis=-1) == y)


def _logits(p: dict, x: jax.Array, mask: jax.Array, mix: bool) -> jax.Array:
    """x (L, B, D) -> logits (B, K) with the classes a word cannot take at -inf."""
    features = _mixed(x, p["s"], p["gamma"]) if mix else x[0]
    logits = features @ p["W"] + p["b"][None, :]
    return jnp.where(mask, logits, -jnp.inf)


def _mixed(vectors: jax.Array, scalars: jax.Array, gamma: jax.Array) -> jax.Array:
    """The task mix (`features.mix.scalar_mix`) of one vector per target: (L, N, D) -> (N, D)."""
    return scalar_mix(jnp.moveaxis(vectors, 0, 1)[:, :, None], jnp.asarray(scalars), jnp.asarray(gamma))[:, 0]


def _batches(order: np.ndarray, size: int):
    """Index batches of exactly `size` (the last padded with -1, which index the last row: weight 0)."""
    for start in range(0, len(order), size):
        batch = order[start : start + size]
        yield np.concatenate([batch, np.full(size - len(batch), -1)]) if len(batch) < size else batch
