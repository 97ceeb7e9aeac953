"""The notebooks in notebooks/ run end to end on CPU, and are committed without outputs.

Each notebook is executed with nbclient in smoke mode: a cell `SMOKE_TEST = True` (plus the checkout's
path) is inserted after its "parameters" cell, as papermill does, so every size is tiny. The kernel is
this interpreter (`sys.executable`, through a kernel spec written to tmp_path), so CI's `.venv` runs
it, with the 8 forced CPU devices of conftest (the training mesh is sharded 8 ways) and a tmp working
directory. It has no network: published models are fetched from an address where nothing listens
($ELMO_JAX_MODELS_URL), so the features notebook takes its offline path, into a tmp cache. Any cell that
raises fails the test, naming the cell.

The Colab-only parts of the setup cell cannot run here (no Colab, no network); what can be checked is
that an empty PACKAGE_SOURCE on Colab stops with a message saying what to set, and that the README's
Colab links and the notebooks' default PACKAGE_SOURCE agree with pyproject.toml (docs/make_colab_links.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import types
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # one cell; a smoke run of a whole notebook takes well under a minute
KERNEL_NAME = "elmo-jax-test"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # IPython colours its tracebacks


def test_there_are_notebooks():
    names = {path.name for path in NOTEBOOKS}
    assert {"train_bilm.ipynb", "elmo_features.ipynb", "domain_finetuning.ipynb"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    """Outputs, execution counts and per-cell run metadata stay out of git (they are large and noisy)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [], f"{path.name} cell {i}: has outputs; clear them before committing"
        assert cell.execution_count is None, f"{path.name} cell {i}: has an execution count"
        assert not set(cell.metadata) - {"tags"}, f"{path.name} cell {i}: metadata {sorted(cell.metadata)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_has_one_parameters_cell_first(path):
    """The first code cell is the papermill parameters cell and sets SMOKE_TEST = False by default."""
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    tagged = [cell for cell in code if "parameters" in cell.metadata.get("tags", [])]
    assert tagged == code[:1], f"{path.name}: expected exactly the first code cell tagged 'parameters'"
    assert "SMOKE_TEST = False" in code[0].source and 'REPO_DIR = ""' in code[0].source


def smoke_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook with an injected-parameters cell after its parameters cell (papermill's convention)."""
    nb = nbformat.read(path, as_version=4)
    index = next(i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", []))
    injected = nbformat.v4.new_code_cell(f"SMOKE_TEST = True\nREPO_DIR = {str(ROOT)!r}\nWORK_ROOT = 'elmo_runs'")
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(index + 1, injected)
    return nb


def this_interpreter_kernel(directory: Path) -> KernelManager:
    """A kernel manager that starts `sys.executable -m ipykernel_launcher`, whatever kernels are installed,
    with its files under `directory`."""
    spec_dir = directory / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "elmo-jax tests",
        "language": "python",
        # IPYTHONDIR: no user profile or startup files take part. matplotlib uses ipykernel's inline
        # backend (PNG outputs).
        # ELMO_JAX_MODELS_URL: nothing listens on port 9 (discard), so a download fails at once, offline.
        "env": {
            "JAX_PLATFORMS": "cpu",
            "IPYTHONDIR": str(directory / "ipython"),
            "ELMO_JAX_MODELS_URL": "http://127.0.0.1:9/",
            "ELMO_JAX_CACHE": str(directory / "elmo_jax_cache"),
        },
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    specs = KernelSpecManager(kernel_dirs=[str(directory / "kernels")], ensure_native_kernel=False)
    # The connection file goes to tmp_path too, not to ~/.local/share/jupyter (CI's HOME may be read-only).
    return KernelManager(
        kernel_name=KERNEL_NAME, kernel_spec_manager=specs, connection_file=str(directory / "connection.json")
    )


def execute(nb: nbformat.NotebookNode, tmp_path: Path) -> Path:
    """Runs `nb` in place in a fresh kernel of this interpreter, in tmp_path/cwd; returns that directory."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    km = this_interpreter_kernel(tmp_path)
    try:
        NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(workdir)}}).execute()
    finally:
        # nbclient leaves a kernel it was given running; it would live until this process exits, and the
        # CPU it used would be counted nowhere (tests/support/cpu_time.py counts waited-for children).
        process = getattr(km.provisioner, "process", None)
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        if process is not None:
            process.wait(timeout=60)
    return workdir


def stdout_of(nb: nbformat.NotebookNode, stream: str = "stdout") -> str:
    return "".join(o["text"] for c in nb.cells for o in c.get("outputs", []) if o.get("name") == stream)


def test_a_failing_cell_fails_the_run(tmp_path):
    """What the smoke test relies on: an exception in any cell stops the run with CellExecutionError."""
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"),
            nbformat.v4.new_code_cell("raise ValueError('boom')"),
            nbformat.v4.new_code_cell("print('never')"),
        ]
    )
    with pytest.raises(CellExecutionError, match="boom"):
        execute(nb, tmp_path)
    assert stdout_of(nb).strip() == sys.executable  # the kernel is this interpreter (CI's .venv)
    assert nb.cells[2].outputs == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
@pytest.mark.slow
def test_runs_end_to_end_in_smoke_mode(path, tmp_path):
    nb = smoke_notebook(path)
    try:
        workdir = execute(nb, tmp_path)
    except CellExecutionError as e:  # the message holds the cell's source and the traceback
        pytest.fail(f"{path.name}: a cell raised\n{ANSI_ESCAPE.sub('', str(e))}", pytrace=False)
    printed = stdout_of(nb)
    assert "SMOKE_TEST: tiny sizes" in printed, f"{path.name}: did not run in smoke mode"
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, f"{path.name}: no plot was drawn"
    assert os.listdir(workdir / "elmo_runs"), f"{path.name}: wrote nothing under its WORK_ROOT"
    assert not (ROOT / "notebooks" / "elmo_runs").exists(), f"{path.name}: wrote into the checkout"
    assert re.search(r"jax \S+ jaxlib \S+ flax \S+ optax \S+ orbax-checkpoint \S+", printed), printed
    assert "8 cpu device(s)" in printed, printed
    # Progress while training: the trainer's line every log_every_steps reaches the cell (absl, INFO).
    assert re.search(r"step 5/20  loss \d", stdout_of(nb, "stderr")), f"{path.name}: no progress line while training"
    if path.name == "train_bilm.ipynb":  # conftest's 8 CPU devices reach the kernel: the mesh is sharded
        assert "mesh {'data': 8, 'model': 1}" in printed, printed
        # The smoke text's long words make the step compile again for a wider bucket, as a real corpus does.
        compiles = re.findall(
            r"compiling the training step for tokens of up to (\d+) characters", stdout_of(nb, "stderr")
        )
        assert len(set(compiles)) >= 2, compiles
    if path.name == "elmo_features.ipynb":  # offline: it says so and trains the demo biLM
        assert "could not get the published 'small' model (http://127.0.0.1:9/" in printed, printed
        assert "offline: training the demo biLM on the default corpus instead" in printed, printed


def code_cells(path: Path) -> list[str]:
    return [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_on_colab_an_empty_package_source_says_what_to_set(path, monkeypatch):
    """The parameters and setup cells, run as on Colab (a `google.colab` module is present) with the default
    empty PACKAGE_SOURCE: one ValueError saying what to put there, before anything is installed or cloned."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr("subprocess.run", lambda *a, **k: pytest.fail(f"ran {a} before checking PACKAGE_SOURCE"))
    parameters, setup = code_cells(path)[:2]
    namespace = {}
    exec(parameters, namespace)
    assert namespace["PACKAGE_SOURCE"] == "" and namespace["WORK_ON_DRIVE"] is False
    with pytest.raises(
        ValueError, match="PACKAGE_SOURCE is empty: set it in the parameters cell .* git URL .* Google Drive"
    ):
        exec(setup, namespace)


def test_no_notebook_assumes_eight_cores_or_a_model_axis():
    """Colab's TPU runtimes are single-chip now: no notebook sets a model axis above 1 or says "8 cores"."""
    for path in NOTEBOOKS:
        text = path.read_text(encoding="utf-8")
        assert "MESH_MODEL = 2" not in text and "8 on a Colab TPU" not in text and "YOUR_ORG" not in text, path.name


def _colab_links():
    spec = importlib.util.spec_from_file_location("docs_make_colab_links", ROOT / "docs" / "make_colab_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_colab_links_and_package_source_follow_pyproject():
    """The README's Colab block and each notebook's default PACKAGE_SOURCE are what pyproject.toml's
    [tool.elmo-jax] gives (one setting), and setting it gives working links and a matching source."""
    links = _colab_links()
    assert links.main(["--check"]) == 0, "run python docs/make_colab_links.py"
    files = links.rendered("someone/elmo-jax", "main")
    readme = files[ROOT / "README.md"]
    for name in links.NOTEBOOKS:
        assert f"https://colab.research.google.com/github/someone/elmo-jax/blob/main/notebooks/{name}" in readme
        first = nbformat.reads(files[ROOT / "notebooks" / name], as_version=4).cells[1].source
        assert 'PACKAGE_SOURCE = "https://github.com/someone/elmo-jax"  # @param {type:"string"}' in first


@pytest.mark.parametrize("backend, devices", [("tpu", 1), ("tpu", 4), ("tpu", 8), ("gpu", 2), ("cpu", 1)])
def test_notebook_sizes_fit_any_device_count(backend, devices):
    """configs/notebooks.py: data-parallel meshes that split the batch on 1, 4 or 8 chips, GPUs or the CPU;
    a model axis that does not divide the devices falls back to 1, saying why."""
    from configs import notebooks

    for config in (notebooks.train_bilm(backend, devices), notebooks.demo_bilm(backend, devices)):
        assert (config.mesh.data, config.mesh.model) == (-1, 1)
        assert config.batch_size % devices == 0
    if backend == "tpu":
        assert notebooks.train_bilm(backend, devices).batch_size == 128 * devices
    assert notebooks.mesh_model(1, devices) == (1, "")
    axis, note = notebooks.mesh_model(2, devices)
    assert (axis, bool(note)) == ((2, False) if devices % 2 == 0 else (1, True))
    assert notebooks.mesh_model(3, 8)[0] == 1 and "does not divide 8 device(s)" in notebooks.mesh_model(3, 8)[1]
    # The softmax's 256-row padding (elmo_jax.training.softmax) does not split into 512 shards.
    assert notebooks.mesh_model(512, 512)[0] == 1 and "256 softmax rows" in notebooks.mesh_model(512, 512)[1]


def test_a_notebook_workdir_of_other_sizes_is_refused_with_the_way_out(tmp_path):
    """The training notebook's workdir is the same on every backend (RUN_NAME), and its sizes follow the
    backend: a run started on a TPU runtime is continued by the next TPU session, and refused by a CPU one
    with both sizes named and what to do, before training would refuse its checkpoints."""
    from configs import notebooks

    workdir = str(tmp_path / "train_bilm")
    notebooks.check_same_run(workdir, notebooks.train_bilm("tpu", 1), "tpu", 1)
    notebooks.check_same_run(workdir, notebooks.train_bilm("tpu", 1), "tpu", 1)  # the next TPU session
    with pytest.raises(ValueError) as refused:
        notebooks.check_same_run(workdir, notebooks.train_bilm("cpu", 8), "cpu", 8)
    message = str(refused.value)
    assert "started on 1 tpu device(s) with batch 128 x 20 tokens, LSTM 1024, projection 128" in message
    assert "this runtime (8 cpu device(s)) trains batch 32 x 20 tokens, LSTM 256, projection 64" in message
    assert "RUN_NAME" in message
    with pytest.raises(ValueError, match="started on 1 tpu"):  # also a TPU slice of another size
        notebooks.check_same_run(workdir, notebooks.train_bilm("tpu", 8), "tpu", 8)
    assert os.listdir(workdir) == [notebooks.RUN_RECORD]


def test_the_training_notebook_refuses_a_run_name_that_is_not_a_folder_name(tmp_path):
    """RUN_NAME names the workdir under WORK_ROOT: an empty one (joining "" gives WORK_ROOT itself, which
    the Drive copy would then empty of other runs and models), ".", "..", or one holding "/" (an absolute
    one replaces WORK_ROOT) is refused with what to set; the notebook takes its workdir from this check.
    Before: `configs.notebooks` had no `run_workdir` (AttributeError) and the notebook joined any name."""
    from configs import notebooks

    root = str(tmp_path / "elmo_runs")
    for bad in ("", "  ", ".", "..", "runs/a", "/content"):
        with pytest.raises(ValueError, match=rf"^RUN_NAME={re.escape(repr(bad))}: .*parameters cell") as refused:
            notebooks.run_workdir(root, bad)
        assert "\n" not in str(refused.value)
    assert notebooks.run_workdir(root, "train_bilm") == os.path.join(root, "train_bilm")
    setup = next(source for source in code_cells(ROOT / "notebooks" / "train_bilm.ipynb") if "WORKDIR =" in source)
    assert 'WORKDIR = sizes.run_workdir(WORK_ROOT, "train_smoke" if SMOKE_TEST else RUN_NAME)' in setup
