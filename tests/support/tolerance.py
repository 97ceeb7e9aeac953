"""Float32 tolerances derived from rounding, for comparing two float32 computations of the same values
whose sums are ordered differently (another batch shape, another program, another device count).

XLA picks its loop blocking and vector width per shape and per CPU (AVX2 and AVX-512 sum in different
orders), so such results differ by rounding, and by how much depends on the machine: a bound read off
one machine's errors fails on another. The bound here follows from float32 rounding instead:

- A dot product of n terms computed in float32 (unit roundoff u = 2^-24) is within lambda * sqrt(n) * u
  * sum|x_i y_i| of the exact value, for any order of summation, with a probability of failure that
  falls like exp(-lambda^2 / 2) when rounding errors are independent and zero-mean (the probabilistic
  bound of Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci.
  Comput. 41(5), 2019; the worst-case bound, n * u, always holds but is far from what happens).
  lambda = 6 puts that probability near 1e-8 per value.
- Two such evaluations differ by at most twice that.
- n is the length of the longest chain of dependent sums the two computations may order differently
  (`char_cnn_terms`, `lstm_terms`), and sum|x_i y_i| is taken as the largest magnitude among the
  compared values, the scale at which their last bits round (an assumption: sums that cancel heavily
  would need their terms' own magnitude).
- Later layers computed the same way in both (tanh, sigmoid and the clipping are 1-Lipschitz; the
  residual adds) carry a difference forward without adding rounding of their own, so the chain counts
  only the sums whose order can differ.

docs/TESTING.md says which comparisons use this and which keep a fixed bound (those against AllenNLP's
own outputs, whose float32 error is AllenNLP's).
"""

from __future__ import annotations

import math

import numpy as np

from elmo_jax.model.config import BiLMConfig

UNIT_ROUNDOFF = 2.0**-24  # float32, round to nearest
LAMBDA = 6.0


def char_cnn_terms(config: BiLMConfig) -> int:
    """The longest chain of dependent sums in the char CNN: the widest convolution window (width x
    char_embed_dim products), then each highway layer and the projection (one product of the filters'
    total width each)."""
    widest = max(width for width, _ in config.filters) * config.char_embed_dim
    n_filters = sum(count for _, count in config.filters)
    return widest + n_filters * (config.n_highway + 1)


def lstm_terms(config: BiLMConfig, steps: int) -> int:
    """The longest chain of dependent sums through the LSTM layers over `steps` time steps: per layer
    and step, the gates' product (the layer's input and the previous output, P each) and the
    projection (H)."""
    per_step = 2 * config.projection_dim + config.lstm_dim
    return config.n_layers * steps * per_step


def order_tolerance(reference, terms: int) -> float:
    """The largest |a - b| two float32 evaluations of `reference`'s values can differ by when `terms`
    dependent products are summed in different orders (see the module docstring)."""
    scale = float(np.max(np.abs(np.asarray(reference, np.float64)), initial=0.0)) or 1.0
    return 2 * LAMBDA * math.sqrt(terms) * UNIT_ROUNDOFF * scale


def assert_close_up_to_order(actual, desired, terms: int, err_msg: str = "") -> None:
    """`actual` equals `desired` within `order_tolerance(desired, terms)`."""
    np.testing.assert_allclose(
        np.asarray(actual), np.asarray(desired), rtol=0, atol=order_tolerance(desired, terms), err_msg=err_msg
    )
