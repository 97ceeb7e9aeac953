"""docs/API.md is what docs/make_api.py generates from the current docstrings, and covers the API."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import elmo_jax

ROOT = Path(__file__).resolve().parents[1]


def _make_api():
    spec = importlib.util.spec_from_file_location("docs_make_api", ROOT / "docs" / "make_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_api_md_is_up_to_date():
    committed = (ROOT / "docs" / "API.md").read_text(encoding="utf-8")
    assert committed == _make_api().render(), "docs/API.md is stale: run python docs/make_api.py and commit it"


def test_every_public_name_and_cli_is_documented():
    text = _make_api().render()
    for name in elmo_jax.__all__:
        assert f"\n### {name}\n" in text, name
        assert "*(no docstring)*" not in text.split(f"\n### {name}\n", 1)[1].split("\n### ", 1)[0], (
            f"elmo_jax.{name} has no docstring"
        )
    for command in ("python train.py", "python -m elmo_jax.export", "python -m elmo_jax.embed_file"):
        assert f"### `{command}`" in text
    assert "| `--workdir` |" in text and "| `--output` |" in text


def test_check_mode_fails_on_a_stale_file(tmp_path, monkeypatch):
    make_api = _make_api()
    stale = tmp_path / "API.md"
    stale.write_text("# old\n", encoding="utf-8")
    monkeypatch.setattr(make_api, "OUTPUT", stale)
    assert make_api.main(["--check"]) == 1
    assert make_api.main(["--bogus"]) == 1
    assert stale.read_text(encoding="utf-8") == "# old\n"
