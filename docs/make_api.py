"""Writes docs/API.md, the API reference, from the docstrings: the names in `elmo_jax.__all__` and the
command-line tools' module docstrings and flags.

    python docs/make_api.py            # rewrite docs/API.md
    python docs/make_api.py --check    # exit 1 if docs/API.md is not what the docstrings give

The docstrings are the source; API.md is never edited by hand (tests/test_api_docs.py fails when it
is stale). Functions are shown with `inspect.signature`; classes with their own fields (Flax modules:
the attributes a user sets, without Flax's `parent` and `name`) and the public methods they define.
The command-line tools are read with `ast`, without importing them, so their flags are listed exactly
as their `DEFINE_*` calls declare them (and the shared ones of elmo_jax/cli.py where they call them); a
help text kept with the library concept it describes (`output_modes.LAYERS_HELP`) is read from there.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import tomllib
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "API.md"
# (how to run it, source file), in the order a user meets them.
CLIS = (
    ("python train.py", "elmo_jax/train.py"),  # the repository's train.py runs elmo_jax/train.py
    ("python -m elmo_jax.vocab", "elmo_jax/vocab.py"),
    ("python -m elmo_jax.evaluate", "elmo_jax/evaluate.py"),
    ("python -m elmo_jax.export", "elmo_jax/export.py"),
    ("python -m elmo_jax.embed_text", "elmo_jax/embed_text.py"),
    ("python -m elmo_jax.embed_file", "elmo_jax/embed_file.py"),
    ("python -m elmo_jax.default_corpus", "elmo_jax/default_corpus.py"),
    ("python -m elmo_jax.probe", "elmo_jax/probe.py"),
    ("python -m elmo_jax.ablate", "elmo_jax/ablate.py"),
    ("python -m elmo_jax.serve", "elmo_jax/serve.py"),
    ("python -m elmo_jax.prepare_lm1b", "elmo_jax/prepare_lm1b.py"),
    ("python -m elmo_jax.segment", "elmo_jax/segment.py"),
)
FLAX_MODULE_FIELDS = ("parent", "name")  # every Flax module has them; they are not the module's API


def _doc_block(doc: str | None) -> list[str]:
    """A docstring as a fenced text block (Google-style sections keep their indentation)."""
    if not doc:
        return ["*(no docstring)*", ""]
    return ["```text", *doc.rstrip().splitlines(), "```", ""]


def _class_signature(cls: type) -> str:
    """`Name(field: type = default, ...)` of a dataclass or Flax module, else of its constructor."""
    if dataclasses.is_dataclass(cls):
        parts = []
        for field in dataclasses.fields(cls):
            if (field.name in FLAX_MODULE_FIELDS and _is_flax_module(cls)) or not field.init:
                continue
            text = f"{field.name}: {_annotation(field.type)}"
            if field.default is not dataclasses.MISSING:
                text += f" = {field.default!r}"
            elif field.default_factory is not dataclasses.MISSING:
                text += f" = {field.default_factory.__name__}()"
            parts.append(text)
        return f"{cls.__name__}({', '.join(parts)})"
    return f"{cls.__name__}{_signature(cls)}"


def _is_flax_module(cls: type) -> bool:
    import flax.linen as nn

    return issubclass(cls, nn.Module)


def _annotation(annotation) -> str:
    if isinstance(annotation, typing.ForwardRef):
        annotation = annotation.__forward_arg__
    if isinstance(annotation, str):
        return annotation.strip("'\"")  # a quoted forward reference inside a string annotation
    return inspect.formatannotation(annotation)


class _Raw:
    """An annotation shown as written (the modules use string annotations; inspect would quote them)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(function, *, method: bool = False) -> str:
    """`(a: int, *, b: str = 'x') -> T` with annotations unquoted; a method's self/cls left out."""
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())[1 if method else 0 :]
    empty = inspect.Signature.empty
    parameters = [
        p.replace(annotation=_Raw(_annotation(p.annotation))) if p.annotation is not empty else p for p in parameters
    ]
    returns = signature.return_annotation
    return str(
        signature.replace(
            parameters=parameters, return_annotation=_Raw(_annotation(returns)) if returns is not empty else empty
        )
    )


def _own_methods(cls: type) -> list[tuple[str, str, object]]:
    """(name, signature, function) of the public methods (and `__call__`) the class itself defines with a
    docstring, in source order."""
    found = []
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        function = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if inspect.isfunction(function) and function.__doc__:
            found.append((name, _signature(function, method=not isinstance(member, staticmethod)), function))
    return found


def python_api() -> list[str]:
    import elmo_jax

    lines = ["## Python API (`import elmo_jax`)", ""]
    lines += [f"- [`{name}`](#{name.lower()})" for name in elmo_jax.__all__] + [""]
    for name in elmo_jax.__all__:
        obj = getattr(elmo_jax, name)
        lines += [f"### {name}", ""]
        if inspect.ismodule(obj):  # a public submodule (elmo_jax.pretrained): its docstring, then its names
            lines += [f"`import elmo_jax.{name}` (the module `{obj.__name__}`)", ""]
            lines += _doc_block(inspect.getdoc(obj))
            for member in obj.__all__:
                lines += [f"#### {name}.{member}", ""] + _entry(f"{name}.{member}", getattr(obj, member))
        else:
            lines += _entry(name, obj)
    return lines


def _entry(shown: str, obj) -> list[str]:
    """The signature and docstring of a public class, function or constant, as `elmo_jax.<shown>`."""
    module = getattr(obj, "__module__", None)
    prefix = shown.rpartition(".")[0] + "." if "." in shown else ""
    if inspect.isclass(obj) and issubclass(obj, BaseException):  # exceptions: the base says how to catch it
        signature = f"{obj.__name__}({obj.__bases__[0].__name__})"
        return [f"`class elmo_jax.{prefix}{signature}` (defined in `{module}`)", ""] + _doc_block(inspect.getdoc(obj))
    if inspect.isclass(obj):
        lines = [f"`class elmo_jax.{prefix}{_class_signature(obj)}` (defined in `{module}`)", ""]
        lines += _doc_block(inspect.getdoc(obj))
        for method_name, signature, method in _own_methods(obj):
            lines += [f"`{shown}.{method_name}{signature}`", ""]
            lines += _doc_block(inspect.getdoc(method))
        return lines
    if callable(obj):
        return [f"`elmo_jax.{shown}{_signature(obj)}` (defined in `{module}`)", ""] + _doc_block(inspect.getdoc(obj))
    return [f"`elmo_jax.{shown}`: a {type(obj).__name__} of {len(obj)} entries: {', '.join(map(str, obj))}", ""]


def _flag_rows(tree: ast.Module, *, in_cli: bool = False) -> list[str]:
    """Markdown table rows for every `*.DEFINE_*("name", default, "help")` call in a module, in source
    order; a call of a shared definition in elmo_jax/cli.py (`cli.define_*()`, or `define_*()` inside
    cli.py itself) brings that function's rows."""
    rows = []
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        func = node.func
        if isinstance(func, ast.Name) and in_cli and func.id.startswith("define_"):
            rows += _flag_rows(_shared_definition(func.id), in_cli=True)
            continue
        if not isinstance(func, ast.Attribute):
            continue
        if isinstance(func.value, ast.Name) and func.value.id == "cli" and func.attr.startswith("define_"):
            rows += _flag_rows(_shared_definition(func.attr), in_cli=True)
            continue
        if not (func.attr.startswith("DEFINE_") and node.args):
            continue
        args = {k.arg: k.value for k in node.keywords}
        name = ast.literal_eval(node.args[0])
        default = node.args[1] if len(node.args) > 1 else args.get("default")
        help_node = node.args[-1] if len(node.args) > 2 else args.get("help")
        if func.attr == "DEFINE_enum" and len(node.args) > 3:
            help_node = node.args[3]
        try:
            help_text = ast.literal_eval(help_node) if help_node is not None else ""
        except ValueError:
            help_text = _imported_constant(tree, help_node)
        kind = func.attr[len("DEFINE_") :].lower()
        default_text = ast.unparse(default) if default is not None else ""
        help_text = " ".join(help_text.split()).replace("|", "\\|")  # one table cell
        rows.append(f"| `--{name}` | {kind} | `{default_text}` | {help_text} |")
    return rows


def _imported_constant(tree: ast.Module, node: ast.expr) -> str:
    """The value of `module.NAME` where `tree` imports `module` (`from elmo_jax.features import
    output_modes`); anything else as written."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
        return ast.unparse(node)
    for statement in ast.walk(tree):
        if isinstance(statement, ast.ImportFrom) and statement.level == 0:
            names = {a.asname or a.name: f"{statement.module}.{a.name}" for a in statement.names}
        elif isinstance(statement, ast.Import):
            names = {a.asname or a.name: a.name for a in statement.names}
        else:
            continue
        if node.value.id in names:
            return getattr(importlib.import_module(names[node.value.id]), node.attr)
    return ast.unparse(node)


def _shared_definition(name: str) -> ast.Module:
    """The function `name` of elmo_jax/cli.py (flags several commands define), as a module to read."""
    tree = ast.parse((ROOT / "elmo_jax" / "cli.py").read_text(encoding="utf-8"))
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name)
    return ast.Module(body=function.body, type_ignores=[])


def command_line_tools() -> list[str]:
    lines = [
        "## Command-line tools",
        "",
        "Each exits 1 with a one-line error (no traceback) on bad flags or input.",
        "",
    ]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    scripts = {target.split(":")[0]: name for name, target in pyproject["project"]["scripts"].items()}
    for command, source in CLIS:
        tree = ast.parse((ROOT / source).read_text(encoding="utf-8"), filename=source)
        script = scripts.get(source[: -len(".py")].replace("/", "."))
        heading = f"`{command}`" + (f" or `{script}` (the console script)" if script else "")
        lines += [f"### {heading}", "", f"Source: `{source}`.", ""]
        lines += _doc_block(ast.get_docstring(tree))
        rows = _flag_rows(tree)
        if rows:
            lines += ["| flag | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    return lines


def render() -> str:
    lines = [
        "# elmo-jax API reference",
        "",
        "Generated from the docstrings by `python docs/make_api.py`; do not edit by hand (a test checks "
        "that this file is what the docstrings give).",
        "",
    ]
    lines += python_api() + command_line_tools()
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(f"error: unexpected arguments {argv}; usage: python docs/make_api.py [--check]", file=sys.stderr)
        return 1
    text = render()
    if argv == ["--check"]:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"error: {OUTPUT} is stale; run python docs/make_api.py", file=sys.stderr)
            return 1
        return 0
    from elmo_jax.storage import atomic

    atomic.write_text(OUTPUT, text)  # never a half-written API.md
    print(f"wrote {OUTPUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # a checkout runs it without installing
    sys.exit(main(sys.argv[1:]))
