"""One owner per concept (docs/ARCHITECTURE.md): the calls that make a concept happen appear only in the
module that owns it, and everyone else imports that module. Read from the source with `ast`; each
check fails when a second module starts doing the owner's job (as several did before issue #49)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "elmo_jax"

# (what, the dotted names whose use makes that concept happen, the modules allowed to use them)
OWNERS = [
    (
        "a published model's name told from a path",
        {"is_published_name", "is_location"},
        {"formats/model_source.py", "formats/published_models.py", "storage/places.py", "storage/__init__.py"},
    ),
    (
        "meetings of several processes",
        {"multihost_utils", "process_allgather", "sync_global_devices", "broadcast_one_to_all", "jax.distributed"},
        {"runtime/processes.py"},
    ),
    ("HTTP downloads", {"urlopen", "urlretrieve", "urllib.request"}, {"formats/download.py"}),
    ("progress lines: the interval, the terminal's in-place line", {"isatty"}, {"runtime/progress.py"}),
    (
        "handlers of SIGINT and SIGTERM",
        {"signal.signal"},
        # cli: a command's SIGTERM raises Terminated (its one-line ending); the service lets uvicorn's
        # graceful shutdown have both signals
        {"runtime/signals.py", "cli.py", "serving/service.py"},
    ),
    (
        # issue #51: where compiled programs are kept, and which are kept, is set in one place
        "the persistent compilation cache's settings",
        {
            "jax_compilation_cache_dir",
            "jax_enable_compilation_cache",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
            "set_cache_dir",
            "JAX_COMPILATION_CACHE_DIR",
        },
        {"storage/compile_cache.py"},
    ),
    (
        # issue #53: a model's text -> ids is the model's (bytes, or its own characters and words); every
        # path asks model/vocabulary.token_vocabulary(params). Bytes only: the token cache (refused for a
        # vocabulary model) and training's batch stream; __init__ re-exports the names.
        "a token's ids",
        {"batch_to_ids", "token_to_raw_ids", "tokens_to_raw_ids", "boundary_char_ids"},
        {"model/chars.py", "model/vocabulary.py", "__init__.py", "features/token_cache.py", "data/batch_stream.py"},
    ),
]


def uses(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of `tree` that name one of `names`: an attribute (`x.process_allgather`, `signal.signal`), a
    bare name, an imported name, or a string (a JAX setting: `jax.config.update("jax_...", value)`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = f"{node.value.id}.{node.attr}" if isinstance(node.value, ast.Name) else node.attr
            if node.attr in names or dotted in names:
                lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in names:
            lines.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            lines += [node.lineno for a in node.names if a.name in names or a.name.split(".")[-1] in names]
    return sorted(set(lines))


def owner_problems(root: Path, names: set[str], allowed: set[str]) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative in allowed:
            continue
        problems += [f"{relative}:{line}" for line in uses(ast.parse(path.read_text(encoding="utf-8")), names)]
    return problems


@pytest.mark.parametrize("what, names, allowed", OWNERS, ids=[o[0] for o in OWNERS])
def test_a_concept_has_one_owner(what, names, allowed):
    assert owner_problems(PACKAGE, names, allowed) == [], f"{what} done outside its owner {sorted(allowed)}"


def test_a_second_owner_is_caught(tmp_path):
    """The check itself can fail: a training module gathering over processes itself (as the trainer's
    multihost module and the file pipeline's processes module both did) is reported, its import of the
    owner is not."""
    (tmp_path / "runtime").mkdir()
    (tmp_path / "training").mkdir()
    (tmp_path / "runtime" / "processes.py").write_text("from jax.experimental import multihost_utils\n")
    (tmp_path / "training" / "feed.py").write_text(
        "from elmo_jax.runtime import processes\nfrom jax.experimental import multihost_utils\n\n"
        "x = multihost_utils.process_allgather(1)\n"
    )
    names, allowed = OWNERS[1][1], OWNERS[1][2]
    assert owner_problems(tmp_path, names, allowed) == ["training/feed.py:2", "training/feed.py:4"]


def test_a_second_compilation_cache_setting_is_caught(tmp_path):
    """A module that sets JAX's cache itself, by the setting's name in a string (how jax.config.update
    takes it), is reported; the owner's use is not. (Before strings were read, the check missed it.)"""
    (tmp_path / "storage").mkdir()
    (tmp_path / "features").mkdir()
    (tmp_path / "storage" / "compile_cache.py").write_text('jax.config.update("jax_compilation_cache_dir", d)\n')
    (tmp_path / "features" / "embed.py").write_text(
        'import jax\n\njax.config.update("jax_persistent_cache_min_compile_time_secs", 0)\n'
    )
    what, names, allowed = next(row for row in OWNERS if row[0] == "the persistent compilation cache's settings")
    assert owner_problems(tmp_path, names, allowed) == ["features/embed.py:3"]
