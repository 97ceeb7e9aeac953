"""Sharding on the 8 CPU devices that tests/conftest.py forces: parameter shardings follow the rules table,
a train step gives the same loss and parameters on every mesh as on one device, the vocabulary-sharded
softmax equals the unsharded one, checkpoints move between meshes, and bad meshes are refused clearly.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.lstm import stacked_cell, stacked_weight_paths
from elmo_jax.model.params import get_path, init_params
from elmo_jax.training import jitted_steps, sharding
from elmo_jax.training.checkpoint import Checkpoints
from elmo_jax.training.lm import lm_losses
from elmo_jax.training.optimizers import Optimizer
from elmo_jax.training.softmax import VOCAB_PAD_MULTIPLE, padded_vocab_size
from elmo_jax.training.train_step import StepConfig
from tests.support.commands import error_line
from tests.support.inprocess import run_in_process

ATOL = 1e-5
MESHES = [(8, 1), (4, 2), (1, 8)]  # data only, both axes, model only (2 x 4: the softmax test below)
B, T, C = 8, 5, 50
VOCAB = 300  # padded to 512 rows: 64 per shard on 8 model shards
MODEL = BiLMConfig(
    char_embed_dim=4,
    filters=((1, 4), (2, 8), (3, 8)),
    n_highway=1,
    activation="relu",
    max_characters_per_token=C,
    lstm_dim=16,
    projection_dim=8,
    n_layers=2,
    cell_clip=3.0,
    proj_clip=3.0,
    use_skip_connections=True,
)
# Four candidate draws per direction, two rows each: a group spans two devices of an (8, 1) mesh and a
# device holds two groups of a (2, 4) one; the draws must not depend on either.
CFG = StepConfig(model=MODEL, vocab_size=VOCAB, unroll_steps=T, n_negative_samples=16, negative_sample_group_rows=2)
OPTIMIZER = Optimizer(learning_rate=0.2, clip_norm=10.0, initial_accumulator=1.0)


def random_batch(seed: int, carry: bool) -> dict[str, np.ndarray]:
    """A window of both directions: short words (position bucket 8), a few masked positions and resets."""
    rng = np.random.default_rng(seed)
    char_ids = np.full((2, B, T, C), 260, np.int32)  # PAD
    char_ids[..., 0], char_ids[..., 1:5], char_ids[..., 5] = 258, rng.integers(0, 256, (2, B, T, 4)), 259
    mask = np.ones((2, B, T), bool)
    mask[:, 3, 3:] = False
    return {
        "char_ids": char_ids,
        "targets": rng.integers(0, VOCAB, (2, B, T)).astype(np.int32),
        "mask": mask,
        "carry": np.full((2, B), carry),
        "reset": rng.random((2, B, T)) < 0.1,
    }


def two_steps(mesh):
    """(loss of step 1, state after step 1, state after step 2) of a fresh model on `mesh`."""
    steps = jitted_steps.jit_steps(mesh, CFG, OPTIMIZER, B)
    state = steps.init(jax.random.key(0), None, None)
    losses, states = [], []
    for i in range(2):
        batch = {k: jax.device_put(v, steps.batch) for k, v in random_batch(i, carry=i > 0).items()}
        state, metrics = steps.train(state, batch, 8)
        losses.append(float(metrics["loss"]))
        states.append(jax.device_get(state))
    return losses, states


@pytest.fixture(scope="module")
def single_device():
    """The reference: the same steps on a 1 x 1 mesh of one device."""
    return two_steps(sharding.make_mesh(1, 1, devices=jax.devices()[:1]))


def assert_trees_close(a, b):
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], leaves_b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=ATOL, rtol=0, err_msg=jax.tree_util.keystr(path))


# ----------------------------------------------------------------------------- rules


# The biLM weights RULES splits over "data" between steps (by their input axis): the LSTM kernels and
# projections, the highway and projection kernels of the char CNN.
SPLIT_WEIGHTS = ("W_0", "W_P_0", "W_carry", "W_transform", "W_proj")


def test_parameter_shardings_follow_the_rules_table():
    """On a (2, 4) mesh: the softmax is split over the vocabulary on both axes (64 of 512 rows per device),
    the biLM's kernels over "data" by their input axis, everything else of the biLM is replicated,
    Adagrad's accumulators are sharded like their parameters, step and key are replicated, the carried
    state is split on rows."""
    mesh = sharding.make_mesh(2, 4)
    assert mesh.axis_names == ("data", "model") and dict(mesh.shape) == {"data": 2, "model": 4}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    state = jitted_steps.jit_steps(mesh, CFG, OPTIMIZER, B).init(jax.random.key(0), None, None)
    rules = dict(sharding.RULES)
    assert rules["vocab"] == ("model", "data") and rules["batch"] == "data"

    W, b = state.params["softmax"]["W"], state.params["softmax"]["b"]
    vocab = ("model", "data")
    assert W.shape == (512, 8) and W.sharding.spec == P(vocab, None) and b.sharding.spec == P(vocab)
    assert {s.data.shape for s in W.addressable_shards} == {(64, 8)}
    assert len({s.index[0].start for s in W.addressable_shards}) == 8  # no two devices hold the same rows
    flat = jax.tree_util.tree_flatten_with_path(state.params["bilm"])[0]
    # 4 LSTM cells x (W_0, B, W_P_0), 3 convolutions x (W, b), highway (2 W, 2 b), CNN projection, char_embed
    assert len(flat) == 4 * 3 + 3 * 2 + 4 + 2 + 1
    for path, leaf in flat:
        if path[-1].key in SPLIT_WEIGHTS:  # each half of the rows on one of the two data rows of devices
            assert leaf.sharding.spec == P("data", None), jax.tree_util.keystr(path)
            assert {s.data.shape for s in leaf.addressable_shards} == {(leaf.shape[0] // 2, leaf.shape[1])}
        else:
            assert leaf.sharding.is_fully_replicated, jax.tree_util.keystr(path)
    assert sum(path[-1].key in SPLIT_WEIGHTS for path, _ in flat) == 4 * 2 + 3
    bilm_axes = jax.tree.leaves(
        sharding.param_logical_axes(state.params)["bilm"], is_leaf=lambda x: isinstance(x, tuple)
    )
    split = {a for axes in bilm_axes for a in axes if rules[a] is not None}
    assert len(bilm_axes) == len(flat) and split == {"lstm_in", "proj_in", "dense_in"}
    assert {rules[a] for a in split} == {"data"}
    accumulators = [s for s in jax.tree.leaves(state.opt_state) if s.ndim == 2 and s.shape == (512, 8)]
    assert len(accumulators) == 1 and accumulators[0].sharding.spec == P(vocab, None)
    split_accumulators = [s for s in jax.tree.leaves(state.opt_state) if s.ndim == 2 and s.shape == (16, 64)]
    assert len(split_accumulators) == 4 and all(s.sharding.spec == P("data", None) for s in split_accumulators)
    assert state.step.sharding.is_fully_replicated and state.key.sharding.is_fully_replicated
    assert state.lstm.c.sharding.spec == P(None, None, "data", None) == state.lstm.h.sharding.spec
    assert {s.data.shape for s in state.lstm.c.addressable_shards} == {(2, 2, 4, 16)}


def test_changing_the_rules_table_changes_the_parallelism():
    """Mapping the LSTM gate axis to "model" (not what RULES does, see its comment) shards every LSTM kernel
    and gate bias over its 4H columns too, and their accumulators with them; nothing else changes."""
    mesh = sharding.make_mesh(2, 4)
    rules = tuple((name, "model" if name == "gates" else axis) for name, axis in sharding.RULES)
    abstract = jitted_steps.jit_steps(mesh, CFG, OPTIMIZER, B).abstract_state
    shardings = sharding.state_shardings(mesh, abstract, OPTIMIZER, rules)
    cell = shardings.params["bilm"]["RNN_0"]["RNN"]["MultiRNNCell"]["Cell1"]["LSTMCell"]
    assert cell["W_0"].spec == P("data", "model") and cell["B"].spec == P("model")
    assert cell["W_P_0"].spec == P("data", None)
    assert shardings.params["softmax"]["W"].spec == P(("model", "data"), None)
    specs = [s.spec for s in jax.tree.leaves(shardings.opt_state)]
    assert specs.count(P("data", "model")) == 4 and specs.count(P("model")) == 4  # the 4 gate biases
    assert specs.count(P(("model", "data"))) == 1  # the softmax's b


def test_every_published_weight_has_logical_axes():
    """The original model's weight layout (2 highway layers, CNN projection, LSTM projection)."""
    original = BiLMConfig(lstm_dim=4096, projection_dim=512, n_highway=2)
    abstract = jax.eval_shape(
        lambda: {
            "bilm": init_params(original, jax.random.key(0)).weights,
            "softmax": {
                "W": jnp.zeros((padded_vocab_size(793_471), 512)),
                "b": jnp.zeros((padded_vocab_size(793_471),)),
            },
        }
    )
    shardings = sharding.param_shardings(sharding.make_mesh(1, 8), abstract)
    assert shardings["softmax"]["W"].spec == P("model", None)
    assert padded_vocab_size(793_471) == 793_600 == 3100 * VOCAB_PAD_MULTIPLE
    shardings = sharding.param_shardings(sharding.make_mesh(8, 1), abstract)
    assert shardings["softmax"]["W"].spec == P("data", None)
    cell = shardings["bilm"]["RNN_1"]["RNN"]["MultiRNNCell"]["Cell0"]["LSTMCell"]
    for kernel in (cell["W_0"], cell["W_P_0"], shardings["bilm"]["CNN_high_1"]["W_carry"]):
        assert kernel.spec == P("data", None)
    assert cell["B"].spec == P(None) and shardings["bilm"]["CNN"]["W_cnn_6"].spec == P(None, None, None, None)


def test_a_weight_whose_rows_do_not_divide_into_the_data_axis_stays_replicated():
    """On (8, 1) the tiny model's LSTM kernels (16 rows) are split in 8, its char CNN kernels (20 rows, the
    filters' total) stay whole on every device: the split only saves memory and optimiser work."""
    shardings = jitted_steps.jit_steps(sharding.make_mesh(8, 1), CFG, OPTIMIZER, B).state.params["bilm"]
    assert shardings["RNN_0"]["RNN"]["MultiRNNCell"]["Cell1"]["LSTMCell"]["W_0"].spec == P("data", None)
    assert shardings["CNN_high_0"]["W_carry"].spec == P(None, None) == shardings["CNN_proj"]["W_proj"].spec


# ----------------------------------------------------------------------------- equivalence


@pytest.mark.slow
@pytest.mark.parametrize("shape", MESHES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_train_steps_on_a_mesh_equal_the_single_device_steps(shape, single_device):
    """Step 1 (fresh state) and step 2 (carried LSTM state): the same loss, parameters, Adagrad state and
    carried state as one device, within 1e-5."""
    (loss_1, loss_2), (state_1, state_2) = two_steps(sharding.make_mesh(*shape))
    (ref_1, ref_2), (ref_state_1, ref_state_2) = single_device
    assert abs(loss_1 - ref_1) <= ATOL and abs(loss_2 - ref_2) <= ATOL, (loss_1, ref_1, loss_2, ref_2)
    assert_trees_close(state_1.params, ref_state_1.params)
    assert_trees_close(state_2, ref_state_2)
    assert np.max(np.abs(state_2.params["softmax"]["W"] - ref_state_1.params["softmax"]["W"])) > 1e-3


def test_stacked_weight_paths_name_what_stacked_cell_stacks():
    """`lstm.stacked_weight_paths` lists, in direction order, the weights of each array `stacked_cell` stacks."""
    weights = init_params(MODEL, jax.random.key(0)).weights
    groups = iter(stacked_weight_paths(MODEL))
    for layer in range(MODEL.n_layers):
        for key, stack in stacked_cell(weights, MODEL, layer).items():
            group = next(groups)
            assert len(group) == 2 and all(f"Cell{layer}/" in path for path in group), (key, group)
            np.testing.assert_array_equal(stack, np.stack([get_path(weights, path) for path in group]))
    assert next(groups, None) is None


def test_stacked_gradients_are_sliced_like_single_ones():
    """`sharding._own_slices` slicing a stacked group as one array leaves every device the same rows of each
    gradient as slicing leaf by leaf: the global arrays are the summed gradients and each device's shard
    holds its own rows. Stacked weights split unlike each other are refused."""
    mesh = sharding.make_mesh(8, 1)
    rows, whole = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    grads = {f"RNN_{d}": {"W": rng.normal(size=(16, 3)), "B": rng.normal(size=(5,))} for d in range(2)}
    grads = jax.tree.map(lambda x: x.astype(np.float32), grads)
    shardings = {f"RNN_{d}": {"W": rows, "B": whole} for d in range(2)}
    for stacked in ([("RNN_0/W", "RNN_1/W"), ("RNN_0/B", "RNN_1/B")], []):
        out = jax.jit(lambda g, stacked=stacked: sharding._own_slices(g, shardings, stacked))(
            jax.device_put(grads, whole)
        )
        for d in range(2):
            got, want = out[f"RNN_{d}"]["W"], grads[f"RNN_{d}"]["W"]
            assert got.sharding.is_equivalent_to(rows, 2)
            for shard in got.addressable_shards:
                np.testing.assert_array_equal(shard.data, want[shard.index])
            np.testing.assert_array_equal(out[f"RNN_{d}"]["B"], grads[f"RNN_{d}"]["B"])  # replicated: whole
    unlike = {"RNN_0": {"W": rows, "B": whole}, "RNN_1": {"W": whole, "B": whole}}
    with pytest.raises(ValueError, match="not split alike"):
        sharding._own_slices(grads, unlike, [("RNN_0/W", "RNN_1/W")])


def sharded(mesh, x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


@pytest.mark.parametrize("num_sampled", [16, None], ids=["sampled", "full"])
def test_vocab_sharded_softmax_equals_the_unsharded_one(num_sampled):
    """Loss sums and the gradient of W, b and the outputs: W split over the vocabulary on "model" and the
    outputs over rows on "data" (2 x 4) against one device. The padding rows hold huge values: were a
    padded id ever sampled or scored, the losses would be far off."""
    rng = np.random.default_rng(0)
    V, rows = VOCAB, padded_vocab_size(VOCAB)
    W = rng.normal(size=(rows, 8)).astype(np.float32)
    W[V:] = 50.0
    b = np.zeros(rows, np.float32)
    b[V:] = 1e3
    outputs = rng.normal(size=(2, B, T, 8)).astype(np.float32)
    targets = rng.integers(0, V, (2, B, T)).astype(np.int32)
    mask = rng.random((2, B, T)) < 0.9

    def loss(softmax, outputs):
        sums, counts = lm_losses(
            softmax, outputs, targets, mask, vocab_size=V, num_sampled=num_sampled, key=jax.random.key(1), chunk=128
        )
        return jnp.sum(sums), (sums, counts)

    run = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    (_, (ref_sums, ref_counts)), ref_grads = run(
        jax.device_put({"W": W, "b": b}, jax.devices()[0]), jax.device_put(outputs, jax.devices()[0])
    )
    mesh = sharding.make_mesh(2, 4)
    softmax = {"W": sharded(mesh, W, P("model", None)), "b": sharded(mesh, b, P("model"))}
    (_, (sums, counts)), grads = run(softmax, sharded(mesh, outputs, P(None, "data")))
    np.testing.assert_allclose(np.asarray(sums), np.asarray(ref_sums), atol=ATOL, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(counts), np.asarray(ref_counts))
    assert_trees_close(grads, ref_grads)
    assert np.all(np.asarray(grads[0]["W"])[V:] == 0.0) and np.all(np.asarray(grads[0]["b"])[V:] == 0.0)
    per_token = np.asarray(ref_sums) / np.asarray(ref_counts)
    assert np.all(per_token < 30.0), per_token  # a scored padding row (b = 1000) would dominate


def gathered_shapes(hlo: str) -> list[tuple[int, ...]]:
    """The result shape of every all-gather in a compiled module's (or one computation's) text."""
    found = re.findall(r"= \(?\w+\[([0-9,]*)\][^=]*? all-gather(?:-start)?\(", hlo)
    return [tuple(int(n) for n in dims.split(",")) for dims in found]


def test_sharded_steps_never_gather_the_softmax_or_the_characters():
    """The compiled train and eval steps on a 2 x 4 mesh gather no part of the softmax, of the characters
    or of the LSTM's work: each device works on its own rows of the batch and of the softmax. What is
    gathered is the biLM's split weights, each whole and once per step, outside every loop
    (`sharding.weight_gather`), and the softmax's bookkeeping, since the vocabulary is split over the data axis too, so
    every device handles its own vocabulary rows for every row of the batch: in the train step the ids
    a step reads, (D, B, T) and (D, G, S) (x 1 as gather indices), and their per-use gradient rows
    (x P), to be summed into the rows' shards (or per distinct id, `training.row_update`); in the eval
    step (the full softmax), each direction's B·T outputs (x P), targets and gather indices, which each
    device scores against its own rows (gathering them moves B·T·P values, where gathering the softmax
    would move V'·P)."""
    steps = jitted_steps.jit_steps(sharding.make_mesh(2, 4), CFG, OPTIMIZER, B)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=steps.batch) for k, v in random_batch(0, True).items()}
    state = steps.abstract_state
    G, S, P_ = B // CFG.negative_sample_group_rows, CFG.n_negative_samples, MODEL.projection_dim
    row_bookkeeping = {(2, B, T), (2, B, T, 1), (2, B, T, P_), (2, G, S), (2, G, S, 1), (2, G, S, P_)}
    split = {tuple(w.shape) for w in jax.tree.leaves(state.params["bilm"]) if not w.sharding.is_fully_replicated}
    assert split == {(16, 64), (16, 8), (20, 20), (20, 8)}  # W_0, W_P_0, the highway's and W_proj
    for name, compiled in (
        ("train", steps.train.lower(state, batch, 8).compile()),
        ("eval", steps.eval.lower(state.params, state.lstm, batch, 8).compile()),
    ):
        text = compiled.as_text()
        assert "all-reduce" in text
        gathered = gathered_shapes(text)
        shapes = set(gathered)
        allowed = split | (row_bookkeeping if name == "train" else {(B * T,), (B * T, 1), (B * T, P_)})
        assert shapes <= allowed, f"{name}: a sharded array is gathered whole: {sorted(shapes - allowed)}"
        entry = text[text.index("\nENTRY ") :]
        entry = entry[: entry.index("\n}\n")]
        weights = sorted(shape for shape in gathered if shape in split)
        in_entry = sorted(shape for shape in gathered_shapes(entry) if shape in split)
        assert weights == in_entry, f"{name}: a weight gathered in a loop"
        assert len(weights) >= len(split), name


# ----------------------------------------------------------------------------- checkpoints


def test_a_checkpoint_written_on_one_mesh_restores_on_another(tmp_path):
    """Saved from (8, 1), restored into the shardings of (1, 8): the same values, the new layout."""
    state = jitted_steps.jit_steps(sharding.make_mesh(8, 1), CFG, OPTIMIZER, B).init(jax.random.key(0), None, None)
    checkpoints = Checkpoints(str(tmp_path), async_save=False)
    checkpoints.save(1, state, {"rows": 1}, {"meta": 1})
    target = jitted_steps.jit_steps(sharding.make_mesh(1, 8), CFG, OPTIMIZER, B).abstract_state
    restored, data_state, _ = checkpoints.restore(1, target)
    checkpoints.close()
    assert data_state == {"rows": 1}
    assert restored.params["softmax"]["W"].sharding.spec == P("model", None)
    assert restored.params["softmax"]["W"].sharding.mesh.shape["model"] == 8
    assert restored.lstm.c.sharding.mesh.shape["data"] == 1
    assert_trees_close(jax.device_get(restored), jax.device_get(state))


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "data,model,named",
    [
        (3, -1, "8 devices do not split into groups of 3"),
        (4, 4, "4 x 4 = 16 devices but there are 8"),
        (1, 1, "1 x 1 = 1 devices but there are 8"),
        (-1, -1, "at most one of them -1"),
        (0, 8, "positive integers"),
    ],
    ids=["no_split", "too_many", "too_few", "two_free", "zero"],
)
def test_a_mesh_that_does_not_fit_the_devices_is_refused(data, model, named):
    with pytest.raises(ValueError) as error:
        sharding.make_mesh(data, model)
    message = str(error.value)
    assert named in message and f"--config.mesh.data={data}" in message and f"--config.mesh.model={model}" in message


def test_a_batch_or_vocabulary_that_does_not_split_is_refused():
    mesh = sharding.make_mesh(8, 1)
    with pytest.raises(
        ValueError,
        match=r"--config.batch_size=12 is not divisible by the 8 shards of mesh axis "
        r"'data'",
    ):
        sharding.check_training_mesh(mesh, 12, process_count=1)
    with pytest.raises(ValueError, match=r"--config.batch_size=12 is not divisible by the 8 processes"):
        sharding.check_training_mesh(sharding.make_mesh(1, 8), 12, process_count=8)
    with pytest.raises(ValueError, match=r"mesh.model=3.*size 3 must divide 256"):
        sharding.check_training_mesh(sharding.make_mesh(1, 3, devices=jax.devices()[:3]), 12, process_count=1)
    sharding.check_training_mesh(sharding.make_mesh(2, 4), 8, process_count=2)  # fits


@pytest.mark.parametrize(
    "data,model,vocab,shards",
    [(8, 1, "data", 8), (1, 8, "model", 8), (2, 4, ("model", "data"), 8), (6, 1, "model", 1), (3, 2, "model", 2)],
)
def test_the_vocabulary_is_split_over_every_axis_its_padding_divides_into(data, model, vocab, shards):
    """The softmax's rows go over both mesh axes where their 256-row padding splits into that many shards;
    a data axis of 6 or 3 devices leaves them on "model" (replicated when that has one device), and the
    mesh is accepted: the padding, and so a checkpoint's shapes, is the same on every mesh."""
    mesh = sharding.make_mesh(data, model, devices=jax.devices()[: data * model])
    assert dict(sharding.fit_rules(mesh))["vocab"] == vocab
    assert sharding.logical_shards(mesh, "vocab") == shards and sharding.logical_shards(mesh, "batch") == data
    sharding.check_training_mesh(mesh, 12 * data, process_count=1)
    abstract = {"bilm": {}, "softmax": {"W": jax.ShapeDtypeStruct((512, 8), jnp.float32)}}
    W = sharding.param_shardings(mesh, abstract)["softmax"]["W"]
    assert W.spec == P(vocab, None) and W.shard_shape((512, 8)) == (512 // shards, 8)


def test_only_the_vocabulary_is_trimmed_by_its_padding():
    """Another entry of several mesh axes (the batch over both, say) keeps them on a mesh whose 6 devices
    do not divide the vocabulary's 256-row padding; the vocabulary falls back to "model"."""
    rules = tuple((name, ("data", "model") if name == "batch" else axis) for name, axis in sharding.RULES)
    fitted = dict(sharding.fit_rules(sharding.make_mesh(3, 2, devices=jax.devices()[:6]), rules))
    assert fitted["batch"] == ("data", "model") and fitted["vocab"] == "model"


def test_the_cli_refuses_a_bad_mesh_in_one_line_before_writing_anything(tmp_path):
    result = run_in_process(  # this process's 8 devices
        "train.py",
        "--config=configs/default.py",
        f"--workdir={tmp_path / 'w'}",
        "--config.batch_size=6",
        "--config.mesh.model=2",
    )
    assert error_line(result) == (
        "error: --config.batch_size=6 is not divisible by the 4 shards of mesh axis 'data' (--config.mesh.data=4 "
        "--config.mesh.model=2); use a batch size that is a multiple of 4"
    )
    assert not (tmp_path / "w").exists()
