"""Where every array of training lives on the device mesh: the mesh, one table of partition rules, and
the shardings of the train state and the batch derived from it.

The mesh has two axes, `data` (batch rows) and `model` (the softmax's vocabulary), sized by
`--config.mesh.data` and `--config.mesh.model`. Every array axis has a logical name ("batch",
"vocab", "gates", ...) and `RULES` maps each name to a mesh axis or to None (replicated), so changing
the parallelism is a change of this table, never of the model code. `jax.jit` with these shardings
(pjit) does the rest: XLA's SPMD partitioner inserts the collectives.

Shapes: D = 2 directions, L layers, B global batch rows, T unroll steps, C chars per token,
P projection, H LSTM cell, V' padded vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elmo_jax.model.lstm import zero_state
from elmo_jax.training.softmax import VOCAB_PAD_MULTIPLE
from elmo_jax.training.train_step import StepConfig, eval_step_fn, init_train_state, train_step_fn

MESH_AXES = ("data", "model")

# Logical axis -> mesh axis (None: replicated). Every axis of every training array is named here.
#
# Why only "batch" and "vocab" are sharded: the softmax (793,471 x 512 for the published vocabulary,
# 1.6 GB, and as much again for its Adagrad accumulators and its gradient) is the only large tensor,
# and sharding it over the vocabulary costs one small all-reduce of the gathered candidate rows per
# step. The whole biLM is 93.6M parameters (374 MB): replicated, it and its Adagrad state and gradient
# need ~1.1 GB per device, which every accelerator has. Sharding the LSTM on "model" would save at
# most that, but ELMo's LSTM is sequential: each of the T steps of each layer would then need its own
# collectives (the i, j, f, o split of a "gates"-sharded kernel crosses shards, and a "cell"-sharded
# projection needs an all-reduce of (D, B, P) before the next step can start): 2 x L x T latency-bound
# collectives per forward pass, plus as many in the backward pass, for ~1 GB of memory. It does not
# pay. The entries stay so that trying it is a change of this table.
RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),  # B: rows of the batch and of the carried LSTM state
    ("vocab", "model"),  # V': softmax rows (padded to a multiple of VOCAB_PAD_MULTIPLE)
    ("gates", None),  # 4H: LSTM kernel columns and gate biases (i, j, f, o blocks)
    ("cell", None),  # H: LSTM cell state, rows of the LSTM projection W_P_0
    ("lstm_in", None),  # 2P: LSTM kernel rows ([x ; h])
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
    "W_carry": ("filters", "highway"), "W_transform": ("filters", "highway"),
    "b_carry": ("highway",), "b_transform": ("highway",),
    "W_proj": ("filters", "embed"), "b_proj": ("embed",),
    "W_0": ("lstm_in", "gates"), "B": ("gates",), "W_P_0": ("cell", "embed"),
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
    if any(not isinstance(s, (int, np.integer)) or isinstance(s, bool) or (s < 1 and s != -1) for s in sizes) \
            or sizes.count(-1) > 1:
        raise ValueError(f"{flags}: mesh sizes must be positive integers, and at most one of them -1")
    if -1 in sizes:
        known = sizes[1 - sizes.index(-1)]
        if n % known:
            raise ValueError(f"{flags}: {n} devices do not split into groups of {known}; set sizes whose "
                             f"product is {n}")
        sizes[sizes.index(-1)] = n // known
    if sizes[0] * sizes[1] != n:
        raise ValueError(f"{flags}: the mesh has {sizes[0]} x {sizes[1]} = {sizes[0] * sizes[1]} devices but "
                         f"there are {n}; set sizes whose product is {n} (one of them may be -1)")
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)


def logical_to_spec(axes: Sequence[str | None], rules=RULES) -> PartitionSpec:
    """PartitionSpec of an array whose axes have these logical names (None: replicated)."""
    table = dict(rules)
    spec = []
    for name in axes:
        if name is not None and name not in table:
            raise ValueError(f"logical axis {name!r} has no entry in the partition rules {sorted(table)}")
        spec.append(None if name is None else table[name])
    used = [a for a in spec if a is not None]
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

    return {"bilm": jax.tree_util.tree_map_with_path(bilm_axes, params["bilm"]),
            "softmax": {k: SOFTMAX_AXES[k] for k in params["softmax"]}}


def _named(mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int], what: str, rules) -> NamedSharding:
    spec = logical_to_spec(axes, rules)
    for dim, (size, mesh_axis) in enumerate(zip(shape, spec)):
        if mesh_axis is not None and size % mesh.shape[mesh_axis]:
            raise ValueError(f"{what}: axis {dim} ({axes[dim]}, size {size}) does not divide into the "
                             f"{mesh.shape[mesh_axis]} shards of mesh axis {mesh_axis!r}")
    return NamedSharding(mesh, spec)


def param_shardings(mesh: Mesh, params: dict, rules=RULES) -> dict:
    """NamedShardings of `TrainState.params` (arrays or shapes), following `rules`."""
    axes = param_logical_axes(params)
    return jax.tree_util.tree_map_with_path(
        lambda path, a, leaf: _named(mesh, a, leaf.shape, jax.tree_util.keystr(path), rules),
        axes, params, is_leaf=lambda x: isinstance(x, tuple))


def state_shardings(mesh: Mesh, abstract_state, optimizer: optax.GradientTransformation, rules=RULES,
                    replicate_lstm: bool = False):
    """NamedShardings of a whole `TrainState` (from `jax.eval_shape` of `init_train_state`).

    Parameters follow the rules; the optimiser's per-parameter state (Adagrad's accumulators) mirrors
    the parameters; step, key and the optimiser's scalars are replicated; the carried LSTM state is
    sharded on its batch axis like the batch (or replicated with `replicate_lstm`).
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    params = param_shardings(mesh, abstract_state.params, rules)
    opt_state = optax.tree_map_params(optimizer, lambda _, sharding: sharding, abstract_state.opt_state, params,
                                      transform_non_params=lambda _: replicated)
    lstm = type(abstract_state.lstm)(
        **{k: replicated if replicate_lstm else
           _named(mesh, LSTM_STATE_AXES[k], getattr(abstract_state.lstm, k).shape, f"LSTM state {k}", rules)
           for k in LSTM_STATE_AXES})
    return abstract_state.replace(step=replicated, params=params, opt_state=opt_state, key=replicated, lstm=lstm)


def batch_sharding(mesh: Mesh, rules=RULES) -> NamedSharding:
    """The sharding of every batch array (D, B, ...): rows on the batch axis, the rest replicated."""
    return NamedSharding(mesh, logical_to_spec(BATCH_AXES, rules))


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying shardings (e.g. orbax restore targets, or `.lower()` arguments)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def check_training_mesh(mesh: Mesh, batch_size: int, process_count: int, rules=RULES) -> None:
    """Errors for people, before anything is compiled: the batch must split evenly over the processes
    and the batch axis, and the vocabulary padding over the vocabulary axis.
    """
    sizes = f"--config.mesh.data={mesh.shape['data']} --config.mesh.model={mesh.shape['model']}"
    if batch_size % process_count:
        raise ValueError(f"--config.batch_size={batch_size} is not divisible by the {process_count} processes: "
                         "every process must feed the same number of rows")
    table = dict(rules)
    batch_axis, vocab_axis = table.get("batch"), table.get("vocab")
    if batch_axis is not None and batch_size % mesh.shape[batch_axis]:
        raise ValueError(f"--config.batch_size={batch_size} is not divisible by the {mesh.shape[batch_axis]} "
                         f"shards of mesh axis {batch_axis!r} ({sizes}); use a batch size that is a multiple of "
                         f"{mesh.shape[batch_axis]}")
    if vocab_axis is not None and VOCAB_PAD_MULTIPLE % mesh.shape[vocab_axis]:
        raise ValueError(f"{sizes}: the softmax vocabulary is padded to a multiple of {VOCAB_PAD_MULTIPLE} and "
                         f"sharded on mesh axis {vocab_axis!r}, whose size {mesh.shape[vocab_axis]} must divide "
                         f"{VOCAB_PAD_MULTIPLE}")


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
        raise ValueError(f"this process's devices hold batch rows {rows}, not one contiguous block; build the "
                         "mesh with make_mesh (jax.make_mesh orders devices process by process)")
    return start // (stop - start), batch_size // (stop - start)


@dataclasses.dataclass(frozen=True)
class Steps:
    """The training functions jitted for one mesh (pjit), and the shardings they read and write.

    Attributes:
      mesh: the mesh.
      batch_size: B, global rows.
      state: NamedShardings of the `TrainState`.
      batch: NamedSharding of every batch array (D, B, ...).
      abstract_state: the `TrainState` as ShapeDtypeStructs carrying `state` (restore targets).
      init: (key, bilm: BiLMParams | None, softmax: dict | None) -> TrainState, created sharded.
      train: (state, batch, content_positions) -> (state, metrics); the state is donated.
      eval: (params, lstm, batch, content_positions) -> (loss sums (D,), counts (D,), lstm).
      zero_lstm: () -> the zero `LSTMState` (D, L, B, ·), sharded like the carried state.
    """

    mesh: Mesh
    batch_size: int
    state: Any
    batch: NamedSharding
    abstract_state: Any
    init: Any
    train: Any
    eval: Any
    zero_lstm: Any


@functools.lru_cache(maxsize=16)  # the same jitted functions (and their compile cache) for the same run
def jit_steps(mesh: Mesh, cfg: StepConfig, optimizer: optax.GradientTransformation, batch_size: int,
              rules=RULES, skip_nonfinite: bool = False) -> Steps:
    """`init_train_state`, `train_step_fn` and `eval_step_fn` jitted with the shardings of `rules` on `mesh`.

    The state's shapes come from `jax.eval_shape` (no allocation); `init` then creates every array
    directly in its shards, so no device ever holds the whole softmax. With `skip_nonfinite` the train
    step is wrapped by `skip_nonfinite_step`.
    """
    def init(key, bilm, softmax):
        return init_train_state(key, cfg, optimizer, batch_size, bilm, softmax)

    abstract = jax.eval_shape(init, jax.random.key(0), None, None)
    shardings = state_shardings(mesh, abstract, optimizer, rules)
    batch = batch_sharding(mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    def train(state, batch, content_positions):
        step = functools.partial(train_step_fn, cfg=cfg, optimizer=optimizer, content_positions=content_positions)
        return skip_nonfinite_step(step, state, batch) if skip_nonfinite else step(state, batch)

    def evaluate(params, lstm, batch, content_positions):
        return eval_step_fn(params, lstm, batch, cfg=cfg, content_positions=content_positions)

    # content_positions (the char CNN's position bucket) is static and positional: pjit takes no kwargs.
    train = jax.jit(train, static_argnums=(2,), in_shardings=(shardings, batch), out_shardings=(shardings, replicated),
                    donate_argnums=(0,))
    evaluate = jax.jit(evaluate, static_argnums=(3,), in_shardings=(shardings.params, shardings.lstm, batch),
                       out_shardings=(replicated, replicated, shardings.lstm))
    zero_lstm = jax.jit(lambda: zero_state(cfg.model, batch_size), out_shardings=shardings.lstm)
    return Steps(mesh=mesh, batch_size=batch_size, state=shardings, batch=batch, abstract_state=with_shardings(abstract, shardings),
                 init=jax.jit(init, out_shardings=shardings), train=train, eval=evaluate, zero_lstm=zero_lstm)


def skip_nonfinite_step(step_fn, state, batch):
    """`step_fn(state, batch)`, except that a step whose loss or gradient norm is not finite leaves the
    parameters and optimiser state as they were (to be traced inside the jitted step).

    The choice is made on the device (`jnp.where`), so the host need not read the loss before the next
    step is dispatched; metrics gain "skipped" (1.0 for a skipped step, else 0.0), which the trainer
    counts when it reads them. A skipped step still advances the step counter (and so the RNG) and the
    data stream (its window is dropped), and its rows start the next window from a zero LSTM state,
    since the carried one may be what overflowed.
    """
    new, metrics = step_fn(state, batch)
    ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
    keep = lambda updated, previous: jnp.where(ok, updated, previous)
    new = new.replace(params=jax.tree.map(keep, new.params, state.params),
                      opt_state=jax.tree.map(keep, new.opt_state, state.opt_state),
                      lstm=jax.tree.map(lambda carried: jnp.where(ok, carried, jnp.zeros_like(carried)), new.lstm))
    return new, {**metrics, "skipped": jnp.where(ok, 0.0, 1.0).astype(jnp.float32)}
