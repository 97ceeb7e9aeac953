"""The weights a training run stands for: its biLM's weights averaged over its recent steps.

With bilm-tf's recipe (Adagrad at 0.2 from accumulators of 1.0, whose per-parameter gradients stay far
below 1 in a small model, so the steps stay about as large as the first) the parameters of a small
biLM never settle: the heldout perplexity of the last step's weights moves by 10-15% from one
checkpoint to the next, one direction at a time (bench/RESULTS.md, "Training that does not depend
on luck"), and which value a run ends on depends on the seed and on the order of float sums. Averaging
the biLM's weights over the last few dozen steps removes that noise without changing the training
trajectory at all: `TrainState.average` (an exponential moving average of `params["bilm"]`) is updated
after every step, and with the current softmax it is what the heldout evaluations score, what the export
writes and what `start.load_trained` returns; training itself continues from the parameters.

Only the biLM is averaged: the swing is there (averaging the softmax too changed the demo's figures by
under 1%, averaging the softmax alone not at all: bench/RESULTS.md), the export holds the biLM only, and
a dense pass over a large vocabulary's softmax at every step would undo the row-sparse update
(`row_update`; bilm_small's softmax over the 1B Word vocabulary is 101M weights against its biLM's 13.6M).

The average is debiased: after t updates it is the weighted mean of the t parameter values seen, with
weights proportional to decay^(t - i), so its start (the initial parameters) carries no weight once
training has taken a step, and a run of any length gets an average of its own recent steps.

Shapes: the average is a pytree of `TrainState.params["bilm"]`'s shapes and shardings.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def step_decay(decay: float, updates: jax.Array | int) -> jax.Array:
    """float32 (): the decay applied to the average at its `updates`-th update (0-based), so that the result
    is the debiased average: decay (1 - decay^u) / (1 - decay^(u + 1)); 0 at the first update (the average
    becomes the parameters), then rising to `decay`."""
    u = jnp.asarray(updates, jnp.float32)
    d = jnp.float32(decay)
    return d * -jnp.expm1(u * jnp.log(d)) / -jnp.expm1((u + 1.0) * jnp.log(d))


def updated(average: Any, params: Any, decay: float, updates: jax.Array | int) -> Any:
    """The average after one more step: decay_u * average + (1 - decay_u) * params (`step_decay`).

    Args:
      average: the average so far (a pytree like `params`); params: the parameters after the step.
      decay: the config's `weight_average_decay`, in (0, 1).
      updates: int (): how many updates the average has had (the state's step before this one).
    """
    d = step_decay(decay, updates)
    return jax.tree.map(lambda a, p: (d * a + (1.0 - d) * p).astype(p.dtype), average, params)


def fresh(params: Any) -> Any:
    """An average that has seen nothing but `params` (copies: a train step donates both)."""
    return jax.tree.map(jnp.copy, params)


def model_params(state) -> dict:
    """The weights a `TrainState` stands for ({"bilm", "softmax"}): its biLM's average, when the run keeps
    one, with the current softmax; else its parameters."""
    if state.average is None:
        return state.params
    return {"bilm": state.average, "softmax": state.params["softmax"]}
