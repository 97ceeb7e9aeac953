"""Batches of sentences on every local device: the biLM replicated, the batch rows split over a mesh.

A `BatchRunner` puts the biLM's weights on the chosen local devices once (replicated) and runs each
batch of `length_buckets` as one program: `jax.jit` with in/out shardings over a one-axis mesh
("batch", `jax.make_mesh`), and inside it `jax.shard_map`, so each device embeds its own rows with no
communication at all (every sentence is independent; the char CNN's sequential token loop never sees
another device's rows). Programs are cached at module level per mesh and output (a new runner, a new
`embed_sentences` call, reuses them: nothing is traced again), and XLA compiles one per batch shape
(rows, T, S) that occurs, i.e. one per bucket; `shapes` records them. The weights are put on the mesh
once per parameter object and mesh (`placed_weights`), not once per runner.

A batch is either one sentence per row (`length_buckets.Batch`, its `<S>`/`</S>` added in the program)
or rows of several sentences with their boundaries in place (`packing.PackedBatch`, `bilm.packed_layers`).

The output is reduced on the device, so only what is kept comes back to the host: the output mode
(`output_modes`: all, top, average, mix, sentence_mean) supplies the reduction, traced inside the
program, and says what a fetched row holds.

With a `TokenCache`, the char CNN is replaced by a gather from the cache's (V, P) table, kept on the
devices, for the tokens it holds (`token_cache.lookup_rows`); the others go through the char CNN in
the same program, as in `embed_tokens`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from elmo_jax.features.embed import check_params
from elmo_jax.features.length_buckets import Batch
from elmo_jax.features.output_modes import MODES, OutputMode
from elmo_jax.features.packing import PackedBatch
from elmo_jax.features.token_cache import TokenCache, check_bytes_model, check_token_cache, lookup_rows
from elmo_jax.model.bilm import bilm_layers, contextual_layers, packed_layers, remove_boundaries
from elmo_jax.model.char_cnn import token_embedding
from elmo_jax.model.jax_versions import shard_map_unchecked
from elmo_jax.model.lstm import zero_state
from elmo_jax.model.params import BiLMParams
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.model.vocabulary import token_vocabulary

AXIS = "batch"


def local_devices(devices=None) -> list[jax.Device]:
    """The devices to embed on: all of this process's (None), or the given ones (`jax.Device`s, or
    indices into `jax.local_devices()`), each at most once."""
    local = jax.local_devices()
    if devices is None:
        return local
    chosen = []
    for d in devices:
        if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
            if not 0 <= d < len(local):
                raise ValueError(
                    f"--devices: {d} is not a local device index (this process has {len(local)}: 0-{len(local) - 1})"
                )
            d = local[d]
        if not isinstance(d, jax.Device) or d not in local:
            raise ValueError(f"--devices: {d!r} is not one of this process's devices {local}")
        if d in chosen:
            raise ValueError(f"--devices: {d} is listed twice")
        chosen.append(d)
    if not chosen:
        raise ValueError("--devices: no device given")
    return chosen


def device_mesh(devices: Sequence[jax.Device]) -> jax.sharding.Mesh:
    """The one-axis ("batch") mesh over `devices`."""
    return jax.make_mesh((len(devices),), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=list(devices))


class BatchRunner:
    """Runs batches of one biLM on a mesh of local devices; see the module doc.

    Args:
      params: the biLM (checked finite once).
      output: the output mode (`output_modes.output_mode`).
      devices: see `local_devices`.
      compute_dtype: "float32" or "bfloat16" matrix products.
      cache: a `TokenCache` of this biLM, or None (the char CNN for every token).
    """

    def __init__(self, params: BiLMParams, output: OutputMode, *, devices=None, compute_dtype="float32", cache=None):
        check_params(params)
        if cache is not None:
            check_bytes_model(params.config, "token_cache")
            if not isinstance(cache, TokenCache):
                raise ValueError(f"token_cache must be a TokenCache, found {type(cache).__name__}")
            check_token_cache(cache, params, weights=False)
        if compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--compute_dtype must be float32 or bfloat16, found {compute_dtype!r}")
        self.config, self.output, self.compute_dtype, self.cache = params.config, output, compute_dtype, cache
        self.vocabulary = token_vocabulary(params)  # the model's text -> ids, for whoever feeds this runner
        self.devices = local_devices(devices)
        self.mesh = device_mesh(self.devices)
        replicated = NamedSharding(self.mesh, P())
        self._rows, self._replicated = NamedSharding(self.mesh, P(AXIS)), replicated
        self._weights = placed_weights(params, self.mesh)
        self._mix = jax.device_put(np.asarray(output.mix, np.float32), replicated)
        self._table = None if cache is None else jax.device_put(np.asarray(cache.embeddings, np.float32), replicated)
        self.shapes: set[tuple] = set()  # the program shapes run so far
        self.padded_tokens = 0

    @property
    def row_multiple(self) -> int:
        """Batch rows must be a multiple of this (the number of devices)."""
        return len(self.devices)

    def dispatch(self, batch: Batch | PackedBatch) -> jax.Array:
        """Starts `batch` on the devices; returns its (asynchronous) result."""
        rows, T, S = batch.shape
        if rows % self.row_multiple:
            raise ValueError(f"internal error: {rows} batch rows do not split over {self.row_multiple} devices")
        compute = ComputeOptions(dtype=self.compute_dtype, content_positions=S)
        mode, dtype = self.output.name, np.dtype(self.output.batch_dtype).name
        if isinstance(batch, PackedBatch):
            if self.cache is not None:
                raise ValueError("internal error: packed batches take the char path, not the token cache")
            self.padded_tokens += batch.token_slots
            self.shapes.add(("packed", rows, T, S))
            program = _packed_program(self.mesh, mode, dtype)
            arrays = jax.device_put((batch.chars, batch.starts, batch.segments), self._rows)
            return program(self.config, compute, self._weights, *arrays, self._mix)
        self.padded_tokens += rows * T
        if self.cache is None:
            self.shapes.add(("chars", rows, T, S))
            program = _chars_program(self.mesh, mode, dtype)
            chars = jax.device_put(batch.chars, self._rows)  # explicit: jit takes no host arrays with several processes
            return program(self.config, compute, self._weights, chars, self._mix)
        found = lookup_rows(self.cache, _padded_tokens(batch), T)
        self.shapes.add(("cache", rows, T, S, found.oov_chars.shape[0]))
        program = _cache_program(self.mesh, mode, dtype)
        return program(
            self.config,
            compute,
            self._weights,
            self._table,
            *jax.device_put((found.rows, found.oov_index), self._rows),
            jax.device_put(found.oov_chars, self._replicated),
            jax.device_put(found.mask, self._rows),
            self._mix,
        )


# Weights put on a mesh, per parameter object (by id, dropped with it) and mesh.
_PLACED: dict[int, tuple[weakref.ref, dict]] = {}


def placed_weights(params: BiLMParams, mesh: jax.sharding.Mesh):
    """`params.weights` replicated on `mesh`'s devices: put there once per parameter object and mesh,
    and kept while the object lives (a new runner of the same parameters copies nothing)."""
    entry = _PLACED.get(id(params))
    if entry is None or entry[0]() is not params:
        entry = (weakref.ref(params, functools.partial(_forget_placed, id(params))), {})
        _PLACED[id(params)] = entry
    placed = entry[1]
    if mesh not in placed:
        placed[mesh] = jax.device_put(params.weights, NamedSharding(mesh, P()))
    return placed[mesh]


def _forget_placed(key: int, _ref) -> None:
    _PLACED.pop(key, None)


def _padded_tokens(batch: Batch) -> list[list[str]]:
    """The batch's tokens per row, empty rows for padding (the token-cache path)."""
    rows = [piece.tokens for piece in batch.pieces]
    if any(tokens is None for tokens in rows):
        raise ValueError("internal error: the token-cache path needs the pieces' tokens")
    return rows + [[] for _ in range(batch.chars.shape[0] - len(rows))]


# The check is off in the shard_maps below (`shard_map_unchecked`): each device's rows are independent and
# nothing is communicated, so the varying-manual-axes check has nothing to guard (it would only ask for the
# LSTM's zero initial state to be marked as varying over the batch axis).


def _embed_chars(weights, chars, mix, *, config, compute, mode, dtype):
    """One device's rows: chars (b, T, C) -> its output."""
    layers, mask, _ = bilm_layers(
        BiLMParams(weights, config), chars, zero_state(config, chars.shape[0]), compute=compute
    )
    return MODES[mode].reduce(remove_boundaries(layers, mask)[0], mix, dtype)


def _embed_cached(weights, table, rows, oov_index, oov_chars, mask, mix, *, config, compute, mode, dtype):
    """One device's rows from cache rows (b, T2) and the uncached tokens' ids (U, C) -> its output."""
    oov = token_embedding(weights, config, oov_chars, compute)  # (U, P)
    computed = jnp.take(oov, jnp.maximum(oov_index, 0), axis=0)  # (b, T2, P)
    known = jnp.where(((oov_index < 0) & mask)[..., None], jnp.take(table, rows, axis=0), 0.0)
    tokens = jnp.where((oov_index >= 0)[..., None], computed, known)
    params = BiLMParams(weights, config)
    layers, mask, _ = contextual_layers(params, tokens, mask, zero_state(config, rows.shape[0]), compute=compute)
    return MODES[mode].reduce(remove_boundaries(layers, mask)[0], mix, dtype)


@functools.cache
def _chars_program(mesh, mode: str, dtype: str):
    """The jitted char-path program for `mesh` (weights and mix replicated, rows split) and the output mode
    named `mode`, returning `dtype` (names, so that the cache finds the program again)."""
    rows, replicated = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())

    def program(config, compute, weights, chars, mix):
        body = functools.partial(_embed_chars, config=config, compute=compute, mode=mode, dtype=dtype)
        return shard_map_unchecked(body, mesh=mesh, in_specs=(P(), P(AXIS), P()), out_specs=P(AXIS))(
            weights, chars, mix
        )

    return jax.jit(
        program,
        in_shardings=(replicated, rows, replicated),
        out_shardings=rows,
        static_argnums=(0, 1),
    )


def _embed_packed(weights, chars, starts, segments, mix, *, config, compute, mode, dtype):
    """One device's packed rows: chars (b, T2, C) with the boundaries in place -> its output."""
    layers, _ = packed_layers(BiLMParams(weights, config), chars, starts, compute=compute)
    return MODES[mode].reduce_packed(layers, segments, mix, dtype)


@functools.cache
def _packed_program(mesh, mode: str, dtype: str):
    """The jitted program of packed rows (`packing.PackedBatch`) for `mesh` and the output mode `mode`."""
    rows, replicated = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())

    def program(config, compute, weights, chars, starts, segments, mix):
        body = functools.partial(_embed_packed, config=config, compute=compute, mode=mode, dtype=dtype)
        specs = (P(), P(AXIS), P(AXIS), P(AXIS), P())
        return shard_map_unchecked(body, mesh=mesh, in_specs=specs, out_specs=P(AXIS))(
            weights, chars, starts, segments, mix
        )

    return jax.jit(
        program,
        in_shardings=(replicated, rows, rows, rows, replicated),
        out_shardings=rows,
        static_argnums=(0, 1),
    )


@functools.cache
def _cache_program(mesh, mode: str, dtype: str):
    """The jitted token-cache program for `mesh` (weights, table, uncached ids and mix replicated) and the
    output mode named `mode`, returning `dtype`."""
    rows, replicated = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())
    specs = (P(), P(), P(AXIS), P(AXIS), P(), P(AXIS), P())

    def program(config, compute, weights, table, rows_, oov_index, oov_chars, mask, mix):
        body = functools.partial(_embed_cached, config=config, compute=compute, mode=mode, dtype=dtype)
        return shard_map_unchecked(body, mesh=mesh, in_specs=specs, out_specs=P(AXIS))(
            weights, table, rows_, oov_index, oov_chars, mask, mix
        )

    shardings = tuple(rows if spec == P(AXIS) else replicated for spec in specs)
    return jax.jit(program, in_shardings=shardings, out_shardings=rows, static_argnums=(0, 1))
