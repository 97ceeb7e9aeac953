"""The notebooks in notebooks/ run end to end on CPU, and are committed without outputs.

Each notebook is executed with nbclient in smoke mode: a cell `SMOKE_TEST = True` (plus the checkout's
path) is inserted after its "parameters" cell, as papermill does, so every size is tiny. The kernel is
this interpreter (`sys.executable`, through a kernel spec written to tmp_path), so CI's `.venv` runs
it, with the 8 forced CPU devices of conftest (the training mesh is sharded 8 ways) and a tmp working
directory. Any cell that raises fails the test, naming the cell.
"""

from __future__ import annotations

import json
import os
import re
import sys
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
        "env": {"JAX_PLATFORMS": "cpu", "IPYTHONDIR": str(directory / "ipython")},
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
    NotebookClient(
        nb, km=this_interpreter_kernel(tmp_path), timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(workdir)}}
    ).execute()
    return workdir


def stdout_of(nb: nbformat.NotebookNode) -> str:
    return "".join(o["text"] for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stdout")


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
    if path.name == "train_bilm.ipynb":  # conftest's 8 CPU devices reach the kernel: the mesh is sharded
        assert "mesh {'data': 8, 'model': 1}" in printed, printed
