"""`elmo_jax.ablate`: the paper's layer ablation and sample-efficiency sweep, on hand-made labelled targets
and the tiny fixture biLM (random weights: its layers differ by context but know nothing, so these tests
check the machinery and the task model's learning, not ELMo's value; probes/README.md has the figures)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import elmo_jax
from elmo_jax.analysis import ablation, ablation_model
from elmo_jax.analysis.ablation_model import Variant
from elmo_jax.analysis.probe_data import ProbeItem
from elmo_jax.features import mix
from tests.support.commands import error_line
from tests.support.inprocess import run_in_process
from tests.support.probe_items import item, write_targets

FILLERS = ["river", "money", "cat", "tree", "song", "red", "old", "blue", "sun", "ship", "stone", "sky"]


# The label of "x" is its left neighbour's letter; test sentences end in fillers never seen in training.
TRAIN = [item(f"{first} x {w} now", 1, first.upper()) for w in FILLERS[:8] for first in ("a", "b", "c")]
TEST = [item(f"{first} x {w} now", 1, first.upper()) for w in FILLERS[8:] for first in ("a", "b", "c")]


def test_task_data_holds_each_slots_layers_and_word_ids(tiny_params):
    """The three slots of a target are the biLM's vectors of the word before it, its span (the mean)
    and the word after it, from `embed` of its sentence alone; outside the sentence, zeros. Word ids
    come from the training items' lowercased words (0: unknown or padding)."""
    train = [ProbeItem(("The", "river", "bank", "rose"), 1, 3, "PLACE", "river bank")]
    test = [ProbeItem(("bank", "Zebra"), 0, 1, "PLACE", "bank")]
    data = ablation.task_data(tiny_params, train + test, 1)
    layers = [
        np.asarray(elmo_jax.embed(tiny_params, elmo_jax.batch_to_ids([list(i.tokens)]))[0][0]) for i in (train + test)
    ]
    atol = 1e-6 * max(1.0, float(np.abs(layers[0]).max()))  # a different batch shape: float32 rounding
    np.testing.assert_allclose(data.elmo[0, 0], layers[0][:, 0], rtol=0, atol=atol)
    np.testing.assert_allclose(data.elmo[0, 1], layers[0][:, 1:3].mean(axis=1), rtol=0, atol=atol)
    np.testing.assert_allclose(data.elmo[0, 2], layers[0][:, 3], rtol=0, atol=atol)
    assert not data.elmo[1, 0].any()  # nothing before the test target
    np.testing.assert_allclose(data.elmo[1, 2], layers[1][:, 1], rtol=0, atol=atol)
    vocabulary = {"bank": 1, "river": 2, "rose": 3, "the": 4}  # sorted training words, from 1
    assert data.words[0, :, :3].tolist() == [[4, 0, 0], [2, 1, 0], [3, 0, 0]]
    assert data.words[1, :, :2].tolist() == [[0, 0], [vocabulary["bank"], 0], [0, 0]]  # zebra: unknown
    assert data.vocabulary_size == 5 and data.labels.tolist() == [0, 0]
    assert data.word_of_target.tolist() == [0, -1]  # "bank" was never a training target's word


@pytest.fixture(scope="module")
def task(tiny_params) -> ablation_model.TaskData:
    return ablation.task_data(tiny_params, TRAIN + TEST, len(TRAIN))


def test_the_baseline_learns_a_label_its_window_shows(task):
    """The left neighbour decides the label: the word-vector baseline must get every test item right
    (sentences it never saw), which one update does not."""
    data = task
    fit, dev, test = np.arange(0, 21), np.arange(21, 24), np.arange(24, 36)
    baseline = Variant("baseline", None)
    run = ablation_model.train_task_model(data, baseline, fit, dev, test, seed=0, max_updates=50)
    assert run.test_accuracy == 1.0, run.curve
    again = ablation_model.train_task_model(data, baseline, fit, dev, test, seed=0, max_updates=50)
    assert again == run  # seeded: the same figures again
    assert [p[0] for p in run.curve] == list(range(25, 25 * len(run.curve) + 1, 25))  # every EVAL_EVERY updates
    assert run.layer_weights == [] and run.gamma == 0.0
    once = ablation_model.train_task_model(data, baseline, fit, dev, test, seed=0, max_updates=1)
    assert once.curve == [(1, once.curve[0][1], once.test_accuracy)] and once.test_accuracy < 1.0


def test_the_l2_penalty_is_added_to_the_loss_of_a_learned_mix_only(task):
    """The paper's `lambda * ||s||^2` on the mix's weights before the softmax (s = 0 is the average): the
    loss with the penalty minus the loss without it is lambda * sum(s^2), for the learned mix alone."""
    data = task
    arrays, batch = ablation_model.device_arrays(data), np.arange(0, 24)
    for layers in ("learned", "average"):
        params = ablation_model.init_params(jax.random.key(0), data, Variant(layers, layers))
        params["s"] = np.array([0.5, -0.25, 2.0], np.float32)
        with_l2, without = (
            float(ablation_model.task_loss(params, arrays, batch, Variant(layers, layers, l2=l2))) for l2 in (0.01, 0.0)
        )
        expected = 0.01 * (0.25 + 0.0625 + 4.0) if layers == "learned" else 0.0
        assert with_l2 - without == pytest.approx(expected, rel=0, abs=4 * 2**-24 * max(1.0, with_l2)), layers


def test_the_task_models_mix_and_penalty_are_the_librarys(task, monkeypatch):
    """The ablation measures the library's task API (issue #49: its task model had its own copy of the
    mix): each variant's loss mixes the batch's slots (B, L+1, 3, D) with `features.mix.scalar_mix`,
    adds `mix_l2_penalty` of the trained s, and reports `mix_weights`. A fixed variant's scalars
    normalise (NumPy's softmax, float64) to exactly its weights; a learned one's are the trained s."""
    seen = {}

    def spy(name):
        real = getattr(mix, name)

        def called(*args):
            seen.setdefault(name, []).append(args)
            return real(*args)

        monkeypatch.setattr(mix, name, called)

    for name in ("scalar_mix", "mix_l2_penalty", "mix_weights"):
        spy(name)
    data, batch, n = task, np.arange(0, 24), task.elmo.shape[2]
    arrays, s = ablation_model.device_arrays(data), np.array([0.5, -0.25, 2.0], np.float32)
    fixed = {"token": np.eye(n)[0], "top": np.eye(n)[-1], "average": np.full(n, 1 / n), "learned": None}
    for layers, weights in fixed.items():
        seen.clear()
        variant = Variant(layers, layers, l2=0.01)
        params = ablation_model.init_params(jax.random.key(0), data, variant) | {"s": s, "gamma": np.float32(1.5)}
        ablation_model.task_loss(params, arrays, batch, variant)
        assert {"scalar_mix", "mix_l2_penalty"} <= set(seen), (layers, sorted(seen))
        [(mixed, scalars, gamma)], [(penalised, coef)] = seen["scalar_mix"], seen["mix_l2_penalty"]
        np.testing.assert_array_equal(mixed, np.swapaxes(data.elmo[batch], 1, 2))
        assert float(gamma) == 1.5
        scalars = np.asarray(scalars, np.float64)
        if weights is None:
            np.testing.assert_array_equal(scalars, s)
        else:
            np.testing.assert_array_equal(
                np.exp(scalars - scalars.max()) / np.exp(scalars - scalars.max()).sum(), weights
            )
        np.testing.assert_array_equal(penalised, s)
        assert np.float32(coef) == np.float32(0.01 if layers == "learned" else 0.0), layers
        seen.clear()
        ablation_model.layer_weights(params, ablation_model.mix_settings(variant, n))
        assert [np.asarray(args[0]).tolist() for args in seen.get("mix_weights", [])] == [scalars.tolist()], layers


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--variants=baseline,best"], "--variants: expected some of baseline,token"),
        (["--seeds=0"], "--seeds must be at least 1"),
        (["--fractions=0,1"], "--fractions must be in (0, 1]"),
        (["--fractions=half"], "--fractions must be numbers"),
        (["--max_updates=0"], "--max_updates must be at least 1"),
    ],
    ids=["variant", "seeds", "fraction_zero", "fraction_text", "updates"],
)
def test_bad_settings_are_refused_naming_the_flag_before_anything_is_read(fixture_dir, tmp_path, args, expected):
    model = [f"--options={fixture_dir / 'options.json'}", f"--weights={fixture_dir / 'weights.hdf5'}"]
    missing = tmp_path / "none.jsonl"  # never read: the settings are checked first
    result = run_in_process("elmo_jax.ablate", *model, f"--train={missing}", f"--test={missing}", *args)
    error_line(result, expected)


@pytest.mark.slow
def test_the_command_runs_every_variant_and_writes_well_formed_results(fixture_dir, tmp_path):
    """Every variant and the sweep, 2 seeds: the tables printed, the JSON and the plot written; the layer
    weights are what each variant says (learned ones sum to 1 and moved); the sweep's 100% row is the
    variant's own runs. (Its real process: the bad-input catalogue's ablate case.)"""
    model = [f"--options={fixture_dir / 'options.json'}", f"--weights={fixture_dir / 'weights.hdf5'}"]
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_targets(train, TRAIN)
    write_targets(test, TEST)
    small = ["--seeds=2", "--fractions=0.25,1", "--max_updates=40"]
    outputs = [f"--output={tmp_path / 'a.json'}", f"--plot={tmp_path / 'a.png'}"]
    result = run_in_process("elmo_jax.ablate", *model, f"--train={train}", f"--test={test}", *small, *outputs)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| learned_l2 |" in result.stdout and "| 25% (6) |" in result.stdout, result.stdout
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    results = json.loads((tmp_path / "a.json").read_text())
    assert list(results["variants"]) == ["baseline", "token", "top", "average", "learned", "learned_l2"]
    for name, summary in results["variants"].items():
        assert len(summary["test"]) == 2 and all(0.0 <= s <= 1.0 for s in summary["test"]), name
        assert summary["mean"] == pytest.approx(np.mean(summary["test"]))
        assert summary["std"] == pytest.approx(np.std(summary["test"]))
    weights = {name: s.get("layer_weights") for name, s in results["variants"].items()}
    assert weights["baseline"] is None
    assert weights["token"] == [1.0, 0.0, 0.0] and weights["top"] == [0.0, 0.0, 1.0]
    assert weights["average"] == pytest.approx([1 / 3] * 3)
    for name in ("learned", "learned_l2"):
        assert sum(weights[name]) == pytest.approx(1.0) and weights[name] != pytest.approx([1 / 3] * 3, abs=1e-6)
    sweep = results["sample_efficiency"]
    assert list(sweep) == ["baseline", "learned_l2"] and all(list(s) == ["0.25", "1.0"] for s in sweep.values())
    assert sweep["baseline"]["0.25"]["items"] == 6 and sweep["baseline"]["1.0"]["items"] == 24
    assert sweep["baseline"]["1.0"]["test"] == results["variants"]["baseline"]["test"]  # the same runs
    for runs in sweep.values():
        for summary in runs.values():
            updates = [point[0] for point in summary["curve"]]
            assert updates == sorted(set(updates)) and updates[-1] <= 40
    assert results["counts"] == {"train": 24, "test": 12, "labels": 3, "seeds": 2}

    again = run_in_process("elmo_jax.ablate", *model, f"--train={train}", f"--test={test}", *small, outputs[0])
    error_line(again, "a.json", "already exists")
    unseen = tmp_path / "unseen.jsonl"
    write_targets(unseen, [item("d x", 1, "D")])
    error_line(
        run_in_process("elmo_jax.ablate", *model, f"--train={train}", f"--test={unseen}", *small),
        "1 test labels have no training item",
    )
