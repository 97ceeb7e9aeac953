"""The context-independent token layer: characters -> convolutions -> max-pool -> highway -> projection.

All filter widths run as one matrix product: each token's character embeddings are unfolded into
windows of the widest filter (im2col), and every filter's kernel is zero-padded to that width, so a
(N*C, Wmax*E) x (Wmax*E, F) product computes all F filters at every start position at once. Positions
where a narrow filter would read past the token are masked out of the max. This costs ~16% extra
FLOPs for the published widths and runs far better than seven small convolutions. Windows that
see nothing but PAD characters all have one value, so only the starts up to the batch's longest
token are computed (`content_positions`), plus that one all-PAD window.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from elmo_jax.model.chars import PAD_CHAR
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.precision import ComputeOptions, broadcast_trailing, linear, matmul
from elmo_jax.model.vocabulary import pad_id

# Tokens per block of the convolution: bounds the (tokens, C, F) intermediate (~400 MB for the
# published model) whatever the batch size.
CNN_TOKEN_BLOCK = 1024


def _stacked_kernel(weights, config: BiLMConfig) -> tuple[jax.Array, np.ndarray]:
    """All convolution kernels as one (Wmax*E, F) matrix, and each filter's last valid start (F,)."""
    wmax = max(w for w, _ in config.filters)
    E = config.char_embed_dim
    blocks = []
    for i, (width, num) in enumerate(config.filters):
        kernel = weights["CNN"][f"W_cnn_{i}"].reshape(width * E, num)  # (1, w, E, n) -> (w*E, n)
        blocks.append(jnp.pad(kernel, ((0, (wmax - width) * E), (0, 0))))
    last_start = np.concatenate(
        [np.full((num,), config.max_characters_per_token - width) for width, num in config.filters]
    )
    return jnp.concatenate(blocks, axis=1), last_start


def _conv_max(
    char_vectors: jax.Array, kernel: jax.Array, last_start: np.ndarray, n_starts: int, compute: ComputeOptions
) -> jax.Array:
    """Max over the first `n_starts` start positions of every filter. char_vectors (N, C', E) -> (N, F).

    char_vectors must hold at least n_starts + Wmax - 1 positions (zero vectors past the token are
    fine: the starts that would read them are masked by `last_start`).
    """
    N, C, E = char_vectors.shape
    K = kernel.shape[0]  # Wmax * E
    # Window s is the K consecutive values from position s on of a token's flattened (C' * E) vector.
    # Slicing the flattened vectors keeps every piece K wide: as E-wide pieces (one per width), a TPU
    # pads each to its 128 lanes, and the backward pass then wrote and summed 8x the windows' size.
    flat = char_vectors.reshape(N, C * E)
    windows = jnp.stack([flat[:, s * E : s * E + K] for s in range(n_starts)], axis=1)  # (N, S, K)
    valid = np.arange(n_starts)[:, None] <= last_start[None, :]  # (S, F), static
    # Only when S reaches past C - Wmax + 1 (tokens of 44+ characters) can a start pass a filter's last one.
    last = None if valid.all() else tuple(int(v) for v in last_start)
    n_blocks = _n_blocks(windows.shape[0], n_starts, compute.token_shards)
    return conv_max(windows, kernel, last, n_blocks, jnp.dtype(compute.dtype).name)


# Rows (tokens x starts) of the convolution per block and device: its (rows, F) output then stays in
# the caches between the product and the max, a faster forward on CPU (measured: bench/RESULTS.md,
# "Design figures").
CONV_BLOCK_ROWS = 1024


def _n_blocks(n_tokens, n_starts: int, shards: int = 1) -> int:
    """The largest divisor of one shard's N / shards tokens that leaves at least CONV_BLOCK_ROWS rows per
    block on each shard (1: one block).

    Sized by one device's tokens, not the whole batch's: with the batch's 40,960 tokens split over
    8 chips, blocks sized by the global count held 8 tokens per chip, and each of the 640 loop trips
    read the whole (Wmax*E, F) kernel from HBM again (measured: bench/RESULTS_tpu_compile.md, "The char
    CNN's convolution blocks, sized per device").
    """
    if not isinstance(n_tokens, int):  # symbolic (jax.export): one block
        return 1
    per_shard = n_tokens // shards if n_tokens % shards == 0 else n_tokens
    target = max(1, per_shard * n_starts // CONV_BLOCK_ROWS)
    return max(d for d in range(1, target + 1) if per_shard % d == 0)


def _blocks(x: jax.Array, n_blocks: int) -> jax.Array:
    """(N, ...) -> (n_blocks, N / n_blocks, ...), block j = tokens j, j + n_blocks, j + 2 n_blocks, ...

    Strided, so that a token axis sharded over a mesh keeps every device's tokens in every block (no
    device needs another's), as `softmax.full_softmax_loss` does with vocabulary chunks.
    """
    return jnp.swapaxes(x.reshape(x.shape[0] // n_blocks, n_blocks, *x.shape[1:]), 0, 1)


def _unblock(x: jax.Array) -> jax.Array:
    """Inverse of `_blocks`: (n_blocks, N / n_blocks, ...) -> (N, ...)."""
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _block_conv_max(windows, kernel, last_start, compute_dtype):
    """One block: windows (n, S, K) -> max and argmax over S, both (n, F)."""
    conv = matmul(windows, kernel, compute_dtype)  # (n, S, F), before bias
    if last_start is not None:
        valid = np.arange(windows.shape[1])[:, None] <= np.asarray(last_start)[None, :]
        conv = jnp.where(jnp.asarray(valid), conv, -jnp.inf)
    return jnp.max(conv, axis=1), jnp.argmax(conv, axis=1).astype(jnp.int32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def conv_max(
    windows: jax.Array, kernel: jax.Array, last_start: tuple[int, ...] | None, n_blocks: int, compute_dtype: str
) -> jax.Array:
    """max over starts s of windows[:, s] @ kernel, in token blocks: (N, S, K), (K, F) -> (N, F).

    Args:
      windows: im2col windows (N, S, K = Wmax*E).
      kernel: stacked kernel (K, F).
      last_start: None (every start valid), or each filter's last valid start (F ints): later starts
        are left out of its max.
      n_blocks: token blocks, a divisor of N (`_n_blocks`); the (N, S, F) convolution is never whole.
      compute_dtype: "float32" or "bfloat16" for the products.

    The gradient keeps only the argmax: autodiff of `jnp.max` would keep the whole (N, S, F) convolution
    for the backward pass and re-read it three times there (equality mask, tie count, select). It flows
    to the first maximal start instead of being split over tied ones; ties come from windows whose
    characters the filter reads are the same (repeated letters, all-PAD windows), so the weight and
    embedding gradients are the same sums either way, up to float rounding.
    """
    return _conv_max_fwd(windows, kernel, last_start, n_blocks, compute_dtype)[0]


def _conv_max_fwd(windows, kernel, last_start, n_blocks, compute_dtype):
    pooled, argmax = jax.lax.map(
        lambda w: _block_conv_max(w, kernel, last_start, compute_dtype), _blocks(windows, n_blocks)
    )
    return _unblock(pooled), (windows, kernel, _unblock(argmax))


def _conv_max_bwd(last_start, n_blocks, compute_dtype, residuals, g):
    windows, kernel, argmax = residuals  # (N, S, K), (K, F), (N, F)
    S, K = windows.shape[1:]
    starts = jnp.arange(S, dtype=jnp.int32)[None, :, None]  # (1, S, 1)

    def block(d_kernel, xs):
        w, a, g_block = xs  # (n, S, K), (n, F), (n, F)
        d_conv = jnp.where(starts == a[:, None, :], g_block[:, None, :], 0.0)  # (n, S, F)
        # Materialised once in the matmul dtype: left to the compiler, a TPU broadcast the pooled gradient
        # over the starts in bfloat16 (a costly relayout of packed rows) and rebuilt the select inside
        # both products (bench/RESULTS_tpu_compile.md, "The compiler's estimate").
        d_conv = lax.optimization_barrier(d_conv.astype(compute_dtype))
        d_windows = matmul(d_conv, kernel.T, compute_dtype)  # (n, S, K)
        d_kernel = d_kernel + matmul(w.reshape(-1, K).T, d_conv.reshape(-1, d_conv.shape[-1]), compute_dtype)
        return d_kernel, d_windows

    d_kernel, d_windows = jax.lax.scan(
        block,
        jnp.zeros(kernel.shape, jnp.float32),
        (_blocks(windows, n_blocks), _blocks(argmax, n_blocks), _blocks(g, n_blocks)),
    )
    return _unblock(d_windows).astype(windows.dtype), d_kernel.astype(kernel.dtype)


conv_max.defvjp(_conv_max_fwd, _conv_max_bwd)


def content_width(char_ids: np.ndarray, pad: int = PAD_CHAR + 1) -> int:
    """Host-side: 1 + the last position holding anything but PAD in any real token of the batch.

    Past this position every real token is all PAD, so every window starting there has the same value
    (see `token_embedding`). Padding tokens (all zeros) do not count: their vectors are masked out.
    `pad`: the shifted padding character (`vocabulary.pad_id`). Only the first C ids of a token are
    characters: give `char_ids[..., :C]` for a model with word ids.
    """
    real = np.any(char_ids > 0, axis=-1)  # (...,)
    content = (char_ids != pad) & real[..., None]  # shifted PAD
    positions = np.nonzero(np.any(content.reshape(-1, char_ids.shape[-1]), axis=0))[0]
    return int(positions[-1]) + 1 if positions.size else 1


def content_bucket(char_ids: np.ndarray, max_characters_per_token: int, pad: int = PAD_CHAR + 1) -> int:
    """`content_width` rounded up to a multiple of 8 (at least 3, for the `<S>`/`</S>` tokens), at most C.

    Batches of a stream then compile at most C/8 variants of the char CNN. `char_ids` (..., W): ids of a
    model with word ids hold them after the C characters, which do not count here.
    """
    width = max(content_width(char_ids[..., :max_characters_per_token], pad), 3)
    return min(-(-width // 8) * 8, max_characters_per_token)


def highway(x: jax.Array, layer_weights, compute_dtype=jnp.float32) -> jax.Array:
    """One highway layer with bilm-tf semantics. x (N, F) -> (N, F).

    g = sigmoid(x W_carry + b_carry) weights the relu branch: y = g * relu(x W_transform + b_transform) + (1 - g) * x.
    """
    w = layer_weights
    return _highway(x, w["W_carry"], w["b_carry"], w["W_transform"], w["b_transform"], jnp.dtype(compute_dtype).name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _highway(x, W_carry, b_carry, W_transform, b_transform, compute_dtype: str):
    """`highway` with its gradient written out: x (N, F), kernels (F, F), biases (F,) -> (N, F).

    Autodiff's backward pass hands the TPU compiler each gradient product with the elementwise work
    before it (the sigmoid's and relu's slopes, the carry term) as part of the product's operand, and
    the compiler fuses that work into the product, where it is redone for every block of the output: the
    two largest products of the char CNN's backward pass were estimated at 5-6x their FLOP time. Here
    each pre-activation's gradient is computed once and materialised in the matmul dtype (which the
    products cast it to anyway), and the four gradient products read it and x in that dtype as they
    are. Measured: bench/RESULTS_tpu_compile.md, "The compiler's estimate".
    """
    return _highway_fwd(x, W_carry, b_carry, W_transform, b_transform, compute_dtype)[0]


def _highway_fwd(x, W_carry, b_carry, W_transform, b_transform, compute_dtype):
    gate = jax.nn.sigmoid(linear(x, W_carry, b_carry, compute_dtype))
    transform = jax.nn.relu(linear(x, W_transform, b_transform, compute_dtype))
    # x in the matmul dtype for the kernels' gradients (the forward products cast it so too).
    return gate * transform + (1.0 - gate) * x, (x, x.astype(compute_dtype), gate, transform, W_carry, W_transform)


def _highway_bwd(compute_dtype, residuals, dy):
    x, x_mm, gate, transform, W_carry, W_transform = residuals
    d_carry = dy * (transform - x) * (gate * (1.0 - gate))  # through the sigmoid: its slope g (1 - g)
    d_transform = jnp.where(transform > 0, dy * gate, 0.0)  # relu's slope, 0 at 0 as jax.nn.relu's
    # The barrier keeps the compiler from fusing the two gradients back into the products' operands.
    d_carry_mm, d_transform_mm = lax.optimization_barrier(
        (d_carry.astype(compute_dtype), d_transform.astype(compute_dtype))
    )
    dx = (
        dy * (1.0 - gate)
        + matmul(d_carry_mm, W_carry.T, compute_dtype)
        + matmul(d_transform_mm, W_transform.T, compute_dtype)
    )
    F = x.shape[-1]
    x_rows = x_mm.reshape(-1, F).T
    d_W_carry = matmul(x_rows, d_carry_mm.reshape(-1, F), compute_dtype)
    d_W_transform = matmul(x_rows, d_transform_mm.reshape(-1, F), compute_dtype)
    d_b_carry = jnp.sum(d_carry.reshape(-1, F), axis=0)
    d_b_transform = jnp.sum(d_transform.reshape(-1, F), axis=0)
    return dx, d_W_carry, d_b_carry, d_W_transform, d_b_transform


_highway.defvjp(_highway_fwd, _highway_bwd)


def token_embedding(
    weights,
    config: BiLMConfig,
    char_ids: jax.Array,
    compute: ComputeOptions = ComputeOptions(),
    token_block: int | None = CNN_TOKEN_BLOCK,
) -> jax.Array:
    """Token vectors from shifted character ids.

    Args:
      weights: `BiLMParams.weights`.
      config: the architecture.
      char_ids: int (N, W), shifted ids: C characters in [0, n_raw_characters + 1), then for a model
        with words (`config.has_words`) the word id in [0, word_vocab_size + 1); 0 embeds as zeros.
      compute: the matmul dtype, and `content_positions`: a static S <= C such that every real token
        holds only PAD from position S on (`content_width` computes it). Starts >= S all see the same
        all-PAD window, so one window value stands for them and only S starts are computed: words are
        short, and C = 50 is not. None = C. Rows of all-zero padding tokens get meaningless vectors
        then; callers mask them.
      token_block: tokens per step of a sequential loop over the tokens (bounds inference memory);
        None computes all at once, which training needs: there the token axis is sharded over the
        mesh, and a loop over it would gather the tokens onto every device.

    Returns:
      float32 (N, P).
    """
    C = config.max_characters_per_token
    compute_dtype, content_positions = compute.dtype, compute.content_positions
    S = C if content_positions is None else min(max(int(content_positions), 1), C)
    word_ids = char_ids[:, C] if config.has_words else None
    char_ids = char_ids[:, :C] if config.has_words else char_ids
    # Row 0 is the padding id, which the weight file does not store.
    table = jnp.concatenate([jnp.zeros((1, config.char_embed_dim), jnp.float32), weights["char_embed"]])
    kernel, last_start = _stacked_kernel(weights, config)
    bias = jnp.concatenate([weights["CNN"][f"b_cnn_{i}"] for i in range(len(config.filters))])
    pooled = _pooled_starts(char_ids, table, kernel, last_start, config, S, compute, token_block)
    if S < C:  # the all-PAD window, for the filters that have valid starts at or past S
        pooled = _with_pad_window(pooled, table, kernel, last_start, config, S, compute_dtype)
    # max(x + b) == max(x) + b exactly (rounding is monotonic), so the bias is added after pooling.
    x = pooled + broadcast_trailing(bias, pooled.ndim)
    x = jax.nn.relu(x) if config.activation == "relu" else jnp.tanh(x)
    for k in range(config.n_highway):
        x = highway(x, weights[f"CNN_high_{k}"], compute_dtype)
    if word_ids is not None:  # ELMoForManyLangs' ConvTokenEmbedder: [word vector ; highway output]
        words = jnp.concatenate([jnp.zeros((1, config.word_dim), jnp.float32), weights["word_embed"]])
        x = jnp.concatenate([jnp.take(words, word_ids, axis=0), x], axis=-1)
    if config.has_cnn_projection:
        x = linear(x, weights["CNN_proj"]["W_proj"], weights["CNN_proj"]["b_proj"], compute_dtype)
    return x


def _pooled_starts(
    char_ids: jax.Array,
    table: jax.Array,
    kernel: jax.Array,
    last_start: np.ndarray,
    config: BiLMConfig,
    n_starts: int,
    compute: ComputeOptions,
    token_block: int | None,
) -> jax.Array:
    """Every filter's max over the first `n_starts` window starts, before the bias: char_ids int (N, C),
    table (262, E), kernel (Wmax*E, F), last_start (F,) -> (N, F).

    Tokens go through in `token_block`s of a sequential loop, or all at once (None), as `token_embedding`
    says.
    """
    C, S = config.max_characters_per_token, n_starts
    wmax = max(w for w, _ in config.filters)
    span = min(C, S + wmax - 1)  # character positions the first S windows read

    def block(ids):  # (n, C) -> (n, F)
        vectors = jnp.take(table, ids[:, :span], axis=0)
        vectors = jnp.pad(vectors, ((0, 0), (0, S + wmax - 1 - span), (0, 0)))
        return _conv_max(vectors, kernel, last_start, S, compute)

    N = char_ids.shape[0]
    # A symbolic N (a `jax.export` with symbolic batch/length) cannot be compared: take the blocked path.
    if token_block is None or (isinstance(N, int) and N <= token_block):
        return block(char_ids)
    # Blocks of padding tokens fill the last block; their rows are dropped.
    n_blocks = -(-N // token_block)
    padded = jnp.pad(char_ids, ((0, n_blocks * token_block - N), (0, 0)))
    pooled = jax.lax.map(block, padded.reshape(n_blocks, token_block, -1))
    return pooled.reshape(n_blocks * token_block, -1)[:N]


def _with_pad_window(
    pooled: jax.Array,
    table: jax.Array,
    kernel: jax.Array,
    last_start: np.ndarray,
    config: BiLMConfig,
    n_starts: int,
    compute_dtype,
) -> jax.Array:
    """`pooled` (N, F) raised to the all-PAD window's value (which every start from `n_starts` on sees)
    for the filters that have valid starts there."""
    wmax = max(w for w, _ in config.filters)
    pad_window = jnp.tile(table[pad_id(config)], wmax)[None, None, :]  # (1, 1, Wmax*E)
    pad_value = matmul(pad_window, kernel, compute_dtype)[0, 0]  # (F,)
    pad_value = jnp.where(jnp.asarray(last_start) >= n_starts, pad_value, -jnp.inf)
    return jnp.maximum(pooled, broadcast_trailing(pad_value, pooled.ndim))
