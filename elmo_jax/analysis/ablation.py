"""The paper's ablations at any scale, on labelled targets (`probe_data`): which biLM layers a task model
should use (Peters et al. 2018, Table 2, section 5.1) and how much task data ELMo saves (section 5.4).

The same small task model (`ablation_model`) is trained, for several seeds, on:

- `VARIANTS`: no ELMo (the baseline: word vectors trained on the task's data), the token layer only, the
  top layer only, the average of all layers, a learned scalar mix without and with the L2 penalty on its
  weights (the paper's lambda = 0.001);
- the sample-efficiency sweep: the baseline and the learned mix with L2 on a fraction of the training
  items (the same fraction of each seed's shuffled items, so a seed's 1% is inside its 10%), each with
  its learning curve (dev and test accuracy by update).

A tenth of the (sub-sampled) training items is held out for early stopping, at least one. Accuracy is
over the test items. Results are mean and standard deviation over seeds (the population deviation: the
seeds are all there is).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from elmo_jax.analysis import ablation_model, probing
from elmo_jax.analysis.ablation_model import TaskData, Variant
from elmo_jax.analysis.probe_data import ProbeItem
from elmo_jax.model.params import BiLMParams

VARIANTS = (
    Variant("baseline", None),
    Variant("token", "token"),
    Variant("top", "top"),
    Variant("average", "average"),
    Variant("learned", "learned"),
    Variant("learned_l2", "learned", l2=0.001),
)
SAMPLE_EFFICIENCY = ("baseline", "learned_l2")  # the variants the fraction sweep compares
FRACTIONS = (0.01, 0.1, 0.3, 1.0)
DEV_FRACTION = 0.1
MAX_SPAN_WORDS = 8  # words of a target span that its word vector averages


@dataclasses.dataclass(frozen=True)
class Settings:
    """What to run: `variants` (names of VARIANTS), `seeds` (how many, 0..n-1), `fractions` of the
    training items for the sample-efficiency sweep (in (0, 1]), `max_updates` per training run."""

    variants: tuple[str, ...] = tuple(v.name for v in VARIANTS)
    seeds: int = 3
    fractions: tuple[float, ...] = FRACTIONS
    max_updates: int = 3000

    def check(self) -> None:
        """Raises ValueError naming the flag of a setting that cannot run."""
        known = [v.name for v in VARIANTS]
        unknown = [name for name in self.variants if name not in known]
        if unknown or not self.variants:
            raise ValueError(f"--variants: expected some of {','.join(known)}, found {','.join(self.variants)!r}")
        if self.seeds < 1:
            raise ValueError(f"--seeds must be at least 1, found {self.seeds}")
        if not self.fractions or not all(0 < f <= 1 for f in self.fractions):
            raise ValueError(f"--fractions must be in (0, 1], found {list(self.fractions)}")
        if self.max_updates < 1:
            raise ValueError(f"--max_updates must be at least 1, found {self.max_updates}")


def ablate(
    params: BiLMParams,
    train: Sequence[ProbeItem],
    test: Sequence[ProbeItem],
    settings: Settings = Settings(),
    *,
    batch_tokens: int = 4096,
) -> dict:
    """Trains the task model for every variant and seed, and the sample-efficiency sweep.

    Returns:
      {"variants": {name: {"test": [per seed], "mean", "std", "layer_weights": mean w, "gamma": mean}},
       "sample_efficiency": {name: {str(fraction): {"test": [...], "mean", "std", "items": training items,
                                                     "curve": [[updates, mean dev, mean test], ...]}}},
       "counts": {"train", "test", "labels", "seeds"}, "settings": {...}}.

    Raises:
      ValueError: bad settings, no items, or a test label no training item has.
    """
    settings.check()
    probing.check_items(train, test)
    data = task_data(params, list(train) + list(test), len(train), batch_tokens)
    test_index = np.arange(len(train), len(train) + len(test))
    by_name = {v.name: v for v in VARIANTS}
    variants = {name: _runs(data, by_name[name], 1.0, test_index, settings) for name in settings.variants}
    sweep = {}
    for name in SAMPLE_EFFICIENCY:  # all of the training items: the variant's runs above, when it ran
        sweep[name] = {
            str(f): variants[name]
            if f == 1.0 and name in variants
            else _runs(data, by_name[name], f, test_index, settings)
            for f in sorted(settings.fractions)
        }
    return {
        "variants": {name: _summary(runs) for name, runs in variants.items()},
        "sample_efficiency": {
            name: {f: _summary(runs, curves=True) for f, runs in s.items()} for name, s in sweep.items()
        },
        "counts": {
            "train": len(train),
            "test": len(test),
            "labels": int(data.candidates.shape[1]),
            "seeds": settings.seeds,
        },
        "settings": dataclasses.asdict(settings),
    }


def _runs(
    data: TaskData, variant: Variant, fraction: float, test: np.ndarray, settings: Settings
) -> list[tuple[int, ablation_model.TrainingRun]]:
    """(training items, run) for each seed: the seed's shuffle of the training items, its first `fraction`
    (at least 2), a tenth of those held out."""
    n_train, runs = int(test[0]), []
    for seed in range(settings.seeds):
        order = np.random.default_rng(seed).permutation(n_train)[: max(2, round(fraction * n_train))]
        n_dev = max(1, round(DEV_FRACTION * len(order)))
        dev, fit = order[:n_dev], order[n_dev:]
        run = ablation_model.train_task_model(
            data, variant, fit, dev, test, seed=seed, max_updates=settings.max_updates
        )
        runs.append((len(order), run))
    return runs


def _summary(runs: list[tuple[int, ablation_model.TrainingRun]], curves: bool = False) -> dict:
    scores = np.array([run.test_accuracy for _, run in runs])
    out = {"test": [float(s) for s in scores], "mean": float(scores.mean()), "std": float(scores.std())}
    if curves:
        out["items"] = runs[0][0]
        out["curve"] = _mean_curve([run.curve for _, run in runs])
    elif runs[0][1].layer_weights:
        out["layer_weights"] = [float(w) for w in np.mean([run.layer_weights for _, run in runs], axis=0)]
        out["gamma"] = float(np.mean([run.gamma for _, run in runs]))
    return out


def _mean_curve(curves: list[list[tuple[int, float, float]]]) -> list[list[float]]:
    """[updates, mean dev, mean test] at every evaluation all seeds reached (runs stop at different times;
    a stopped run counts with its best-dev model's scores, which is what it would be used with)."""
    longest = max(curves, key=len)
    out = []
    for i, (updates, _, _) in enumerate(longest):
        points = [curve[i] if i < len(curve) else _best(curve) for curve in curves]
        out.append([updates, float(np.mean([p[1] for p in points])), float(np.mean([p[2] for p in points]))])
    return out


def _best(curve: list[tuple[int, float, float]]) -> tuple[int, float, float]:
    return max(curve, key=lambda point: point[1])  # the first of equal dev accuracies


def task_data(params: BiLMParams, items: list[ProbeItem], n_train: int, batch_tokens: int = 4096) -> TaskData:
    """The arrays of `ablation_model.TaskData` for `items`, whose first `n_train` are the training items
    (the word vocabulary and the classes a word can take come from those)."""
    sentences = sorted({item.tokens for item in items})
    index = {tokens: i for i, tokens in enumerate(sentences)}
    layers = probing.sentence_layers(params, sentences, batch_tokens)  # (L+1, n, D) each
    vocabulary = {w: i + 1 for i, w in enumerate(sorted({t.lower() for it in items[:n_train] for t in it.tokens}))}
    labels = sorted({item.label for item in items[:n_train]})
    label_id = {label: i for i, label in enumerate(labels)}
    target_words = sorted({item.word for item in items[:n_train]})
    word_row = {word: i for i, word in enumerate(target_words)}
    n_layers, dim = params.config.n_output_layers, params.config.output_dim
    elmo = np.zeros((len(items), 3, n_layers, dim), np.float32)
    words = np.zeros((len(items), 3, MAX_SPAN_WORDS), np.int32)
    for n, item in enumerate(items):
        own = layers[index[item.tokens]]
        for slot, (start, end) in enumerate(
            ((item.start - 1, item.start), (item.start, item.end), (item.end, item.end + 1))
        ):
            if 0 <= start and end <= len(item.tokens):
                elmo[n, slot] = own[:, start:end].mean(axis=1)
                span = [vocabulary.get(t.lower(), 0) for t in item.tokens[start:end]][:MAX_SPAN_WORDS]
                words[n, slot, : len(span)] = span
    candidates = np.zeros((len(target_words) + 1, len(labels)), bool)
    for item in items[:n_train]:
        candidates[word_row[item.word], label_id[item.label]] = True
    candidates[-1] = True
    return TaskData(
        elmo=elmo,
        words=words,
        labels=np.array([label_id[item.label] for item in items], np.int32),
        word_of_target=np.array([word_row.get(item.word, -1) for item in items], np.int32),
        candidates=candidates,
        vocabulary_size=len(vocabulary) + 1,
    )
