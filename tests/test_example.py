"""examples/replaced_token_detection.py runs end to end (a few steps, the fixture's tiny biLM) and its CLI
reports bad flags in one line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.commands import error_line, run_command

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "replaced_token_detection.py"


def _load_example():
    """The example as a module (registered, as dataclasses need; loaded once)."""
    name = "examples_replaced_token_detection"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_corruption_and_split():
    """Replaced tokens differ from the originals and are labelled; the split is by sentence text."""
    example = _load_example()
    rng = np.random.default_rng(0)
    sentences = [[f"w{i}", "the", f"x{i % 7}", "."] for i in range(200)]
    train, test = example.split_by_hash(sentences, 0.25)
    assert 20 < len(test) < 80 and len(train) + len(test) == 200
    assert not {" ".join(s) for s in train} & {" ".join(s) for s in test}
    pool = np.array([w for s in train for w in s])
    data = example.corrupt(train, 3, pool, 0.3, rng)
    assert len(data.sentences) == 3 * len(train)
    changed = np.concatenate([np.array(c) != np.array(o) for c, o in zip(data.sentences, train * 3)])
    labels = np.concatenate(data.labels)
    np.testing.assert_array_equal(changed, labels == 1)
    assert 0.2 < labels.mean() < 0.4


@pytest.mark.slow
def test_runs_end_to_end_on_a_tiny_bilm(tmp_path, fixture_dir):
    example = _load_example()
    rng = np.random.default_rng(1)
    words = ["the", "a", "river", "bank", "money", "flows", "holds", "into", "of", "water", "."]
    text = tmp_path / "heldout.txt"
    text.write_text(
        "\n".join(" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(60)) + "\n", encoding="utf-8"
    )
    settings = example.Settings(
        bilm_dir=str(fixture_dir), text=str(text), steps=3, batch_size=8, train_copies=1, test_copies=1
    )
    results = example.run(settings)
    assert [r["model"] for r in results] == ["words only", "words + ELMo"]
    for r in results:
        assert 0.0 <= r["f1"] <= 1.0 and 0.0 <= r["accuracy"] <= 1.0 and r["test_tokens"] > 0
        assert np.isfinite(r["final_train_loss"])


def test_cli_errors_are_one_line(tmp_path):
    result = run_command(str(EXAMPLE), f"--biLM={tmp_path / 'missing'}")
    assert error_line(result) == (
        f"error: --biLM: {tmp_path / 'missing'} is not a directory "
        "(expected WORKDIR/export with options.json and weights.hdf5)"
    )
