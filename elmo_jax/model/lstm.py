"""LSTM with projection and clipping (TF `LSTMCell` semantics): layers of both directions over time.

One step, with gates in the weight file's order i, j, f, o:

    z   = [x_t ; h_{t-1}] W_0 + B
    c_t = clip(sigmoid(f + 1) * c_{t-1} + sigmoid(i) * tanh(j), cell_clip)
    h_t = clip((sigmoid(o) * tanh(c_t)) W_P_0, proj_clip)    (no W_P_0 when P == H: then no clip either)

Both directions of a layer run in the same scan with a leading direction axis D = 2: the backward
direction's inputs arrive already reversed within each sentence's length, so one prefix mask serves
both. The input half of `z` for all time steps is one large matrix product hoisted out of the scan
(on a TPU, where that wrote and re-read a (D, T, B, 4H) float32 array, each step computes its own
instead); `h_{t-1} W_h` and the projection stay inside the time loop (`recurrence.recurrence`, whose
backward pass is written out to save memory traffic).
Past a row's length the state is held (so the final carry is the state after the row's last token)
and the output is zero.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.params import N_DIRECTIONS, OUTPUT_PROJECTION, get_path, lstm_cell_path
from elmo_jax.model.precision import ComputeOptions, linear
from elmo_jax.model.recurrence import Settings, recurrence


class LSTMState(NamedTuple):
    """Recurrent state of the whole biLM, directions first.

    Attributes:
      c: float32 (D, L, B, H) cell states; D = 2 (forward, backward), L layers.
      h: float32 (D, L, B, P) projected outputs (B, H for `BiLMConfig.lstm_output_projection`).
    """

    c: jax.Array
    h: jax.Array


def zero_state(config: BiLMConfig, batch_size: int) -> LSTMState:
    """All-zero state (D, L, B, ·) for a fresh, stateless pass."""
    D, L = N_DIRECTIONS, config.n_layers
    return LSTMState(
        c=jnp.zeros((D, L, batch_size, config.lstm_dim), jnp.float32),
        h=jnp.zeros((D, L, batch_size, config.state_dim), jnp.float32),
    )


def _stacked_names(config: BiLMConfig) -> dict[str, str]:
    """`stacked_cell`'s keys and the weight-file names of the cell weights it stacks."""
    names = {"W_0": "W_0", "B": "B"}
    if config.has_lstm_projection:
        names["W_P"] = "W_P_0"
    return names


def stacked_cell(weights, config: BiLMConfig, layer: int) -> dict[str, jax.Array]:
    """One layer's weights of both directions, stacked on a leading D axis.

    Returns: {"W_0": (D, 2P, 4H) kernel of [x ; h_prev], "B": (D, 4H), "W_P": (D, H, P) or absent}.
    """
    cells = [get_path(weights, lstm_cell_path(d, layer)) for d in range(N_DIRECTIONS)]
    return {key: jnp.stack([c[name] for c in cells]) for key, name in _stacked_names(config).items()}


def stacked_weight_paths(config: BiLMConfig) -> list[tuple[str, ...]]:
    """The weight paths `stacked_cell` stacks, one tuple per stacked array, in direction order (the
    gradient of such a stack reaches the weights split along its leading axis)."""
    return [
        tuple(f"{lstm_cell_path(d, layer)}/{name}" for d in range(N_DIRECTIONS))
        for layer in range(config.n_layers)
        for name in _stacked_names(config).values()
    ]


def lstm_layer(
    cell: dict[str, jax.Array],
    config: BiLMConfig,
    inputs: jax.Array,
    mask: jax.Array,
    c0: jax.Array,
    h0: jax.Array,
    *,
    compute: ComputeOptions = ComputeOptions(),
    resets: jax.Array | None = None,
):
    """Runs one layer of both directions over time.

    Args:
      cell: `stacked_cell(...)` of this layer.
      config: supplies the clips.
      inputs: float32 (T, D, B, P), time-major; the backward direction already reversed per row.
      mask: bool (T, D, B), where each direction's row has a token (a prefix of the row).
      c0, h0: (D, B, H), (D, B, P) initial state.
      compute: the matmul dtype (the state stays float32) and the `lax.scan` unroll factor.
      resets: None, or bool (T, D, B): zero the state before reading the token at that position (a
        row that starts afresh mid-window, e.g. a sentence that training reads from a zero state).

    Returns:
      outputs (T, D, B, P) with zeros past each row's length, and the final (c, h).
    """
    settings = Settings(config.cell_clip, config.proj_clip, compute.dtype, compute.unroll, compute.token_shards)
    outputs, c_final, h_final = recurrence(
        settings, inputs, cell["W_0"], cell["B"], cell.get("W_P"), mask, resets, c0, h0
    )
    return outputs, (c_final, h_final)


def lstm_stack(
    weights,
    config: BiLMConfig,
    inputs: jax.Array,
    mask: jax.Array,
    initial_state: LSTMState,
    *,
    compute: ComputeOptions = ComputeOptions(),
    dropout=None,
    resets: jax.Array | None = None,
) -> tuple[list[jax.Array], LSTMState]:
    """All LSTM layers of both directions, with bilm-tf's residual connections and dropout.

    Args:
      weights: `BiLMParams.weights`.
      config: the architecture.
      inputs: float32 (T, D, B, P) token embeddings, time-major, each direction in its reading order.
      mask: bool (T, D, B).
      initial_state: `LSTMState` (D, L, B, ·).
      compute: as for `lstm_layer`.
      dropout: None, or a function (x, layer) -> x applied to each layer's input, as TF's
        `DropoutWrapper(input_keep_prob)` does; the residual then adds the dropped-out input.
      resets: None or bool (T, D, B), see `lstm_layer` (applies to every layer).

    Returns:
      each layer's outputs (T, D, B, P), and the final `LSTMState`.
    """
    outputs, finals_c, finals_h = [], [], []
    for layer in range(config.n_layers):
        if dropout is not None:
            inputs = dropout(inputs, layer)
        out, (c, h) = lstm_layer(
            stacked_cell(weights, config, layer),
            config,
            inputs,
            mask,
            initial_state.c[:, layer],
            initial_state.h[:, layer],
            compute=compute,
            resets=resets,
        )
        if config.lstm_output_projection:  # one layer (`config_problems`); zeros kept past each row's length
            projection = weights[OUTPUT_PROJECTION]
            out = linear(out, projection["W_proj"], projection["b_proj"], compute.dtype) * mask[..., None]
        if layer > 0 and config.use_skip_connections:
            out = out + inputs  # residual on the output only, never on the carried state
        outputs.append(out)
        finals_c.append(c)
        finals_h.append(h)
        inputs = out
    return outputs, LSTMState(c=jnp.stack(finals_c, axis=1), h=jnp.stack(finals_h, axis=1))
