"""docs/ARCHITECTURE.md names every module of the package and no module that does not exist.

The convention (stated in the doc): the layer diagram (the doc's first ```text block) names every module,
a layer's as `elmo_jax/LAYER/{a, b, ...}`, the commands as `python -m elmo_jax.{a, b, ...}`, other top-level
modules as `elmo_jax/NAME.py` and the commands at the repository's root (`train.py`) by file name. A path
`LAYER/NAME.py` or `elmo_jax/...NAME.py` anywhere in the doc must exist. Pure file reading, no imports."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUP = re.compile(r"elmo_jax(?:/(\w+)/|\.)\{([^}]*)\}")  # elmo_jax/data/{a, b} or elmo_jax.{a, b}
TOP_LEVEL = re.compile(r"(?<![\w/.])elmo_jax/(\w+)\.py\b")  # elmo_jax/cli.py
ROOT_FILE = re.compile(r"(?<![\w/.])(\w+)\.py\b")  # train.py (not a path's last part)
NAME = re.compile(r"[A-Za-z_]\w*")


def package_modules(root: Path) -> dict[str, set[str]]:
    """Module names by folder ("" for the package's top level); a subpackage's __init__.py is not one."""
    modules: dict[str, set[str]] = {}
    for path in (root / "elmo_jax").rglob("*.py"):
        folder = path.parent.relative_to(root / "elmo_jax").as_posix()
        folder = "" if folder == "." else folder
        if folder and path.name == "__init__.py":
            continue
        modules.setdefault(folder, set()).add(path.stem)
    return modules


def diagram_modules(doc: str) -> tuple[dict[str, set[str]], set[str], list[str]]:
    """(module names by folder, root files, problems) as the doc's layer diagram names them."""
    block = re.search(r"```text\n(.*?)```", doc, re.S)
    if block is None:
        return {}, set(), ["no ```text block (the layer diagram)"]
    text, named, problems = block.group(1), {}, []
    for folder, names in GROUP.findall(text):
        for item in names.split(","):
            words = item.split()  # a name continued on the next line follows the diagram's left columns
            name = words[-1] if words else ""
            if not NAME.fullmatch(name):
                problems.append(f"not a module name in elmo_jax/{folder}{{...}}: {item.strip()!r}")
            named.setdefault(folder, set()).add(name)
    rest = GROUP.sub(" ", text)
    named.setdefault("", set()).update(TOP_LEVEL.findall(rest))
    return named, set(ROOT_FILE.findall(TOP_LEVEL.sub(" ", rest))), problems


def doc_problems(root: Path = ROOT, doc_path: str = "docs/ARCHITECTURE.md") -> list[str]:
    doc = (root / doc_path).read_text(encoding="utf-8")
    modules = package_modules(root)
    named, root_files, problems = diagram_modules(doc)
    for folder in sorted(set(modules) | set(named)):
        where = f"elmo_jax/{folder}/" if folder else "elmo_jax/"
        problems += [
            f"{where}{m}.py is not in the diagram"
            for m in sorted(modules.get(folder, set()) - named.get(folder, set()))
        ]
        problems += [
            f"the diagram names {where}{m}.py, which does not exist"
            for m in sorted(named.get(folder, set()) - modules.get(folder, set()))
        ]
    commands = {p.stem for p in root.glob("*.py")}
    problems += [f"{m}.py (at the root) is not in the diagram" for m in sorted(commands - root_files)]
    problems += [f"the diagram names {m}.py, which is not at the root" for m in sorted(root_files - commands)]
    layers = "|".join(sorted(f for f in modules if f))
    for path in sorted(set(re.findall(rf"(?<![\w/])((?:elmo_jax/)?(?:{layers})/\w+\.py|elmo_jax/\w+\.py)", doc))):
        relative = path if path.startswith("elmo_jax/") else f"elmo_jax/{path}"
        if not (root / relative).is_file():
            problems.append(f"the doc names {path}, which does not exist")
    return problems


def test_the_architecture_doc_names_every_module():
    assert doc_problems() == []


def _tree(tmp_path: Path, diagram: str, table: str = "") -> Path:
    for path in ("train.py", "elmo_jax/__init__.py", "elmo_jax/cli.py", "elmo_jax/embed.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    for path in ("elmo_jax/model/__init__.py", "elmo_jax/model/lstm.py", "elmo_jax/model/char_cnn.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/ARCHITECTURE.md").write_text(f"# Layers\n\n```text\n{diagram}\n```\n\n{table}\n")
    return tmp_path


def test_a_complete_diagram_passes(tmp_path):
    diagram = (
        "  commands   train.py   python -m elmo_jax.{embed}  (elmo_jax/cli.py)\n"
        "  api        elmo_jax/__init__.py\n"
        "  model      elmo_jax/model/{lstm,\n"
        "                |         char_cnn}"
    )
    assert doc_problems(_tree(tmp_path, diagram, "| LSTM | `model/lstm.py` |")) == []


def test_a_missing_or_stale_module_is_reported(tmp_path):
    """The check itself can fail: a module left out, a name that is no module, a stale path in the table."""
    diagram = (
        "  commands   python -m elmo_jax.{embed, export}  (elmo_jax/cli.py)\n"
        "  api        elmo_jax/__init__.py\n"
        "  model      elmo_jax/model/{lstm, gru}"
    )
    table = "| LSTM | `model/lstm.py` |\n| old | `model/highway.py`, `elmo_jax/model/bilm.py` |"
    assert doc_problems(_tree(tmp_path, diagram, table)) == [
        "the diagram names elmo_jax/export.py, which does not exist",
        "elmo_jax/model/char_cnn.py is not in the diagram",
        "the diagram names elmo_jax/model/gru.py, which does not exist",
        "train.py (at the root) is not in the diagram",
        "the doc names elmo_jax/model/bilm.py, which does not exist",
        "the doc names model/highway.py, which does not exist",
    ]
