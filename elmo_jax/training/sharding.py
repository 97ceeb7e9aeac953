"""Where every array of training lives on the device mesh: the mesh, one table of partition rules, and
the shardings of the train state and the batch derived from it. `jitted_steps` compiles the
train and eval steps with them.

The mesh has two axes, `data` (batch rows, and the biLM's weights between steps) and `model` (the softmax's
vocabulary only), sized by `--config.mesh.data` and `--config.mesh.model`; the vocabulary is split over
both (`fit_rules`).
Every array axis has a logical name ("batch", "vocab", "gates", ...) and `RULES` maps each name to mesh
axes or to None (replicated), so changing the parallelism is a change of this table, never of the
model code. `jax.jit` with these shardings
(pjit) does the rest: XLA's SPMD partitioner inserts the collectives.

Shapes: D = 2 directions, L layers, B global batch rows, T unroll steps, C chars per token,
P projection, H LSTM cell, V' padded vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elmo_jax.model.jax_versions import shard_map_unchecked
from elmo_jax.model.params import from_flat, iter_flat
from elmo_jax.training.softmax import VOCAB_PAD_MULTIPLE

MESH_AXES = ("data", "model")

# Logical axis -> mesh axis (None: replicated). Every axis of every training array is named here.
#
# The softmax (793,471 x 512 for the published vocabulary, 1.6 GB, and as much again for its Adagrad
# accumulators and its gradient) is split over the vocabulary on both axes, so that a data-parallel mesh
# does not keep a copy of it and its Adagrad state on every device (the state per device before and after:
# docs/SCALING.md, "Memory per device"): each device scores and updates its own rows for every row of the
# batch, and only the ids, outputs and gradient rows of the batch cross devices.
#
# The biLM's large weights (the LSTM kernels and projections, the highway and projection layers of the
# char CNN: 93.6M parameters, 374 MB) are split over "data" by their input axis between steps, and
# gathered whole once at the start of each step (`weight_gather`): each device keeps and updates 1/N of
# them and of their Adagrad state, where a replicated biLM had every device make the optimiser's passes
# over all of it (split, the optimiser's kernels of the v5e-8 bilm_large step take less time by the
# compiler's estimate; measured: bench/RESULTS_tpu_compile.md, "The biLM's weights split over the data
# axis"). The gather is a collective a replicated biLM did not need (more bytes of collectives per chip);
# the gradient's all-reduce stays, followed by a local slice. A weight whose axis does not divide into the
# data axis's shards stays replicated (`param_shardings`).
#
# The computation itself is never split on the biLM's axes: ELMo's LSTM is sequential, and with its kernel
# split on "model" each of the T steps of each layer would need its own collectives (the i, j, f, o split
# of a "gates"-sharded kernel crosses shards, and a "cell"-sharded projection needs an all-reduce of
# (D, B, P) before the next step can start): 2 x L x T latency-bound collectives per forward pass, plus as
# many in the backward pass. It does not pay. The entries stay so that trying it is a change of this table.
RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", "data"),  # B: rows of the batch and of the carried LSTM state
    ("vocab", ("model", "data")),  # V': softmax rows (padded to a multiple of VOCAB_PAD_MULTIPLE)
    ("gates", None),  # 4H: LSTM kernel columns and gate biases (i, j, f, o blocks)
    ("cell", None),  # H: LSTM cell state
    ("lstm_in", "data"),  # 2P: LSTM kernel rows ([x ; h]), split between steps
    ("proj_in", "data"),  # H: rows of the LSTM projection W_P_0, split between steps
    ("dense_in", "data"),  # F: rows of the char CNN's highway and projection kernels, split between steps
    ("embed", None),  # P: token embedding, LSTM output, softmax columns
    ("filters", None),  # F: char CNN filters, highway input
    ("highway", None),  # F: highway output
    ("char_vocab", None),  # 261 raw character ids
    ("char_embed", None),  # E: character embedding
    ("conv_height", None),  # 1: the HWIO kernel's height
    ("conv_width", None),  # filter width
    ("direction", None),  # D = 2
    ("layer", None),  # L
    ("time", None),  # T
    ("chars", None),  # C
)

# Logical axes of the biLM's weights, by the weight file's dataset name (see params.weight_shapes).
_BILM_AXES = {
    "char_embed": ("char_vocab", "char_embed"),
    "W_cnn": ("conv_height", "conv_width", "char_embed", "filters"),
    "b_cnn": ("filters",),
    "W_carry": ("dense_in", "highway"),
    "W_transform": ("dense_in", "highway"),
    "b_carry": ("highway",),
    "b_transform": ("highway",),
    "W_proj": ("dense_in", "embed"),
    "b_proj": ("embed",),
    "W_0": ("lstm_in", "gates"),
    "B": ("gates",),
    "W_P_0": ("proj_in", "embed"),
}
SOFTMAX_AXES = {"W": ("vocab", "embed"), "b": ("vocab",)}
BATCH_AXES = ("direction", "batch")  # (D, B, ...) batch arrays; trailing axes (T, C) replicated
LSTM_STATE_AXES = {"c": ("direction", "layer", "batch", "cell"), "h": ("direction", "layer", "batch", "embed")}


def make_mesh(data: int, model: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The ("data", "model") mesh; one size may be -1 (the device count divided by the other).

    Args:
      data, model: `config.mesh.data`, `config.mesh.model`.
      devices: the devices to use (default: all, `jax.devices()`).

    Raises:
      ValueError: sizes that are not positive (or one -1), or whose product is not the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    flags = f"--config.mesh.data={data} --config.mesh.model={model}"
    sizes = [data, model]
    if (
        any(not isinstance(s, (int, np.integer)) or isinstance(s, bool) or (s < 1 and s != -1) for s in sizes)
        or sizes.count(-1) > 1
    ):
        raise ValueError(f"{flags}: mesh sizes must be positive integers, and at most one of them -1")
    if -1 in sizes:
        known = sizes[1 - sizes.index(-1)]
        if n % known:
            raise ValueError(
                f"{flags}: {n} devices do not split into groups of {known}; set sizes whose product is {n}"
            )
        sizes[sizes.index(-1)] = n // known
    if sizes[0] * sizes[1] != n:
        raise ValueError(
            f"{flags}: the mesh has {sizes[0]} x {sizes[1]} = {sizes[0] * sizes[1]} devices but "
            f"there are {n}; set sizes whose product is {n} (one of them may be -1)"
        )
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)


def _entry_axes(mesh_axis: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The mesh axes of a PartitionSpec entry, major to minor: none, one, or several."""
    return () if mesh_axis is None else (mesh_axis,) if isinstance(mesh_axis, str) else tuple(mesh_axis)


def mesh_shards(mesh: Mesh, mesh_axis: str | tuple[str, ...] | None) -> int:
    """How many shards a PartitionSpec entry splits an array axis into: a mesh axis's size, the product
    of several axes' sizes, or 1 (None: replicated)."""
    return int(np.prod([mesh.shape[name] for name in _entry_axes(mesh_axis)], dtype=np.int64))


def fit_rules(mesh: Mesh, rules=RULES) -> tuple:
    """`rules` as they apply on `mesh`, for an entry of several mesh axes: axes of size 1 are left out (a
    (1, 8) mesh shards the vocabulary on "model", an (8, 1) mesh on "data"), and for "vocab" so are the
    trailing axes whose shards would not divide the vocabulary padding (`VOCAB_PAD_MULTIPLE`): a data
    axis of 6 devices then leaves the softmax on "model" (replicated on a (6, 1) mesh) instead of
    refusing the mesh, since the padding, and so every checkpoint's shapes, must not depend on the
    mesh. The entry's first axis stays even when it does not divide, for `check_training_mesh` to
    refuse it, naming it."""
    fitted = []
    for name, entry in rules:
        if isinstance(entry, tuple):
            axes = [axis for axis in entry if mesh.shape[axis] > 1]
            while name == "vocab" and axes and VOCAB_PAD_MULTIPLE % mesh_shards(mesh, tuple(axes)):
                if axes == [entry[0]]:
                    break  # for check_training_mesh to refuse, naming it
                axes.pop()
            axes = axes or [entry[0]]
            entry = axes[0] if len(axes) == 1 else tuple(axes)
        fitted.append((name, entry))
    return tuple(fitted)


def logical_shards(mesh: Mesh, name: str, rules=RULES) -> int:
    """How many shards `rules` split the logical axis `name` into on `mesh` (1: replicated)."""
    return mesh_shards(mesh, dict(fit_rules(mesh, rules)).get(name))


def logical_to_spec(axes: Sequence[str | None], rules=RULES) -> PartitionSpec:
    """PartitionSpec of an array whose axes have these logical names (None: replicated)."""
    table = dict(rules)
    spec = []
    for name in axes:
        if name is not None and name not in table:
            raise ValueError(f"logical axis {name!r} has no entry in the partition rules {sorted(table)}")
        spec.append(None if name is None else table[name])
    used = [a for entry in spec for a in _entry_axes(entry)]
    if len(used) != len(set(used)):
        raise ValueError(f"partition rules map two axes of {tuple(axes)} to one mesh axis: {tuple(spec)}")
    return PartitionSpec(*spec)


def param_logical_axes(params: dict) -> dict:
    """The logical axes of every leaf of `TrainState.params` ({"bilm": weight-file dict, "softmax"})."""

    def bilm_axes(path, leaf):
        name = path[-1].key
        key = name if name in _BILM_AXES else name.rsplit("_", 1)[0]  # W_cnn_3 -> W_cnn
        if key not in _BILM_AXES:
            raise ValueError(f"no logical axes for biLM weight {'/'.join(p.key for p in path)}")
        return _BILM_AXES[key]

    return {
        "bilm": jax.tree_util.tree_map_with_path(bilm_axes, params["bilm"]),
        "softmax": {k: SOFTMAX_AXES[k] for k in params["softmax"]},
    }


def _named(
    mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int], what: str, rules, replicate_uneven: bool = False
) -> NamedSharding:
    """The NamedSharding of an array with these logical axes and shape. An axis that does not divide into
    its shards is an error, or with `replicate_uneven` (weights, whose split only saves memory and
    optimiser work) left replicated."""
    spec = logical_to_spec(axes, fit_rules(mesh, rules))
    if replicate_uneven:
        spec = PartitionSpec(
            *(None if e is not None and size % mesh_shards(mesh, e) else e for size, e in zip(shape, spec))
        )
    for dim, (size, mesh_axis) in enumerate(zip(shape, spec)):
        if mesh_axis is not None and size % mesh_shards(mesh, mesh_axis):
            raise ValueError(
                f"{what}: axis {dim} ({axes[dim]}, size {size}) does not divide into the "
                f"{mesh_shards(mesh, mesh_axis)} shards of mesh axis {mesh_axis!r}"
            )
    return NamedSharding(mesh, spec)


def param_shardings(mesh: Mesh, params: dict, rules=RULES) -> dict:
    """NamedShardings of `TrainState.params` (arrays or shapes), following `rules`; a biLM weight axis that
    does not divide into its shards stays replicated (e.g. a 6-device data axis and W_0's 1,024 rows)."""
    axes = param_logical_axes(params)
    return jax.tree_util.tree_map_with_path(
        lambda path, a, leaf: _named(
            mesh, a, leaf.shape, jax.tree_util.keystr(path), rules, replicate_uneven=path[0].key == "bilm"
        ),
        axes,
        params,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def weight_gather(shardings, stacked: Sequence[tuple[str, ...]] = ()):
    """The gather of the biLM's weights at the start of a step: weights -> the same weights, replicated.

    Args:
      shardings: NamedShardings of the weights between steps (`param_shardings(...)["bilm"]`).
      stacked: groups of weight paths that the model stacks along a new leading axis
        (`lstm.stacked_weight_paths`); their gradients are sliced as one stack (`_own_slices`).

    Returns a function of the weights (inside `jax.jit`) that constrains them to be replicated, so that XLA
    all-gathers each split weight once before the model reads it, and whose gradient is summed over the
    devices and then sliced, each device keeping its own slice (`_own_slice`). Constrained straight to
    the shards, the gradient's split propagated back into the products that compute it, which the
    partitioner then split differently and partly recomputed, adding FLOPs per chip (measured:
    bench/RESULTS_tpu_compile.md, "The biLM's weights split over the data axis").
    """
    replicated = jax.tree.map(lambda s: NamedSharding(s.mesh, PartitionSpec()), shardings)

    @jax.custom_vjp
    def gather(weights):
        return jax.lax.with_sharding_constraint(weights, replicated)

    def gather_fwd(weights):
        return gather(weights), None

    def gather_bwd(_, grads):
        summed = jax.lax.with_sharding_constraint(grads, replicated)
        return (_own_slices(summed, shardings, stacked),)

    gather.defvjp(gather_fwd, gather_bwd)
    return gather


def _own_slices(grads: dict, shardings: dict, stacked: Sequence[tuple[str, ...]]) -> dict:
    """`_own_slice` of every summed gradient; each group of `stacked` is stacked again and sliced as one array.

    The gradient of weights the model stacks (the two directions' LSTM kernels, `lstm.stacked_cell`)
    comes out of one product for the stack and is split into the leaves; sliced leaf by leaf, that split
    copied each direction's whole gradient before the slice (two copies per layer of the `bilm_large`
    step on a v5e chip). Stacked again here, XLA cancels the split against the stack, slices the
    stack, and splits only the device's slice (measured: bench/RESULTS_tpu_compile.md, "The sampled
    softmax's sums as products; what the goal needs", paragraph "The LSTM kernels' gradients sliced as one
    stack"). A replicated group has nothing to slice and is left as it is.
    """
    flat, specs = dict(iter_flat(grads)), dict(iter_flat(shardings))
    sliced = {}
    for group in stacked:
        sharding = specs[group[0]]
        if any(specs[path].spec != sharding.spec for path in group):
            raise ValueError(f"the stacked weights {group} are not split alike")
        if sharding.is_fully_replicated:  # nothing to slice (the LSTM biases): no stack either
            continue
        stack_sharding = NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))
        own = _own_slice(jnp.stack([flat[path] for path in group]), stack_sharding)
        sliced.update({path: own[i] for i, path in enumerate(group)})
    sliced.update({path: _own_slice(x, specs[path]) for path, x in flat.items() if path not in sliced})
    return from_flat(sliced)


def _own_slice(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    """A replicated x, each device keeping only its slice under `sharding` (a local slice, in a shard_map:
    constrained to `sharding` instead, the partitioner let later readers, such as the gradient norm, read
    the whole replicated x on every device)."""
    spec, mesh = sharding.spec, sharding.mesh
    if all(entry is None for entry in spec):
        return x

    def keep(full):
        for dim, entry in enumerate(spec):
            if entry is None:
                continue
            index = 0
            for axis in _entry_axes(entry):
                index = index * mesh.shape[axis] + jax.lax.axis_index(axis)
            size = full.shape[dim] // mesh_shards(mesh, entry)
            full = jax.lax.dynamic_slice_in_dim(full, index * size, size, axis=dim)
        return full

    return shard_map_unchecked(keep, mesh=mesh, in_specs=PartitionSpec(), out_specs=spec)(x)


def state_shardings(
    mesh: Mesh, abstract_state, optimizer: optax.GradientTransformation, rules=RULES, replicate_lstm: bool = False
):
    """NamedShardings of a whole `TrainState` (from `jax.eval_shape` of `init_train_state`).

    Parameters follow the rules; the optimiser's per-parameter state (Adagrad's accumulators) mirrors
    the parameters, and the biLM's weight average mirrors the biLM; step, key and the optimiser's scalars
    are replicated; the carried LSTM state is sharded on its batch axis like the batch (or replicated with
    `replicate_lstm`).
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    params = param_shardings(mesh, abstract_state.params, rules)
    opt_state = optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract_state.opt_state,
        params,
        transform_non_params=lambda _: replicated,
    )
    lstm = type(abstract_state.lstm)(
        **{
            k: replicated
            if replicate_lstm
            else _named(mesh, LSTM_STATE_AXES[k], getattr(abstract_state.lstm, k).shape, f"LSTM state {k}", rules)
            for k in LSTM_STATE_AXES
        }
    )
    average = None if abstract_state.average is None else params["bilm"]
    return abstract_state.replace(
        step=replicated, params=params, opt_state=opt_state, key=replicated, lstm=lstm, average=average
    )


def batch_sharding(mesh: Mesh, rules=RULES) -> NamedSharding:
    """The sharding of every batch array (D, B, ...): rows on the batch axis, the rest replicated."""
    return NamedSharding(mesh, logical_to_spec(BATCH_AXES, fit_rules(mesh, rules)))


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying shardings (e.g. orbax restore targets, or `.lower()` arguments)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def check_training_mesh(mesh: Mesh, batch_size: int, process_count: int, rules=RULES) -> None:
    """Errors for people, before anything is compiled: the batch must split evenly over the processes
    and the batch axis, and the vocabulary padding over the vocabulary axis.
    """
    sizes = f"--config.mesh.data={mesh.shape['data']} --config.mesh.model={mesh.shape['model']}"
    if batch_size % process_count:
        raise ValueError(
            f"--config.batch_size={batch_size} is not divisible by the {process_count} processes: "
            "every process must feed the same number of rows"
        )
    table = dict(fit_rules(mesh, rules))
    batch_axis, vocab_axis = table.get("batch"), table.get("vocab")
    batch_shards, vocab_shards = mesh_shards(mesh, batch_axis), mesh_shards(mesh, vocab_axis)
    if batch_size % batch_shards:
        raise ValueError(
            f"--config.batch_size={batch_size} is not divisible by the {batch_shards} "
            f"shards of mesh axis {batch_axis!r} ({sizes}); use a batch size that is a multiple of "
            f"{batch_shards}"
        )
    if VOCAB_PAD_MULTIPLE % vocab_shards:
        raise ValueError(
            f"{sizes}: the softmax vocabulary is padded to a multiple of {VOCAB_PAD_MULTIPLE} and "
            f"sharded on mesh axis {vocab_axis!r}, whose size {vocab_shards} must divide "
            f"{VOCAB_PAD_MULTIPLE}"
        )


def process_rows(sharding: NamedSharding, batch_size: int) -> tuple[int, int]:
    """Which block of the global batch rows this process feeds: (block index, number of blocks).

    The rows a process feeds are those its devices hold under `sharding` (axis 1 of a batch array);
    they form one of `batch_size / n` equal contiguous blocks. With the batch axis spread over the
    processes, n is the process count and the block is the process's own; where processes share
    batch shards (e.g. a data axis smaller than the process count), they feed the same rows.
    """
    indices = sharding.addressable_devices_indices_map((1, batch_size))
    rows = sorted({(s[1].start or 0, batch_size if s[1].stop is None else s[1].stop) for s in indices.values()})
    start, stop = rows[0][0], rows[-1][1]
    covered = sum(b - a for a, b in rows)
    if covered != stop - start or batch_size % (stop - start) or start % (stop - start):
        raise ValueError(
            f"this process's devices hold batch rows {rows}, not one contiguous block; build the "
            "mesh with make_mesh (jax.make_mesh orders devices process by process)"
        )
    return start // (stop - start), batch_size // (stop - start)
