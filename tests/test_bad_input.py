"""Bad input is rejected at the boundary, before any compute, with a message that names the problem.

Every case asserts the exception type and a substring a person can act on: the offending value, key,
expected and found shape, or file path.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil

import h5py
import jax.numpy as jnp
import numpy as np
import pytest

import elmo_jax

embed_module = importlib.import_module("elmo_jax.features.embed")  # `elmo_jax.embed` is the function


# ----------------------------------------------------------------------------- embed


@pytest.fixture
def no_compute(monkeypatch):
    """Makes any call into the jitted forward pass fail, so a test proves its error came first."""

    def forbidden(*args, **kwargs):
        raise AssertionError("embed started computing before rejecting its input")

    monkeypatch.setattr(embed_module, "_embed_jit", forbidden)


@pytest.fixture(scope="module")
def good_ids():
    """Valid shifted ids (3, 4, 50): rows of 4, 2 and 1 tokens."""
    return elmo_jax.batch_to_ids([["a", "b", "c", "d"], ["e", "f"], ["g"]])


def _with(ids, index, value):
    ids = np.array(ids)
    ids[index] = value
    return ids


@pytest.mark.parametrize(
    "make_ids,message",
    [
        (lambda ids: _with(ids, (1, 0, 3), 262), r"\[0, 262\).*found 262 at index \(1, 0, 3\)"),
        (lambda ids: _with(ids, (2, 0, 0), -1), r"\[0, 262\).*found -1 at index \(2, 0, 0\)"),
        (lambda ids: ids.astype(np.float32), r"integer.*float32"),
        (lambda ids: ids > 0, r"integer.*bool"),
        (lambda ids: ids[0], r"expected shape \(batch, tokens, 50\), found \(4, 50\)"),
        (lambda ids: ids[None], r"expected shape \(batch, tokens, 50\), found \(1, 3, 4, 50\)"),
        (lambda ids: ids[:, :, :49], r"expected shape \(batch, tokens, 50\), found \(3, 4, 49\)"),
        (lambda ids: ids[:0], r"empty batch of shape \(0, 4, 50\)"),
        (lambda ids: ids[:, :0], r"empty batch of shape \(3, 0, 50\)"),
        (lambda ids: _with(ids, (0, 1), 0), r"row 0 has a token at position 2 after a padding token"),
    ],
    ids=["id_262", "id_minus_1", "float", "bool", "rank_2", "rank_4", "49_chars", "zero_batch", "zero_time", "gap"],
)
def test_embed_rejects_bad_char_ids(tiny_params, good_ids, no_compute, make_ids, message):
    """Out-of-range ids, non-integer dtypes, wrong rank or width, empty batches and a padding token
    before a real one are reported with the value, index or shape found."""
    with pytest.raises(ValueError, match=message):
        elmo_jax.embed(tiny_params, make_ids(good_ids))


def test_embed_rejects_non_params(tiny_params, good_ids, no_compute):
    """Raw weight dicts are not enough: the config must travel with them."""
    with pytest.raises(ValueError, match=r"BiLMParams.*found dict"):
        elmo_jax.embed(tiny_params.weights, good_ids)


def test_embed_rejects_initial_state_of_wrong_shape(tiny_params, good_ids, no_compute):
    """A state from a batch of another size is caught, naming expected and found shapes."""
    wrong = elmo_jax.zero_state(tiny_params.config, batch_size=2)
    with pytest.raises(
        ValueError,
        match=re.escape("initial_state.c: expected float (2, 2, 3, 32)") + r".*" + re.escape("(2, 2, 2, 32)"),
    ):
        elmo_jax.embed(tiny_params, good_ids, initial_state=wrong)


def test_embed_rejects_initial_state_of_wrong_type(tiny_params, good_ids, no_compute):
    """A bare (c, h) tuple is not an LSTMState; the message says what to pass."""
    state = elmo_jax.zero_state(tiny_params.config, batch_size=3)
    with pytest.raises(ValueError, match="LSTMState"):
        elmo_jax.embed(tiny_params, good_ids, initial_state=(state.c, state.h))


@pytest.mark.parametrize("dtype", ["float16", jnp.float16, "int8"])
def test_embed_rejects_unsupported_compute_dtype(tiny_params, good_ids, no_compute, dtype):
    """Only float32 and bfloat16 are supported; float16 (a common guess) is refused, not silently used."""
    with pytest.raises(ValueError, match=r"compute_dtype.*float32.*bfloat16.*found (float16|int8)"):
        elmo_jax.embed(tiny_params, good_ids, compute_dtype=dtype)


@pytest.mark.parametrize("unroll", [0, -1, 1.5])
def test_embed_rejects_bad_unroll(tiny_params, good_ids, no_compute, unroll):
    """unroll must be a positive int (it becomes a static `lax.scan` argument)."""
    with pytest.raises(ValueError, match=rf"unroll.*{re.escape(repr(unroll))}"):
        elmo_jax.embed(tiny_params, good_ids, unroll=unroll)


# ----------------------------------------------------------------------------- batch_to_ids


@pytest.mark.parametrize(
    "sentences,message",
    [
        ([], r"sentences is empty"),
        ("a sentence", r"sentences must be a list.*found str"),
        ([["ok"], "not split"], r"sentence 1 must be a list of str tokens, found str.*split"),
        ([["ok", 7]], r"sentence 0, token 1: expected str, found int 7"),
        ([["ok", None]], r"sentence 0, token 1: expected str, found NoneType"),
        (None, r"sentences must be a list.*found NoneType"),
    ],
    ids=["empty", "str", "sentence_str", "int_token", "none_token", "none"],
)
def test_batch_to_ids_rejects_bad_sentences(sentences, message):
    """A str where a list is expected would otherwise be split into characters silently."""
    with pytest.raises(ValueError, match=message):
        elmo_jax.batch_to_ids(sentences)


def test_empty_sentence_and_empty_token(tiny_params, load_batch):
    """The `edge` batch (AllenNLP's output is compared in test_parity_allennlp): the empty sentence is an
    all-zero id row with an all-false mask and all-zero layers; the empty-string token is a real token
    ([BOW, EOW] only) with a true mask."""
    batch = load_batch("edge")
    assert batch.sentences[2] == [] and batch.sentences[1][0] == ""
    ids = elmo_jax.batch_to_ids(batch.sentences)
    assert np.all(ids[2] == 0)
    np.testing.assert_array_equal(ids[1, 0, :3], [259, 260, 261])  # BOW, EOW, PAD (+1)
    assert np.all(ids[1, 0, 3:] == 261)
    layers, mask = elmo_jax.embed(tiny_params, ids)
    layers, mask = np.asarray(layers), np.asarray(mask)
    assert not mask[2].any()
    assert np.all(layers[2] == 0.0)
    assert mask[1, 0] and np.all(np.abs(layers[1, :, 0]).max(axis=-1) > 0)


# ----------------------------------------------------------------------------- load_hdf5


def copy_weights(src, dst, drop=(), replace=None, add=None):
    """Copies an HDF5 weight file dataset by dataset, dropping, replacing or adding some."""
    replace, add = replace or {}, add or {}
    with h5py.File(src, "r") as fin, h5py.File(dst, "w") as fout:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name not in drop:
                fout.create_dataset(name, data=replace.get(name, obj[...]))

        fin.visititems(visit)
        for name, value in add.items():
            fout.create_dataset(name, data=value)


def write_options(path, fixture_dir, edit):
    options = json.loads((fixture_dir / "options.json").read_text(encoding="utf-8"))
    edit(options)
    path.write_text(json.dumps(options, indent=1), encoding="utf-8")
    return path


def test_missing_options_file(fixture_dir, tmp_path):
    """FileNotFoundError naming the missing options path."""
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        elmo_jax.load_hdf5(missing, fixture_dir / "weights.hdf5")


def test_missing_weight_file(fixture_dir, tmp_path):
    """FileNotFoundError naming the missing weight path."""
    missing = tmp_path / "nope.hdf5"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        elmo_jax.load_hdf5(fixture_dir / "options.json", missing)


def test_directory_instead_of_files(fixture_dir, tmp_path):
    """A directory passed as either file gives IsADirectoryError naming it."""
    with pytest.raises(IsADirectoryError, match=re.escape(str(tmp_path))):
        elmo_jax.load_hdf5(tmp_path, fixture_dir / "weights.hdf5")
    with pytest.raises(IsADirectoryError, match=re.escape(str(tmp_path))):
        elmo_jax.load_hdf5(fixture_dir / "options.json", tmp_path)


def test_weight_file_that_is_not_hdf5(fixture_dir, tmp_path):
    """A text file in place of the weights is named and called 'not an HDF5 file'."""
    text = tmp_path / "weights.hdf5"
    text.write_text("these are not weights\n")
    with pytest.raises(ValueError, match=re.escape(str(text)) + r".*not an HDF5 file"):
        elmo_jax.load_hdf5(fixture_dir / "options.json", text)


def test_truncated_weight_file(fixture_dir, tmp_path):
    """An interrupted download: the first half of a valid file."""
    data = (fixture_dir / "weights.hdf5").read_bytes()
    truncated = tmp_path / "weights.hdf5"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=re.escape(str(truncated)) + r".*(truncated|cannot read)"):
        elmo_jax.load_hdf5(fixture_dir / "options.json", truncated)


def test_weight_file_missing_a_dataset(fixture_dir, tmp_path):
    """The message names the missing key and the shape the options expect for it."""
    weights = tmp_path / "weights.hdf5"
    copy_weights(fixture_dir / "weights.hdf5", weights, drop=("CNN_high_0/b_carry",))
    with pytest.raises(ValueError, match=re.escape("missing dataset 'CNN_high_0/b_carry' (expected shape (28,))")):
        elmo_jax.load_hdf5(fixture_dir / "options.json", weights)


def test_weight_file_with_a_wrongly_shaped_dataset(fixture_dir, tmp_path):
    """The message names the key, the shape found and the shape the options expect."""
    weights = tmp_path / "weights.hdf5"
    copy_weights(fixture_dir / "weights.hdf5", weights, replace={"CNN_high_0/W_carry": np.zeros((28, 27), np.float32)})
    with pytest.raises(ValueError, match=re.escape("'CNN_high_0/W_carry' has shape (28, 27), expected (28, 28)")):
        elmo_jax.load_hdf5(fixture_dir / "options.json", weights)


def test_weight_file_with_an_undescribed_dataset(fixture_dir, tmp_path):
    """A dataset the options do not describe (e.g. a third LSTM layer) means options and weights disagree."""
    weights = tmp_path / "weights.hdf5"
    extra = "RNN_0/RNN/MultiRNNCell/Cell2/LSTMCell/B"
    copy_weights(fixture_dir / "weights.hdf5", weights, add={extra: np.zeros((128,), np.float32)})
    with pytest.raises(ValueError, match=re.escape(extra) + r".*not described by the options"):
        elmo_jax.load_hdf5(fixture_dir / "options.json", weights)


def test_weight_file_with_integer_dataset(fixture_dir, tmp_path):
    """Weights must be floating point; an integer dataset is named with its dtype."""
    weights = tmp_path / "weights.hdf5"
    copy_weights(fixture_dir / "weights.hdf5", weights, replace={"CNN/b_cnn_0": np.zeros((4,), np.int32)})
    with pytest.raises(ValueError, match=re.escape("'CNN/b_cnn_0' has dtype int32, expected float32")):
        elmo_jax.load_hdf5(fixture_dir / "options.json", weights)


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda o: o["char_cnn"].update(n_highway=2),
            re.escape("missing dataset 'CNN_high_1/W_carry' (expected shape (28, 28))"),
        ),
        (
            lambda o: o["lstm"].update(dim=64),
            re.escape("'RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0' has shape (32, 128), expected (32, 256)"),
        ),
        (lambda o: o["lstm"].update(n_layers=1), r"Cell1.*not described by the options"),
    ],
    ids=["n_highway_2", "lstm_dim_64", "n_layers_1"],
)
def test_options_contradicting_the_weights(fixture_dir, tmp_path, edit, message):
    """Options that describe a different model than the weight file name the first disagreeing dataset."""
    options = write_options(tmp_path / "options.json", fixture_dir, edit)
    with pytest.raises(ValueError, match=message):
        elmo_jax.load_hdf5(options, fixture_dir / "weights.hdf5")


def test_options_that_are_not_json(fixture_dir, tmp_path):
    """The message names the file and the line of the syntax error."""
    options = tmp_path / "options.json"
    options.write_text('{\n  "lstm": {"dim": 32,}\n}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(options)) + r": not valid JSON.*line 2"):
        elmo_jax.load_hdf5(options, fixture_dir / "weights.hdf5")


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda o: o.pop("lstm"), r"section 'lstm'"),
        (lambda o: o["char_cnn"].update(n_characters=300), r"n_characters.*261.*262.*found 300"),
        (lambda o: o["char_cnn"].update(activation="gelu"), r"activation.*'gelu'"),
        (lambda o: o["lstm"].pop("projection_dim"), r"lstm\.projection_dim"),
        (lambda o: o["char_cnn"].update(filters=[[1, "4"]]), r"char_cnn\.filters"),
    ],
    ids=["no_lstm", "n_characters_300", "gelu", "no_projection_dim", "string_filter"],
)
def test_invalid_options(fixture_dir, tmp_path, edit, message):
    """Invalid options are reported with the options file's path and the offending key."""
    options = write_options(tmp_path / "options.json", fixture_dir, edit)
    with pytest.raises(ValueError, match=re.escape(str(options)) + r".*" + message):
        elmo_jax.load_hdf5(options, fixture_dir / "weights.hdf5")


def test_options_top_level_not_an_object(fixture_dir, tmp_path):
    """Valid JSON that is not an object (e.g. a list) is reported as such."""
    options = tmp_path / "options.json"
    options.write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"JSON object.*found list"):
        elmo_jax.load_hdf5(options, fixture_dir / "weights.hdf5")


def test_fixture_copy_loads(fixture_dir, tmp_path):
    """Control for the cases above: an untouched copy made the same way loads fine."""
    weights = tmp_path / "weights.hdf5"
    copy_weights(fixture_dir / "weights.hdf5", weights)
    shutil.copy(fixture_dir / "options.json", tmp_path / "options.json")
    params = elmo_jax.load_hdf5(tmp_path / "options.json", weights)
    assert params.config.n_highway == 1


# ----------------------------------------------------------------------------- missing arguments


@pytest.mark.parametrize(
    "module, function, args, message",
    [
        (
            "files.file_embedding",
            "embed_model_file",
            (None, "in", ""),
            "output_path is required (the command's --output)",
        ),
        ("data.vocab_builder", "write_vocab_file", (None, "v.txt"), "files is required (the command's --files)"),
        (
            "analysis.probe_files",
            "read_targets",
            (None, "t.jsonl", None, ()),
            "test_path is required (the command's --test)",
        ),
    ],
)
def test_a_library_call_missing_a_required_argument_names_the_argument(module, function, args, message):
    """Called from Python, the functions under the commands name their own argument (and the command's
    flag for a reader of the command). Failed before: "--output is required", a flag a caller of the
    function never wrote."""
    call = getattr(importlib.import_module(f"elmo_jax.{module}"), function)
    kwargs = {"overwrite": False} if function == "read_targets" else {}
    with pytest.raises(ValueError, match=re.escape(message)):
        call(*args, **kwargs)
