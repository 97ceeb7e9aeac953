"""The test environment itself: conftest must have forced 8 CPU devices and strict rank promotion, with
XLA test settings the running XLA accepts."""

import os

import jax

from tests.support import xla_flags


def test_eight_devices():
    """Sharding code needs several devices; conftest forces 8 host devices so it runs everywhere."""
    assert len(jax.devices()) == 8


def test_rank_promotion_raises():
    """Implicit rank promotion is an error in tests, so library code must broadcast explicitly."""
    assert jax.config.jax_numpy_rank_promotion == "raise"


def test_runtime_dependencies_cover_what_training_and_export_import():
    """A plain `pip install .` (no test extra) must be able to train and export: jax.export serialization
    imports flatbuffers only when called, so nothing else would catch its absence before a user's run."""
    import pathlib
    import tomllib

    pyproject = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())
    names = {
        dep.split(">")[0].split("=")[0].split("[")[0].strip().lower() for dep in pyproject["project"]["dependencies"]
    }
    for needed in (
        "jax",
        "flax",
        "optax",
        "orbax-checkpoint",
        "tensorflow-datasets",
        "h5py",
        "flatbuffers",
        "ml_collections",
        "absl-py",
        "grain",
        "tensorboardx",
    ):
        assert needed in names, needed


def test_xla_compile_flags_are_probed_once_per_session_and_refused_ones_left_out(monkeypatch):
    """Each candidate setting is probed once, a refused one is left out (XLA would end the process on
    it), and the answer is read from the environment afterwards: what the xdist workers and commands
    inherit, so they probe nothing."""
    monkeypatch.delenv(xla_flags.CHOSEN_VARIABLE)
    probed = []
    accepts = lambda flag: probed.append(flag) or flag != "--xla_gone=false"
    candidates = ("--xla_known=0", "--xla_gone=false", "--xla_other=1")
    assert xla_flags.compile_flags(accepts, candidates) == "--xla_known=0 --xla_other=1"
    assert xla_flags.compile_flags(accepts, candidates) == "--xla_known=0 --xla_other=1"
    assert probed == list(candidates)
    assert os.environ[xla_flags.CHOSEN_VARIABLE] == "--xla_known=0 --xla_other=1"
    assert xla_flags.xla_flags(2) == "--xla_force_host_platform_device_count=2 --xla_known=0 --xla_other=1"
    monkeypatch.setenv(xla_flags.CHOSEN_VARIABLE, "")
    assert xla_flags.xla_flags(2) == "--xla_force_host_platform_device_count=2"


def test_xla_probe_tells_a_flag_xla_refuses_from_one_it_knows():
    """The real probe (two processes of ~0.15 CPU-s): a made-up flag is refused, the device count known;
    and this session runs with exactly the compile settings chosen for it."""
    assert not xla_flags.xla_accepts("--xla_elmo_jax_no_such_flag=1")
    assert xla_flags.xla_accepts("--xla_force_host_platform_device_count=2")
    assert os.environ["XLA_FLAGS"].endswith(xla_flags.xla_flags(8))


def _jax_names(tree) -> set[tuple[str, str]]:
    """(module, attribute) of every `jax.x.y` a module's AST names, through its import aliases
    (`import jax.numpy as jnp; jnp.f`, `from jax import lax; lax.f`, `from jax.sharding import X`)."""
    import ast

    aliases, names = {"jax": "jax"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name.startswith("jax.") and a.asname})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "jax":
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                names.add((node.module, a.name))
    for node in ast.walk(tree):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
            node = node.value
        if chain and isinstance(node, ast.Name) and node.id in aliases:
            dotted = [*aliases[node.id].split("."), *chain]
            names.update((".".join(dotted[:i]), dotted[i]) for i in range(1, len(dotted)))
    return names


def test_the_package_names_no_jax_api_the_running_jax_deprecates():
    """A name jax deprecates warns once per process, at whoever reads it first (orbax reads
    `jax.sharding.SingleDeviceSharding` on import, so the suite never saw checkpoint.py read it on jax
    0.12), and is an AttributeError a few releases later. Every `jax.<module>.<name>` the package writes
    is checked against the deprecation tables of the running jax; model/jax_versions.py, which names
    the old APIs behind a check of the running jax, is the exception."""
    import ast
    import importlib
    import pathlib
    import sys

    package = pathlib.Path(__file__).parents[1] / "elmo_jax"
    deprecated = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "jax_versions.py":
            continue
        for module, name in _jax_names(ast.parse(path.read_text(encoding="utf-8"))):
            try:
                owner = sys.modules.get(module) or importlib.import_module(module)
            except ImportError:  # an attribute chain, not a module (jax.Array.shape)
                continue
            if name in getattr(owner, "_deprecations", {}):
                deprecated.append(f"{path.relative_to(package.parent)}: {module}.{name}")
    assert not deprecated, deprecated


def _pyproject() -> dict:
    import pathlib
    import tomllib

    return tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_wheel_lists_every_package_and_ships_the_configs_inside_elmo_jax():
    """pyproject.toml lists the packages (packages.find cannot map configs/ to elmo_jax.configs): a package
    added under elmo_jax/ and not listed would be missing from every installed copy, and nothing at the
    top level but elmo_jax is installed (a `configs` in site-packages would collide with users' own)."""
    import pathlib

    package = pathlib.Path(__file__).parents[1] / "elmo_jax"
    found = {".".join(path.parent.relative_to(package.parent).parts) for path in package.rglob("__init__.py")} | {
        "elmo_jax.configs"
    }
    setuptools = _pyproject()["tool"]["setuptools"]
    assert set(setuptools["packages"]) == found
    assert setuptools["package-dir"] == {"elmo_jax.configs": "configs"}


def test_every_command_has_a_console_script_named_after_it():
    """Each command module (elmo_jax/NAME.py with a `__main__` block: `python -m elmo_jax.NAME`) is the
    console script elmo-NAME (dashes for underscores), which calls its `start`, as the `__main__` block does."""
    import pathlib
    import re

    package = pathlib.Path(__file__).parents[1] / "elmo_jax"
    main_block = re.compile(r'^if __name__ == "__main__":$', re.MULTILINE)
    commands = {path.stem for path in package.glob("*.py") if main_block.search(path.read_text(encoding="utf-8"))}
    expected = {f"elmo-{name.replace('_', '-')}": f"elmo_jax.{name}:start" for name in commands}
    assert _pyproject()["project"]["scripts"] == expected
    for name in commands:
        source = (package / f"{name}.py").read_text(encoding="utf-8")
        assert source.rstrip().endswith('if __name__ == "__main__":\n    start()'), name


def test_the_configs_import_from_a_clone_whose_install_the_process_has_not_seen():
    """A Colab kernel runs `pip install -e CLONE`, puts the clone on sys.path and imports `configs.notebooks`
    in the same process, which never read the editable install's import finder: there is no
    elmo_jax.configs, and the presets import their base from `configs` instead. A process with site-packages
    on its path but no .pth files read (`-S`) is that kernel."""
    import os
    import pathlib
    import site
    import subprocess
    import sys

    repo = pathlib.Path(__file__).parents[1]
    path = [str(repo), *site.getsitepackages()]
    check = (
        "import importlib.util, sys; assert importlib.util.find_spec('elmo_jax.configs') is None; "
        "from configs import notebooks, tiny; print(tiny.default.__name__, tiny.get_config().batch_size)"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", check],
        cwd=repo,
        env={"PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
    )
    assert result.stdout.split() == ["configs.default", "8"], result.stdout + result.stderr
