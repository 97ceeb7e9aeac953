"""`elmo_jax.probe`: per-layer nearest-neighbour and linear probes, on hand-checkable data and the tiny
fixture biLM (random weights, so the contextual layers differ by context but know nothing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from elmo_jax.analysis import probing
from elmo_jax.analysis.probe_data import ProbeItem, read_probe_file
from tests.support.commands import error_line, run_command
from tests.support.inprocess import run_in_process
from tests.support.probe_items import item, write_targets

# The label of "x" is its left neighbour: a context-free vector cannot tell, a contextual one can.
FILLERS = ["river", "money", "cat", "tree", "song", "red", "old", "blue"]
TRAIN = [item(f"{first} x {w}", 1, first.upper()) for w in FILLERS for first in ("a", "b")]


def test_the_token_layer_must_fail_where_a_contextual_layer_can_succeed(tiny_params):
    """Test items are training sentences: a layer that separates the contexts gets each nearest
    neighbour exactly (cosine 1), while "x" has one vector in the token layer, so both classifiers see
    identical inputs for both labels and score exactly chance (the nearest-neighbour ties go to the
    first training item, the linear classifier predicts one class)."""
    results = probing.probe(tiny_params, TRAIN, TRAIN)
    layers = results["layers"]
    assert list(layers) == ["token", "lstm_1", "lstm_2", "mix"]
    assert layers["token"] == {"nearest_neighbour": 0.5, "linear": 0.5}
    for name in ("lstm_1", "lstm_2"):
        assert layers[name]["nearest_neighbour"] == 1.0, (name, layers[name])
    assert results["baselines"] == {"majority": 0.5, "per_word": 0.5}
    assert results["counts"] == {"train": 16, "test": 16, "labels": 2, "test_unseen_words": 0}
    assert np.isclose(sum(results["mix_weights"]), 1.0)


def test_baselines_and_the_back_off_for_unseen_words_are_the_hand_counts(tiny_params):
    """Majority: A (9 of the 17 training labels). Per word: x was seen 8 times with each label (a tie
    goes to the first label, A), zebra never (majority, A). The 1-NN backs off to the majority for the
    unseen word too: its layers can only differ from the token layer's on the x items."""
    test = [item(f"{first} x {w}", 1, first.upper()) for w in ("sun", "ship", "stone") for first in ("a", "b")]
    test += [item("a zebra", 1, "A")]
    results = probing.probe(tiny_params, TRAIN + [item("a y", 1, "A")], test)
    assert results["baselines"] == {"majority": 4 / 7, "per_word": 4 / 7}
    assert results["counts"] == {"train": 17, "test": 7, "labels": 2, "test_unseen_words": 1}
    assert results["layers"]["token"]["nearest_neighbour"] == 4 / 7  # x: the first training item's A; zebra: A
    for scores in results["layers"].values():
        assert all(0.0 <= value <= 1.0 for value in scores.values())


def test_probe_files_jsonl_and_conll(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(
        json.dumps({"tokens": ["the", "river", "bank"], "target": [1, 3], "label": "PLACE"}) + "\n\n", encoding="utf-8"
    )
    assert read_probe_file(jsonl) == [ProbeItem(("the", "river", "bank"), 1, 3, "PLACE", "river bank")]
    conll = tmp_path / "a.conll"
    conll.write_text("The\tDET\nbank\tNOUN\n\nRun\tVERB\textra column\n", encoding="utf-8")
    assert [(i.tokens, i.start, i.label, i.word) for i in read_probe_file(conll)] == [
        (("The", "bank"), 0, "DET", "the"),
        (("The", "bank"), 1, "NOUN", "bank"),
        (("Run",), 0, "VERB", "run"),
    ]


@pytest.mark.parametrize(
    "content, name, expected",
    [
        ('{"tokens": ["a", "b"], "target": 2, "label": "X"}\n', "t.jsonl", 't.jsonl:1: "target" 2 is outside'),
        ('{"tokens": ["a"], "target": 0}\n', "t.jsonl", 't.jsonl:1: expected an object with "tokens"'),
        ("", "t.jsonl", "t.jsonl: no probe items"),
        ("word\n", "t.conll", "t.conll:1: expected TOKEN<TAB>LABEL"),
    ],
    ids=["target_outside", "no_label", "empty", "conll_without_label"],
)
def test_bad_probe_files_are_named(tmp_path, content, name, expected):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=expected.replace("(", r"\(")):
        read_probe_file(path)


def test_a_test_label_without_training_item_is_refused(tiny_params):
    with pytest.raises(ValueError, match=r"1 test labels have no training item \(e.g. 'C'\)"):
        probing.probe(tiny_params, TRAIN, [item("c x", 1, "C")])


@pytest.mark.slow
def test_the_command_prints_the_table_and_reports_bad_input_in_one_line(fixture_dir, tmp_path):
    model = [f"--options={fixture_dir / 'options.json'}", f"--weights={fixture_dir / 'weights.hdf5'}"]
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_targets(train, TRAIN)
    write_targets(test, [item("a x cat", 1, "A")])
    result = run_command(
        "elmo_jax.probe",
        *model,
        f"--train={train}",
        f"--test={test}",
        f"--output={tmp_path / 'r.json'}",
        f"--plot={tmp_path / 'r.png'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| token |" in result.stdout and "| lstm_2 |" in result.stdout
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["test"] == 1
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"tokens": ["a"], "target": 3, "label": "A"}) + "\n", encoding="utf-8")
    error_line(run_in_process("elmo_jax.probe", *model, f"--train={train}", f"--test={bad}"), "bad.jsonl:1", "outside")
    error_line(
        run_in_process(
            "elmo_jax.probe", *model, f"--train={train}", f"--test={test}", f"--output={tmp_path / 'r.json'}"
        ),
        "already exists",
    )
