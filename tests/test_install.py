"""The package as a user installs it, away from the repository (issue #52): a wheel built from the
checkout, installed into a fresh virtualenv in a temporary directory, answers `--help` of every console
script and trains a config named by name to an exported model, run from a directory outside the clone.

Nothing is downloaded: the wheel is built with the running environment's setuptools (no build isolation)
from a copy of the files it packages (an in-tree build would leave build/ in the checkout, whose stale
files setuptools packages again), and the new virtualenv borrows the running one's dependencies through
a .pth file. A directory a .pth file names is added to sys.path without its own .pth files being read,
so the checkout's editable install (a .pth and its import finder in the running site-packages) stays
off: `elmo_jax` can only come from the wheel, which the test checks.
"""

from __future__ import annotations

import importlib
import os
import resource
import shutil
import site
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from tests.support.commands import REPO, command_env, error_line
from tests.support.configs import tiny_flags

# What the wheel is built from (pyproject.toml's packages, package-dir, readme and license-files).
PACKAGED = ("pyproject.toml", "README.md", "LICENSE", "elmo_jax", "configs")


def scripts() -> dict[str, str]:
    """pyproject.toml's console scripts: name -> "module:function"."""
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]


def build_wheel(tmp_path: Path) -> tuple[Path, str]:
    """(the wheel, pip's build output) of a copy of the checkout's packaged files."""
    source = tmp_path / "source"
    source.mkdir()
    for name in PACKAGED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run([*pip, "-w", tmp_path / "wheels", source], env=_pip_env(), capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("elmo_jax-*.whl")
    return wheel, built.stdout + built.stderr


def fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new virtualenv holding the wheel, reading the running environment's site-packages for the rest."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    own = Path(sysconfig.get_path("purelib", vars={"base": venv, "platbase": venv}))
    (own / "running_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel]
    installed = subprocess.run(pip, env=_pip_env(), capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return venv


def _pip_env() -> dict[str, str]:
    return {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1"}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.slow
def test_a_wheel_installed_outside_the_clone_runs_every_command(tmp_path, corpus):
    """~15-20 CPU-s (14.9 and 19.8 measured, 2-core CPU): the build and install, a --help per script (~0.3 each), two
    refused configs (a name it does not ship; a shipped file read by path, with a key it does not have),
    and one training run of configs/tiny.py named by name, two steps, exported, then embedded from."""
    wheel, build_output = build_wheel(tmp_path)
    assert "SetuptoolsDeprecationWarning" not in build_output, build_output  # e.g. a `license` table
    venv = fresh_venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in command_env().items() if k != "PYTHONPATH"}

    def run(*argv) -> subprocess.CompletedProcess:
        command = [venv / "bin" / argv[0], *(str(a) for a in argv[1:])]
        return subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    where = run("python", "-c", "import elmo_jax, elmo_jax.configs; print(elmo_jax.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr
    assert not Path(where.stdout.strip()).is_relative_to(REPO)
    for script, target in scripts().items():
        result = run(script, "--help")
        assert result.returncode == 0, (script, result.stderr[-2000:])
        usage = importlib.import_module(target.split(":")[0])
        assert result.stdout.startswith(usage.__doc__.splitlines()[0]), (script, result.stdout[:300])

    workdir = tmp_path / "run"
    args = tiny_flags(corpus, workdir, num_train_steps=2, checkpoint_every_steps=2)[1:]
    error_line(run("elmo-train", "--config=tiny_x", *args), "--config=tiny_x", "bilm_large, ", ", tiny")
    shipped = Path(where.stdout.strip()).parent / "configs" / "tiny.py"
    error_line(run("elmo-train", f"--config={shipped}", *args, "--config.bogus=1"), "--config.bogus: unknown")
    cpu = _cpu_seconds()
    trained = run("elmo-train", "--config=tiny", *args)
    assert trained.returncode == 0, trained.stderr[-5000:]
    assert (workdir / "export" / "manifest.json").is_file()
    embedded = run("elmo-embed-text", f"--model={workdir / 'export'}", "the cat sat .")
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    # 4 tokens, the 3 layers of a biLM of projection 8 (configs/tiny.py): the model the run exported.
    assert "layers float32 (1, 3, 4, 16)" in embedded.stdout, embedded.stdout[:500]
    print(f"training and embedding outside the clone: {_cpu_seconds() - cpu:.1f} CPU-s")
