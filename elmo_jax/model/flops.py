"""Model FLOP counts, for throughput and utilisation figures (bench/).

Counts multiply-adds of the matrix products as 2 FLOPs each, at the architecture's nominal size: every
convolution start position of every token, as the model defines it, whatever `embed` skips as
redundant. Elementwise work (activations, gates, clipping) is not counted, as is usual for MFU.
"""

from __future__ import annotations

from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.params import N_DIRECTIONS


def char_cnn_flops_per_token(config: BiLMConfig) -> int:
    """Convolutions (all valid starts), highway layers and projection (of the word vector too, for a model
    with words: a lookup costs no FLOPs) for one token."""
    C, E, F, P = config.max_characters_per_token, config.char_embed_dim, config.n_filters, config.projection_dim
    conv = sum(2 * width * E * num * (C - width + 1) for width, num in config.filters)
    highway = config.n_highway * 2 * (2 * F * F)
    projection = 2 * (config.word_dim + F) * P if config.has_cnn_projection else 0
    return conv + highway + projection


def lstm_flops_per_token(config: BiLMConfig) -> int:
    """All LSTM layers of both directions for one token: gates from [x; h], then the projection (inside the
    recurrence, or after it for `lstm_output_projection`)."""
    P, H = config.projection_dim, config.lstm_dim
    projected = config.has_lstm_projection or config.lstm_output_projection
    per_cell = 2 * (P + config.state_dim) * (4 * H) + (2 * H * P if projected else 0)
    return N_DIRECTIONS * config.n_layers * per_cell


def embed_flops(config: BiLMConfig, batch_size: int, n_tokens: int) -> int:
    """FLOPs of one `embed` call on a (B, T) batch; the biLM also runs on `<S>` and `</S>`."""
    return batch_size * (n_tokens + 2) * (char_cnn_flops_per_token(config) + lstm_flops_per_token(config))


def train_flops(
    config: BiLMConfig, batch_size: int, unroll_steps: int, *, vocab_size: int, n_negative_samples: int | None
) -> int:
    """FLOPs of one training step (`train_step`) on a window of B rows x T steps in each direction.

    Forward and backward ≈ 3 x forward (the backward pass computes two products per forward one: the
    gradients of the inputs and of the weights), for the biLM and the softmax alike:

        3 x [ D·B·T · char_cnn + B·T · lstm + D·B·T · 2·P·K ],   D = 2 directions,

    char_cnn and lstm as in `char_cnn_flops_per_token` / `lstm_flops_per_token` (the latter already sums
    both directions, each of which reads its own B·T tokens); K logits per target: the true class plus
    min(n_negative_samples, V) sampled candidates for the sampled softmax, or all V classes for the full
    softmax (n_negative_samples=None).
    """
    tokens = batch_size * unroll_steps
    K = vocab_size if n_negative_samples is None else min(n_negative_samples, vocab_size) + 1
    softmax = 2 * config.projection_dim * K
    per_direction_token = char_cnn_flops_per_token(config) + softmax
    return 3 * (N_DIRECTIONS * tokens * per_direction_token + tokens * lstm_flops_per_token(config))
