"""The package's layers, read from the source with `ast`: every import of an elmo_jax module points down
the layers (docs/ARCHITECTURE.md), nothing imports a command module, an application imports libraries
and never another application, and no modules import each other in a cycle (function-local imports
included: they hide a cycle from Python, not from the design)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "elmo_jax"
# Layer of each top-level name under elmo_jax; a module may import its own layer and those below it.
# Side by side, importing neither each other: storage, model and runtime (the bottom: where bytes live,
# the pure model, the host process's signals, meetings and progress lines), features and data, and the
# applications.
LAYERS = {
    "storage": 0,
    "model": 0,
    "runtime": 0,
    "formats": 1,
    "features": 2,
    "data": 2,
    "training": 3,
    "files": 4,
    "serving": 4,
    "analysis": 4,
}
# The applications stand over the libraries (everything below them) and never import each other: what
# two of them need belongs to a library.
APPLICATIONS = {"files", "serving", "analysis"}
COMMAND = 5  # elmo_jax/<name>.py: the commands (python -m elmo_jax.X) and their shared ending (cli)
# The public API: elmo_jax/__init__.py re-exports model, formats and features, and the facade modules;
# elmo_jax/pretrained.py re-exports formats (the published models by name); elmo_jax/embedder.py is
# AllenNLP's `ElmoEmbedder` over the library and the file pipeline. Nothing in the package imports a
# facade module (the commands import the package itself, or the layers).
FACADES = {"elmo_jax/__init__.py", "elmo_jax/pretrained.py", "elmo_jax/embedder.py"}
FACADE_MODULES = {"elmo_jax.pretrained", "elmo_jax.embedder"}


def layer_of(module: str) -> tuple[int, str]:
    """(layer, top-level name) of a dotted elmo_jax module name; the package itself is the facade."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return LAYERS.get(top, COMMAND), top


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every elmo_jax module `path` imports, `from elmo_jax import x` resolved to x
    (`root`: the package directory, where subpackages are looked up)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "elmo_jax"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "elmo_jax":
            is_package = (root.parent / node.module.replace(".", "/") / "__init__.py").exists()
            found += [(node.lineno, f"{node.module}.{a.name}" if is_package else node.module) for a in node.names]
    return found


def upward_imports(root: Path = PACKAGE) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).as_posix()
        own_layer, own_top = layer_of(relative[: -len(".py")].replace("/__init__", "").replace("/", "."))
        for line, module in imported_modules(path, root):
            layer, top = layer_of(module)
            if relative in FACADES:
                allowed = layer <= LAYERS["features"] or top in APPLICATIONS or module in FACADE_MODULES
                allowed = allowed and module != "elmo_jax"
            else:
                allowed = (layer < own_layer or top == own_top) and not (
                    top in APPLICATIONS and own_top in APPLICATIONS and top != own_top
                )
            if layer == COMMAND and own_layer == COMMAND and relative not in FACADES:
                allowed = module == "elmo_jax.cli" or relative == "elmo_jax/cli.py" or module == "elmo_jax"
            if not allowed:
                problems.append(f"{relative}:{line} imports {module}")
    return problems


def test_imports_point_down_the_layers():
    assert upward_imports() == []


def module_name(path: Path, root: Path) -> str:
    return path.relative_to(root.parent).as_posix()[: -len(".py")].replace("/__init__", "").replace("/", ".")


def import_cycles(root: Path = PACKAGE) -> list[list[str]]:
    """The import cycles among the package's modules (each a list of modules, the first repeated last);
    an import of a package counts as an import of its __init__."""
    modules = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph = {
        name: sorted({m for _, m in imported_modules(path, root) if m in modules and m != name})
        for name, path in modules.items()
    }
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(name: str, stack: list[str]) -> None:
        state[name] = 1
        for child in graph[name]:
            if state.get(child) == 1:
                cycles.append(stack[stack.index(child) :] + [child])
            elif child not in state:
                visit(child, stack + [child])
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycles():
    assert import_cycles() == []


def test_an_import_cycle_is_caught(tmp_path):
    """The check itself can fail: two modules of one layer importing each other, one of them only
    inside a function, are reported."""
    package = tmp_path / "elmo_jax"
    (package / "features").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "features" / "__init__.py").write_text("")
    (package / "features" / "a.py").write_text("from elmo_jax.features import b\n")
    (package / "features" / "b.py").write_text("def f():\n    from elmo_jax.features.a import g\n")
    assert import_cycles(package) == [["elmo_jax.features.a", "elmo_jax.features.b", "elmo_jax.features.a"]]


def test_an_upward_import_is_caught(tmp_path):
    """The check itself can fail: a model module importing the trainer, and a library module importing
    a command, are both reported."""
    package = tmp_path / "elmo_jax"
    for name in ("", "model", "formats", "training", "features"):
        (package / name).mkdir(parents=True, exist_ok=True)
        (package / name / "__init__.py").write_text("")
    (package / "model" / "bilm.py").write_text("from elmo_jax.training import loop\n")
    (package / "features" / "embed.py").write_text("from elmo_jax import export\nfrom elmo_jax.model import bilm\n")
    (package / "formats" / "cache.py").write_text("from elmo_jax import pretrained\n")
    (package / "embed_text.py").write_text("import elmo_jax.pretrained\nfrom elmo_jax import cli\n")
    (package / "pretrained.py").write_text("from elmo_jax.formats import cache\nfrom elmo_jax.training import loop\n")
    assert upward_imports(package) == [
        "elmo_jax/embed_text.py:1 imports elmo_jax.pretrained",
        "elmo_jax/features/embed.py:1 imports elmo_jax.export",
        "elmo_jax/formats/cache.py:1 imports elmo_jax.pretrained",
        "elmo_jax/model/bilm.py:1 imports elmo_jax.training.loop",
        "elmo_jax/pretrained.py:2 imports elmo_jax.training.loop",
    ]


def test_an_application_importing_another_is_caught(tmp_path):
    """The check itself can fail: the service importing the file pipeline (both applications, one layer)
    is reported, its imports of the library are not, nor the file pipeline's import of its own module."""
    package = tmp_path / "elmo_jax"
    for name in ("", "features", "files", "serving"):
        (package / name).mkdir(parents=True, exist_ok=True)
        (package / name / "__init__.py").write_text("")
    (package / "features" / "sentences.py").write_text("")
    (package / "files" / "options.py").write_text("")
    (package / "files" / "pipeline.py").write_text("from elmo_jax.files import options\n")
    (package / "serving" / "app.py").write_text(
        "from elmo_jax.features import sentences\n\n\ndef f():\n    from elmo_jax.files.pipeline import run\n"
    )
    assert upward_imports(package) == ["elmo_jax/serving/app.py:5 imports elmo_jax.files.pipeline"]


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_layer_is_a_package(name):
    assert (PACKAGE / name / "__init__.py").exists()
