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
    return _CHOICES[optimizer.name][0](optimizer)


def _chain(optimizer: Optimizer) -> optax.GradientTransformation:
    """The clip, then the choice's optax optimiser: what every choice computes, and its state."""
    clip = optax.clip_by_global_norm(optimizer.clip_norm)  # first: bilm-tf clips before Adagrad sees it
    inner = _adam if optimizer.name == ADAM else _adagrad
    return optax.chain(clip, inner(optimizer))


def _adagrad(optimizer: Optimizer) -> optax.GradientTransformation:
    return optax.adagrad(optimizer.learning_rate, initial_accumulator_value=optimizer.initial_accumulator, eps=0.0)


def _adam(optimizer: Optimizer) -> optax.GradientTransformation:
    return optax.adam(optimizer.learning_rate)


def _clipped_adagrad(optimizer: Optimizer) -> optax.GradientTransformation:
    """`_chain`'s clip + Adagrad with the clip's scale applied inside Adagrad's elementwise update.

    The same state as the chain (its `init`: `(EmptyState(), (ScaleByRssState, EmptyState()))`), and
    its updates within float32 rounding: the clip multiplies by one scalar, s = min(1, c / norm),
    where optax divides every element by the norm and multiplies by c (exact when the clip is
    inactive: s = 1). A per-element division is several vector operations on a TPU; one pass per
    parameter reads g and the accumulator and writes the accumulator and the update.
    """
    chain = _chain(optimizer)
    neg_lr = -optimizer.learning_rate

    def update(grads, state, params=None):
        del params
        clip_state, (rss, lr_state) = state
        scale = clip_scale(grads, optimizer.clip_norm)
        pairs = jax.tree.map(lambda g, acc: _adagrad_leaf(g, acc, scale, neg_lr), grads, rss.sum_of_squares)
        is_pair = lambda x: isinstance(x, tuple)  # noqa: E731 (the leaves of `pairs`)
        updates = jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair)
        accumulators = jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair)
        return updates, (clip_state, (rss._replace(sum_of_squares=accumulators), lr_state))

    return optax.GradientTransformation(chain.init, update)


def clip_scale(grads, clip_norm: float) -> jax.Array:
    """s = min(1, c / ||grads||) as a float32 scalar: 1 exactly when optax's clip leaves grads as they are."""
    norm = optax.tree.norm(grads)
    return jnp.where(norm < clip_norm, jnp.float32(1.0), clip_norm / norm).astype(jnp.float32)


def _adagrad_leaf(g: jax.Array, acc: jax.Array, scale: jax.Array, neg_lr: float):
    """TensorFlow's Adagrad (no epsilon) on the clipped gradient s·g of one parameter, any shape.

    Returns (update, acc'): acc' = acc + (s·g)², update = -lr · s·g / sqrt(acc') (0 where acc' = 0,
    as optax's `scale_by_rss`), in the order of optax's operations.
    """
    clipped = g * scale.astype(g.dtype)
    acc = jnp.square(clipped) + acc
    inv_sqrt = jnp.where(acc > 0, jax.lax.rsqrt(acc), 0.0)
    return neg_lr * (inv_sqrt * clipped), acc


# name -> (the clipped optimiser, whether it is row-sparse: the module docstring); the first is the
# default. What each reads from the config is written in configs/default.py.
_CHOICES = {ADAGRAD: (_clipped_adagrad, True), ADAM: (_chain, False)}
OPTIMIZERS = tuple(_CHOICES)
