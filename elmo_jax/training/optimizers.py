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

import jax
import jax.numpy as jnp
import optax
from jax import lax

from elmo_jax.model.precision import sum_by_product

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
    clip = _clip_by_global_norm(optimizer.clip_norm)  # first: bilm-tf clips before Adagrad sees it
    return optax.chain(clip, _CHOICES[optimizer.name][0](optimizer))


def global_norm(tree) -> jax.Array:
    """The global norm of a gradient, `optax.tree.norm(tree)`; the train steps' metric and the clip both
    use this one, so the compiler computes it once.

    On a TPU each matrix of at least `_PRODUCT_ROWS` rows has its sum of squares as a product with a
    column of ones on the matrix unit (`precision.sum_by_product`, float32 at `Precision.HIGHEST`): the
    compiler estimated the reduction over the softmax's rows slower than the product (measured:
    bench/RESULTS_tpu_compile.md, "The gradient norm's sums of squares as products"). Elsewhere optax's own.
    """
    return lax.platform_dependent(tree, tpu=_norm_by_products, default=optax.tree.norm)


_PRODUCT_ROWS = 4096


def _norm_by_products(tree) -> jax.Array:
    def squares(x):
        if x.ndim != 2 or x.shape[0] < _PRODUCT_ROWS:
            return jnp.sum(jnp.square(x.astype(jnp.float32)))
        x = x.astype(jnp.float32)
        return jnp.sum(sum_by_product(x * x, axis=0))

    return jnp.sqrt(sum(squares(x) for x in jax.tree.leaves(tree)))


def _clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm(max_norm)` (its state, its arithmetic) with the norm from `global_norm`."""
    optax_clip = optax.clip_by_global_norm(max_norm)

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        keep = jnp.squeeze(norm < max_norm)  # as optax: the same select and scaling

        def clip(t):
            return lax.select(keep, t, (t / norm.astype(t.dtype)) * max_norm)

        return jax.tree.map(clip, updates), state

    return optax.GradientTransformation(optax_clip.init, update)


def _adagrad(optimizer: Optimizer) -> optax.GradientTransformation:
    return optax.adagrad(optimizer.learning_rate, initial_accumulator_value=optimizer.initial_accumulator, eps=0.0)


def _adam(optimizer: Optimizer) -> optax.GradientTransformation:
    return optax.adam(optimizer.learning_rate)


# name -> (the optimiser after clipping, whether it is row-sparse: the module docstring); the first is
# the default. What each reads from the config is written in configs/default.py.
_CHOICES = {ADAGRAD: (_adagrad, True), ADAM: (_adam, False)}
OPTIMIZERS = tuple(_CHOICES)
