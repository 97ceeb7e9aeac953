"""The optimisers a training run can use, and what the train step may assume about each.

One place owns the optimiser: `Optimizer` holds a run's choice and settings (`settings.optimizer` reads
them from the config, once) and builds its optax transformation; every caller (the loop, the jitted
steps, restoring a checkpoint, the bench scripts) passes it along and never spells out a chain itself.
It is a frozen dataclass, hashed by its settings: the jitted step takes it as a static argument, so the
same settings give an equal object and reuse the compiled step.

Every choice clips the gradient to a global norm first (bilm-tf's `clip_norm`), then:

- "adagrad" (the default): bilm-tf's recipe, TensorFlow's Adagrad (no epsilon) from accumulators of
  `initial_accumulator`. Its state is `(clip's, adagrad's (scale_by_rss, scale))`, the structure every
  checkpoint so far holds.
- "adam": `optax.adam` with optax's defaults (b1 0.9, b2 0.999, eps 1e-8), for fine-tuning.

`row_sparse` declares whether updating only the softmax rows a step read (`row_update`) gives the dense
update's numbers: true for an elementwise optimiser under which a zero gradient leaves a parameter and
its state unchanged (clip + Adagrad), false otherwise (Adam's moments decay at every row, read or not).
The train step asks `declares_row_sparse`, so a plain optax transformation gets the dense update.
"""

from __future__ import annotations

import dataclasses
import functools

import optax

ADAGRAD, ADAM = "adagrad", "adam"


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A run's optimiser: usable wherever optax takes a transformation (it has `init` and `update`).

    Attributes:
      name: one of `OPTIMIZERS`.
      learning_rate: the step size (bilm-tf's Adagrad: 0.2).
      clip_norm: the global norm the gradient is clipped to before the optimiser sees it.
      initial_accumulator: Adagrad's accumulators' start (Adam does not read it).
    """

    name: str = ADAGRAD
    learning_rate: float = 0.2
    clip_norm: float = 10.0
    initial_accumulator: float = 1.0

    def __post_init__(self):
        if self.name not in _CHOICES:
            raise ValueError(f"optimizer {self.name!r}: expected one of {', '.join(OPTIMIZERS)}")

    @property
    def row_sparse(self) -> bool:
        """Whether the softmax may be updated only at the rows a step read (the module docstring)."""
        return _CHOICES[self.name][1]

    @property
    def transform(self) -> optax.GradientTransformation:
        """The optax transformation (one object per settings)."""
        return _transform(self)

    def init(self, params):
        return self.transform.init(params)

    def update(self, updates, state, params=None):
        return self.transform.update(updates, state, params)


def declares_row_sparse(optimizer) -> bool:
    """Whether `optimizer` declares itself row-sparse (`Optimizer.row_sparse`); a plain optax
    transformation does not, since nothing is known about it."""
    return getattr(optimizer, "row_sparse", False) is True


@functools.lru_cache(maxsize=8)
def _transform(optimizer: Optimizer) -> optax.GradientTransformation:
    clip = optax.clip_by_global_norm(optimizer.clip_norm)  # first: bilm-tf clips before Adagrad sees it
    return optax.chain(clip, _CHOICES[optimizer.name][0](optimizer))


def _adagrad(optimizer: Optimizer) -> optax.GradientTransformation:
    return optax.adagrad(optimizer.learning_rate, initial_accumulator_value=optimizer.initial_accumulator, eps=0.0)


def _adam(optimizer: Optimizer) -> optax.GradientTransformation:
    return optax.adam(optimizer.learning_rate)


# name -> (the optimiser after clipping, whether it is row-sparse: the module docstring); the first is
# the default. What each reads from the config is written in configs/default.py.
_CHOICES = {ADAGRAD: (_adagrad, True), ADAM: (_adam, False)}
OPTIMIZERS = tuple(_CHOICES)
