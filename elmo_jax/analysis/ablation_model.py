"""The small task model of the ablations (`ablation`): a window classifier over a target and its two
neighbours, with or without ELMo, trained by Adam with early stopping, recording its learning curve.

Each labelled target (`probe_data.ProbeItem`) has three slots: the token before its span, the span, the
token after it (a slot outside the sentence is zeros). A slot's representation is, as Peters et al. (2018,
section 3.3) add ELMo to a task model, its own word vector `x` (a table trained from scratch on the task's
data: the "static word-vector baseline"), concatenated with ELMo's `gamma * sum_j w_j h_j` of the frozen
biLM's layers `h_j` unless the variant is the baseline. The three slots' representations, concatenated,
go through one ReLU layer to logits over the classes the target's word was seen with in training (all
classes for an unseen word, as `probing` does).

The mix and its penalty are the library's (`elmo_jax.features.mix`: `scalar_mix`, `mix_l2_penalty`,
`mix_weights`), the ones a task model built on `ScalarMix` or `ElmoTaskLayers` trains, so the ablation
measures the task API users have. The mix's scalars `s` are learnt (optionally with the paper's L2
penalty on them, which pulls `w` to the average as its coefficient grows) or fixed: 0 for the layers a
fixed variant uses and -inf for the others, whose normalised weights are exactly its one layer or the
average. `gamma` is learnt in every ELMo variant.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.features import mix as elmo_mix

WORD_DIM = 64  # the trained word vectors (GloVe's role in the paper's baselines)
HIDDEN = 128
BATCH_SIZE = 64
LEARNING_RATE = 3e-3
EVAL_EVERY = 25  # updates between two evaluations (one point of the learning curve)
PATIENCE = 12  # evaluations without a better dev accuracy before stopping


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a variant reads the biLM: `layers` None for no ELMo (the baseline); else "token", "top",
    "average" (fixed weights) or "learned" (the mix's scalars trained, with the library's L2 penalty of
    coefficient `l2` on them added to the loss)."""

    name: str
    layers: str | None
    l2: float = 0.0


@dataclasses.dataclass(frozen=True)
class TaskData:
    """Every item's inputs, as arrays (N items, L+1 biLM layers, D = 2P):

    Attributes:
      elmo: float32 (N, 3, L+1, D): each slot's vector in every layer (zeros outside the sentence).
      words: int32 (N, 3, S): each slot's word ids (0 = padding or unknown; a span has up to S words).
      labels: int32 (N,) class ids.
      word_of_target: int32 (N,) the target word's row of `candidates` (-1: unseen in training).
      candidates: bool (W + 1, K): the classes each training word was seen with; the last row all True.
      vocabulary_size: rows of the word table (ids are below it).
    """

    elmo: np.ndarray
    words: np.ndarray
    labels: np.ndarray
    word_of_target: np.ndarray
    candidates: np.ndarray
    vocabulary_size: int


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """One trained task model: its test accuracy at the best dev evaluation, the learning curve
    [(updates, dev accuracy, test accuracy)], and the layer weights it used ([] for the baseline)."""

    test_accuracy: float
    curve: list[tuple[int, float, float]]
    layer_weights: list[float]
    gamma: float


def train_task_model(
    data: TaskData, variant: Variant, fit: np.ndarray, dev: np.ndarray, test: np.ndarray, *, seed: int, max_updates: int
) -> TrainingRun:
    """Trains the task model on the items `fit` (index arrays into `data`), evaluating on `dev` and `test`
    every EVAL_EVERY updates; stops after PATIENCE evaluations without a better dev accuracy or at
    `max_updates`. Returns the test accuracy of the evaluation with the best dev accuracy."""
    rng = np.random.default_rng(seed)
    params = init_params(jax.random.key(seed), data, variant)
    state = _optimizer().init(params)
    arrays, mix, elmo = device_arrays(data), mix_settings(variant, data.elmo.shape[2]), variant.layers is not None
    accuracy = lambda p, items: _accuracy(p, arrays, items, mix, elmo)  # noqa: E731
    best, best_params, waited, curve, updates = -1.0, params, 0, [], 0
    while updates < max_updates and waited < PATIENCE:
        for batch in _batches(rng.permutation(fit), BATCH_SIZE):
            params, state = _step(params, state, arrays, jnp.asarray(batch), mix, elmo)
            updates += 1
            if updates % EVAL_EVERY == 0 or updates == max_updates:
                scores = (accuracy(params, dev), accuracy(params, test))
                curve.append((updates, *scores))
                if scores[0] > best:
                    best, best_params, waited = scores[0], params, 0
                else:
                    waited += 1
            if updates >= max_updates or waited >= PATIENCE:
                break
    weights = [float(w) for w in layer_weights(best_params, mix)] if elmo else []
    gamma = float(best_params["gamma"]) if elmo else 0.0
    return TrainingRun(accuracy(best_params, test), curve, weights, gamma)


def init_params(key: jax.Array, data: TaskData, variant: Variant) -> dict:
    """The task model's parameters: word vectors, mix weights s and gamma, the hidden and output layers."""
    n_layers, dim = data.elmo.shape[2], data.elmo.shape[3]
    width = 3 * (WORD_DIM + (dim if variant.layers else 0))
    k_words, k_hidden, k_out = jax.random.split(key, 3)
    n_classes = data.candidates.shape[1]
    return {
        "words": 0.1 * jax.random.normal(k_words, (data.vocabulary_size, WORD_DIM)),
        "s": jnp.zeros((n_layers,)),
        "gamma": jnp.ones(()),
        "hidden": jax.random.normal(k_hidden, (width, HIDDEN)) * np.sqrt(2.0 / width),
        "hidden_bias": jnp.zeros((HIDDEN,)),
        "out": jax.random.normal(k_out, (HIDDEN, n_classes)) * np.sqrt(1.0 / HIDDEN),
        "out_bias": jnp.zeros((n_classes,)),
    }


def mix_settings(variant: Variant, n_layers: int) -> dict[str, np.ndarray]:
    """A variant's mix as data, so that every ELMo variant runs one compiled program: `fixed` (L+1,) the
    scalars of a fixed choice (0 for the layers it uses, -inf for the others: their normalised weights are
    one layer, or the average), `learned` 1.0 to mix with the trained scalars instead, `l2` the penalty's
    coefficient (0 unless learned)."""
    used = {"token": np.eye(n_layers, dtype=bool)[0], "top": np.eye(n_layers, dtype=bool)[-1]}.get(
        variant.layers, np.ones(n_layers, bool)
    )
    learned = 1.0 if variant.layers == "learned" else 0.0
    return {
        "fixed": np.where(used, 0.0, -np.inf).astype(np.float32),
        "learned": np.float32(learned),
        "l2": np.float32(variant.l2 * learned),
    }


def _optimizer() -> optax.GradientTransformation:
    return optax.adam(LEARNING_RATE)


def device_arrays(data: TaskData) -> dict:
    """The item arrays on the device once, gathered by index in each step."""
    return {
        "elmo": jnp.asarray(data.elmo),
        "words": jnp.asarray(data.words),
        "labels": jnp.asarray(data.labels),
        "mask": jnp.asarray(data.candidates[data.word_of_target]),  # -1 (unseen) is the all-True last row
    }


def mix_scalars(params: dict, mix: dict) -> jax.Array:
    """The scalars s (L+1,) the variant mixes with: the trained ones for a learned mix, else the fixed ones
    (the trained ones then get no gradient and stay at 0)."""
    return jnp.where(mix["learned"] > 0, params["s"], mix["fixed"])


def layer_weights(params: dict, mix: dict) -> jax.Array:
    """The normalised weights w (L+1,) of the biLM's layers that the variant's mix uses."""
    return elmo_mix.mix_weights(mix_scalars(params, mix))


def _logits(params: dict, arrays: dict, index: jax.Array, mix: dict, elmo: bool) -> jax.Array:
    """Logits (B, K) of the items `index` (B,), with classes their word cannot take at -inf."""
    words = arrays["words"][index]  # (B, 3, S)
    present = (words > 0).astype(jnp.float32)
    x = jnp.einsum("bts,btsd->btd", present, params["words"][words]) / jnp.maximum(present.sum(-1), 1.0)[..., None]
    if elmo:
        layers = jnp.swapaxes(arrays["elmo"][index], 1, 2)  # (B, 3, L+1, D) -> the mix's (B, L+1, 3, D)
        x = jnp.concatenate([x, elmo_mix.scalar_mix(layers, mix_scalars(params, mix), params["gamma"])], axis=-1)
    hidden = jax.nn.relu(x.reshape(x.shape[0], -1) @ params["hidden"] + params["hidden_bias"][None, :])
    logits = hidden @ params["out"] + params["out_bias"][None, :]
    return jnp.where(arrays["mask"][index], logits, -jnp.inf)


def task_loss(params: dict, arrays: dict, batch: jax.Array, variant: Variant) -> jax.Array:
    """The mean cross-entropy of a batch of item indices (-1: padding, weight 0), plus the library's L2
    penalty on the mix's scalars for a learned mix (`mix_l2_penalty`)."""
    mix = mix_settings(variant, arrays["elmo"].shape[2])
    return _loss(params, arrays, batch, mix, variant.layers is not None)


def _loss(params: dict, arrays: dict, batch: jax.Array, mix: dict, elmo: bool) -> jax.Array:
    index, weight = jnp.maximum(batch, 0), (batch >= 0).astype(jnp.float32)
    log_p = jax.nn.log_softmax(_logits(params, arrays, index, mix, elmo))
    picked = jnp.take_along_axis(log_p, arrays["labels"][index][:, None], axis=1)[:, 0]
    return -jnp.sum(weight * picked) / jnp.sum(weight) + elmo_mix.mix_l2_penalty(params["s"], mix["l2"])


@functools.partial(jax.jit, static_argnames=("elmo",))
def _step(params: dict, state, arrays: dict, batch: jax.Array, mix: dict, elmo: bool):
    """One Adam step on the loss (`task_loss`)."""
    grads = jax.grad(_loss)(params, arrays, batch, mix, elmo)
    updates, state = _optimizer().update(grads, state, params)
    return optax.apply_updates(params, updates), state


def _accuracy(params: dict, arrays: dict, items: np.ndarray, mix: dict, elmo: bool) -> float:
    correct = 0
    for batch in _batches(items, 1024):
        correct += int(_correct(params, arrays, jnp.asarray(batch), mix, elmo))
    return correct / max(len(items), 1)


@functools.partial(jax.jit, static_argnames=("elmo",))
def _correct(params: dict, arrays: dict, batch: jax.Array, mix: dict, elmo: bool) -> jax.Array:
    index = jnp.maximum(batch, 0)
    right = jnp.argmax(_logits(params, arrays, index, mix, elmo), axis=-1) == arrays["labels"][index]
    return jnp.sum(right & (batch >= 0))


def _batches(order: np.ndarray, size: int):
    """Index batches of exactly `size` (the last padded with -1)."""
    for start in range(0, len(order), size):
        batch = order[start : start + size]
        yield np.concatenate([batch, np.full(size - len(batch), -1)]) if len(batch) < size else batch
