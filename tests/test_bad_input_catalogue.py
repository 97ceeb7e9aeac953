"""The bad-input catalogue: every CLI and public entry point, fed what people and broken files feed them.

Each case must end in one clear line naming the file, line, flag or argument at fault: `error: ...` and
exit code 1 for a CLI (no traceback), a ValueError/OSError for a function. Outputs and checkpoints that
existed before must be exactly as they were, and no new output may appear.

Cross-cutting inputs: non-UTF-8 bytes, NUL bytes, a 10 MB line, a million-character token, empty files,
directories in place of files, read-only output paths (/sys: root can write anywhere a permission bit
allows, so a file system that refuses new files stands in), wrong-dtype arrays, negative and huge ids.
More cases per entry point live next to their features (test_bad_input, test_train_cli, test_vocab,
test_evaluate_cli, test_export, test_embed_file, test_faults).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import elmo_jax
from elmo_jax.files import file_embedding as ef
from elmo_jax.formats.model_dir import write_model_dir
from tests.support.commands import error_line, run_command
from tests.support.compare import tree_digest
from tests.support.inprocess import run_in_process

UNWRITABLE = "/sys"  # sysfs refuses new files even to root


@pytest.fixture(scope="module")
def files(tmp_path_factory, fixture_dir, tiny_params):
    """Bad and good inputs, an existing output, a model directory and a small trained workdir."""
    root = tmp_path_factory.mktemp("catalogue")
    paths = {"root": root, "dir": root / "a_directory"}
    paths["dir"].mkdir()
    contents = {
        "good": b"the cat sat on the mat .\nthe dog barks .\n" * 20,
        "empty": b"",
        "non_utf8": b"the cat sat .\nthe \xff\xfe dog .\n",
        "nul": b"the cat sat .\nthe \x00 dog .\n",
        "ten_mb_line": b"word " * (2 * 1024 * 1024) + b"\n",
        "million_char_token": b"the " + b"x" * 1_000_000 + b" end\n",
        "truncated_hdf5": (fixture_dir / "weights.hdf5").read_bytes()[:5000],
        "not_hdf5": b"this is not an HDF5 file\n",
        "existing_output": b"results computed yesterday",
    }
    for name, data in contents.items():
        paths[name] = root / f"{name}.txt"
        paths[name].write_bytes(data)
    # Outside the root, whose every byte the cases check: loading a config writes its bytecode beside it.
    paths["failing_config"] = tmp_path_factory.mktemp("configs") / "failing_config.py"
    paths["failing_config"].write_text("def get_config():\n    return 1 / 0\n", encoding="utf-8")
    paths["options"], paths["weights"] = fixture_dir / "options.json", fixture_dir / "weights.hdf5"
    paths["model"] = root / "model"
    write_model_dir(tiny_params, paths["model"])
    return paths


# ----------------------------------------------------------------------------- CLIs

CLI_CASES = {
    # name: (argv built from the files fixture, expected parts of the error line)
    "train: missing config file": (
        lambda f: ["train.py", "--config=configs/no_such_config.py", f"--workdir={f['root'] / 'w0'}"],
        ["--config=configs/no_such_config.py: no such file"],
    ),
    # Issue #52: a config named by name (--config=demo) that the package does not ship: the names it does.
    "train: unknown config name": (
        lambda f: ["train.py", "--config=bilm_smal", f"--workdir={f['root'] / 'w0'}"],
        ["--config=bilm_smal: no such file, nor a config of that name", "bilm_large, bilm_medium, bilm_small, "],
    ),
    # Issue #51: ml_collections' message ("Failed loading config file config_config ...") said twice, once as
    # a log line; a file that is no Python or whose get_config fails ended in a traceback.
    "train: config path is a directory": (
        lambda f: ["train.py", f"--config={f['dir']}", f"--workdir={f['root'] / 'w0'}"],
        ["--config=", "a_directory: is a directory, expected a config file"],
    ),
    "train: config is not Python": (
        lambda f: ["train.py", f"--config={f['good']}", f"--workdir={f['root'] / 'w0'}"],
        ["--config=", "good.txt: line 1: not Python (invalid syntax)"],
    ),
    "train: config's get_config fails": (
        lambda f: ["train.py", f"--config={f['failing_config']}", f"--workdir={f['root'] / 'w0'}"],
        ["--config=", "failing_config.py: get_config() failed at line 2: ZeroDivisionError: division by zero"],
    ),
    "prepare_lm1b: data_dir is a file": (
        lambda f: ["elmo_jax.prepare_lm1b", f"--data_dir={f['good']}", f"--source={f['good']}"],
        ["--data_dir=", "good.txt", "not a directory"],
    ),
    "prepare_lm1b: data_dir under a file": (
        lambda f: ["elmo_jax.prepare_lm1b", f"--data_dir={f['good'] / 'lm1b'}", f"--source={f['good']}"],
        ["--data_dir=", "good.txt is not a directory"],
    ),
    "train: corpus is a directory": (
        lambda f: [
            "train.py",
            "--config=configs/demo.py",
            f"--workdir={f['root'] / 'w1'}",
            f"--config.data.train_files={f['dir']}",
        ],
        ["a_directory", "is a directory"],
    ),
    "train: empty corpus": (
        lambda f: [
            "train.py",
            "--config=configs/demo.py",
            f"--workdir={f['root'] / 'w2'}",
            f"--config.data.train_files={f['empty']}",
        ],
        ["empty.txt", "empty"],
    ),
    "train: workdir is a file": (
        lambda f: ["train.py", "--config=configs/demo.py", f"--workdir={f['good']}"],
        ["good.txt"],
    ),
    "train: unwritable workdir": (
        lambda f: ["train.py", "--config=configs/demo.py", f"--workdir={UNWRITABLE}/w"],
        [f"{UNWRITABLE}/w"],
    ),
    "train: vocab file is a directory": (
        lambda f: [
            "train.py",
            "--config=configs/demo.py",
            f"--workdir={f['root'] / 'w3'}",
            f"--config.data.train_files={f['good']}",
            f"--config.data.vocab_file={f['dir']}",
        ],
        ["a_directory", "directory"],
    ),
    "vocab: output directory missing": (
        lambda f: ["elmo_jax.vocab", f"--files={f['good']}", f"--output={f['root'] / 'no' / 'v.txt'}"],
        ["does not exist"],
    ),
    "vocab: empty corpus": (
        lambda f: ["elmo_jax.vocab", f"--files={f['empty']}", f"--output={f['root'] / 'v.txt'}"],
        ["empty.txt"],
    ),
    "vocab: output is a directory": (
        lambda f: ["elmo_jax.vocab", f"--files={f['good']}", f"--output={f['dir']}"],
        ["a_directory"],
    ),
    "vocab: read-only output": (
        lambda f: ["elmo_jax.vocab", f"--files={f['good']}", f"--output={UNWRITABLE}/vocab.txt"],
        [f"cannot write {UNWRITABLE}/vocab.txt"],
    ),
    "evaluate: workdir is a file": (
        lambda f: ["elmo_jax.evaluate", f"--workdir={f['good']}"],
        ["good.txt", "not a directory"],
    ),
    "evaluate: workdir without checkpoints": (
        lambda f: ["elmo_jax.evaluate", f"--workdir={f['dir']}"],
        ["no checkpoint"],
    ),
    "ablate: train file is a directory": (
        lambda f: [
            "elmo_jax.ablate",
            f"--options={f['options']}",
            f"--weights={f['weights']}",
            f"--train={f['dir']}",
            f"--test={f['good']}",
            f"--output={f['root'] / 'ablation.json'}",
        ],
        ["a_directory", "is a directory"],
    ),
    "ablate: test file not UTF-8": (
        lambda f: [
            "elmo_jax.ablate",
            f"--options={f['options']}",
            f"--weights={f['weights']}",
            f"--train={f['good']}",
            f"--test={f['non_utf8']}",
        ],
        ["non_utf8.txt:2"],
    ),
    # Issue #50: the seeds went to NumPy and JAX unchecked; -1 failed after the model loaded, in NumPy's
    # words naming no flag. Truncated weights show the flag is checked before the model loads (both cases
    # failed naming truncated_hdf5.txt).
    "probe: negative seed": (
        lambda f: [
            "elmo_jax.probe",
            f"--options={f['options']}",
            f"--weights={f['truncated_hdf5']}",
            f"--train={f['good']}",
            f"--test={f['good']}",
            "--seed=-1",
        ],
        ["--seed=-1", "[0, 9223372036854775807]"],
    ),
    "ablate: more seeds than a seed can number": (
        lambda f: [
            "elmo_jax.ablate",
            f"--options={f['options']}",
            f"--weights={f['truncated_hdf5']}",
            f"--train={f['good']}",
            f"--test={f['good']}",
            f"--seeds={2**64}",
        ],
        [f"--seeds={2**64}", "<= 9223372036854775808"],
    ),
    "serve: a host other machines reach, without a token": (
        lambda f: ["elmo_jax.serve", f"--model={f['model']}", "--host=0.0.0.0", "--port=0"],
        ["--host=0.0.0.0", "--auth_token_file", "ELMO_JAX_SERVE_TOKEN"],
    ),
    "serve: token file is a directory": (
        lambda f: ["elmo_jax.serve", f"--model={f['model']}", f"--auth_token_file={f['dir']}"],
        ["--auth_token_file=", "a_directory: cannot read it"],
    ),
    "export: truncated weights": (
        lambda f: [
            "elmo_jax.export",
            f"--options={f['options']}",
            f"--weights={f['truncated_hdf5']}",
            f"--output={f['root'] / 'm1'}",
        ],
        ["truncated_hdf5.txt"],
    ),
    "export: options is a directory": (
        lambda f: [
            "elmo_jax.export",
            f"--options={f['dir']}",
            f"--weights={f['weights']}",
            f"--output={f['root'] / 'm2'}",
        ],
        ["a_directory"],
    ),
    "export: read-only output": (
        lambda f: [
            "elmo_jax.export",
            f"--options={f['options']}",
            f"--weights={f['weights']}",
            f"--output={UNWRITABLE}/model",
        ],
        [f"{UNWRITABLE}/model"],
    ),
    "export: existing output without --overwrite": (
        lambda f: [
            "elmo_jax.export",
            f"--options={f['options']}",
            f"--weights={f['weights']}",
            f"--output={f['model']}",
        ],
        ["already exists", "--overwrite"],
    ),
    "embed_file: non-UTF-8 line": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['non_utf8']}",
            f"--output={f['root'] / 'o.hdf5'}",
        ],
        ["non_utf8.txt:2", "UTF-8"],
    ),
    "embed_file: NUL byte": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['nul']}",
            f"--output={f['root'] / 'o.hdf5'}",
        ],
        ["nul.txt:2", "NUL byte"],
    ),
    "embed_file: 10 MB line": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['ten_mb_line']}",
            f"--output={f['root'] / 'o.hdf5'}",
        ],
        ["ten_mb_line.txt:1", "2,097,152 tokens", "--max_sentence_tokens", "--long_sentences"],
    ),
    "embed_file: empty input": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['empty']}",
            f"--output={f['root'] / 'o.hdf5'}",
        ],
        ["empty.txt", "empty"],
    ),
    "embed_file: existing output without --overwrite": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['good']}",
            f"--output={f['existing_output']}",
        ],
        ["existing_output.txt already exists", "--overwrite"],
    ),
    "embed_file: existing output that is not vectors": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['good']}",
            f"--output={f['existing_output']}",
            "--overwrite",
        ],
        ["existing_output.txt exists and is not an elmo-command HDF5 vectors file"],
    ),
    "embed_file: output inside the model directory": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['good']}",
            f"--output={f['model'] / 'weights.hdf5'}",
            "--overwrite",
        ],
        ["is inside", "a model directory"],
    ),
    "vocab: existing output without --overwrite": (
        lambda f: ["elmo_jax.vocab", f"--files={f['good']}", f"--output={f['existing_output']}"],
        ["already exists", "--overwrite"],
    ),
    "embed_file: input is a directory": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['dir']}",
            f"--output={f['root'] / 'o.hdf5'}",
        ],
        ["a_directory", "is a directory"],
    ),
    "embed_file: read-only output": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['model']}",
            f"--input={f['good']}",
            f"--output={UNWRITABLE}/out.hdf5",
        ],
        [f"{UNWRITABLE}/out.hdf5"],
    ),
    "embed_file: model is a file": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--model={f['good']}",
            f"--input={f['good']}",
            f"--output={f['root'] / 'o.hdf5'}",
        ],
        ["good.txt", "expected a model directory"],
    ),
    "embed_file: truncated weights": (
        lambda f: [
            "elmo_jax.embed_file",
            f"--options={f['options']}",
            f"--weights={f['truncated_hdf5']}",
            f"--input={f['good']}",
            f"--output={f['root'] / 'o.hdf5'}",
        ],
        ["truncated_hdf5.txt"],
    ),
}


# One case per command also runs as a real process: what only a process shows (its exit status, output
# written after the error line by threads, a crash in interpreter teardown) is checked once per command.
SUBPROCESS_CASES = (
    "train: corpus is a directory",
    "vocab: read-only output",
    "evaluate: workdir without checkpoints",
    "export: truncated weights",
    "embed_file: NUL byte",
    "ablate: train file is a directory",
)


def check_refusal(files, expected, run) -> None:
    """`run()` ends with one error line holding each of `expected` and changes nothing under the root."""
    before = tree_digest(files["root"])
    listing = sorted(os.listdir(files["root"]))
    error_line(run(), *expected)
    assert tree_digest(files["root"]) == before  # the existing output, the model directory, every input
    assert sorted(os.listdir(files["root"])) == listing  # no new output, no temporary left behind


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_bad_input_is_one_line_and_touches_nothing(files, case):
    argv, expected = CLI_CASES[case]
    check_refusal(files, expected, lambda: run_in_process(*argv(files)))


@pytest.mark.slow
@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_cli_bad_input_in_a_real_process(files, case):
    argv, expected = CLI_CASES[case]
    check_refusal(files, expected, lambda: run_command(*argv(files)))


@pytest.mark.parametrize("command", ["elmo_jax.probe", "elmo_jax.ablate"])
def test_plot_without_matplotlib_is_refused_before_the_model_loads(files, monkeypatch, command):
    """Issue #51: --plot without matplotlib ran the whole job (20 s and more), then failed with a
    traceback. Now it is refused first, naming the extra that installs it; the truncated weights show the
    model was not read yet (the old code's error named truncated_hdf5.txt)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets where it is missing
    argv = [
        command,
        f"--options={files['options']}",
        f"--weights={files['truncated_hdf5']}",
        f"--train={files['good']}",
        f"--test={files['good']}",
        f"--plot={files['root'] / 'plot.png'}",
    ]
    check_refusal(files, ["--plot", "matplotlib", "pip install matplotlib"], lambda: run_in_process(*argv))


def test_a_million_character_token_is_cut_as_allennlp_cuts_it(files, tiny_params, tmp_path):
    """Not an error: tokens keep their first C - 2 bytes, so it embeds as that prefix does."""
    counts = ef.embed_file(tiny_params, str(files["million_char_token"]), str(tmp_path / "out.hdf5"))
    assert counts["tokens"] == 3
    import h5py

    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        vectors = f["0"][...]
    expected, _ = elmo_jax.embed(tiny_params, elmo_jax.batch_to_ids([["the", "x" * 48, "end"]]))
    np.testing.assert_allclose(vectors, np.asarray(expected)[0], rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- public functions


def good_chars():
    return elmo_jax.batch_to_ids([["the", "cat"], ["a"]])


def chars_with(value, dtype=np.int32):
    """Good ids with one character replaced by `value`, at index (0, 1, 2)."""
    chars = good_chars().astype(dtype)
    chars[0, 1, 2] = value
    return chars


FUNCTION_CASES = {
    "batch_to_ids: a string, not tokens": (
        lambda p, f: elmo_jax.batch_to_ids(["the cat"]),
        ValueError,
        "split the string into tokens",
    ),
    "batch_to_ids: bytes token": (
        lambda p, f: elmo_jax.batch_to_ids([["the", b"cat"]]),
        ValueError,
        "sentence 0, token 1: expected str",
    ),
    "batch_to_ids: no sentences": (lambda p, f: elmo_jax.batch_to_ids([]), ValueError, "at least one sentence"),
    "embed: float ids": (
        lambda p, f: elmo_jax.embed(p, good_chars().astype(np.float32)),
        ValueError,
        "expected integer character ids",
    ),
    "embed: negative id": (lambda p, f: elmo_jax.embed(p, chars_with(-3)), ValueError, "found -3 at index (0, 1, 2)"),
    "embed: huge id": (
        lambda p, f: elmo_jax.embed(p, chars_with(2**31 - 1)),
        ValueError,
        f"found {2**31 - 1} at index (0, 1, 2)",
    ),
    "embed: int64 huge id": (
        lambda p, f: elmo_jax.embed(p, chars_with(2**40, np.int64)),
        ValueError,
        f"found {2**40} at index (0, 1, 2)",
    ),
    "embed: wrong rank": (
        lambda p, f: elmo_jax.embed(p, good_chars()[0]),
        ValueError,
        "expected shape (batch, tokens, 50)",
    ),
    "embed: not params": (
        lambda p, f: elmo_jax.embed(p.weights, good_chars()),
        ValueError,
        "params must be BiLMParams",
    ),
    "load_hdf5: directory": (lambda p, f: elmo_jax.load_hdf5(f["options"], f["dir"]), IsADirectoryError, "a_directory"),
    "load_hdf5: truncated": (
        lambda p, f: elmo_jax.load_hdf5(f["options"], f["truncated_hdf5"]),
        ValueError,
        "truncated_hdf5.txt",
    ),
    "load_hdf5: not HDF5": (
        lambda p, f: elmo_jax.load_hdf5(f["options"], f["not_hdf5"]),
        ValueError,
        "not_hdf5.txt: not an HDF5 file",
    ),
    "load_hdf5: empty": (lambda p, f: elmo_jax.load_hdf5(f["options"], f["empty"]), ValueError, "empty.txt"),
    "load_hdf5: options not JSON": (
        lambda p, f: elmo_jax.load_hdf5(f["non_utf8"], f["weights"]),
        ValueError,
        "non_utf8.txt",
    ),
    "load: a file, not a directory": (
        lambda p, f: elmo_jax.load(f["good"]),
        FileNotFoundError,
        "expected a model directory",
    ),
    "load: missing": (lambda p, f: elmo_jax.load(f["root"] / "absent"), FileNotFoundError, "model directory not found"),
    "load: an empty directory": (lambda p, f: elmo_jax.load(f["dir"]), FileNotFoundError, "missing manifest.json"),
}


@pytest.mark.parametrize("case", sorted(FUNCTION_CASES))
def test_public_function_bad_input_names_the_problem(files, tiny_params, case):
    call, error, expected = FUNCTION_CASES[case]
    with pytest.raises(error) as info:
        call(tiny_params, files)
    message = str(info.value)
    assert expected in message and "\n" not in message.strip(), message
