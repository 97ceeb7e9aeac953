"""End-to-end training: the real `trainer.train_and_evaluate(config, workdir)` on a tiny biLM and a tiny
synthetic language written to tmp_path.

The language: one or two clauses "the|a NOUN VERB [ADVERB]" joined by "and", where each noun has its own
two verbs. A biLM can learn the agreement and the clause structure, a unigram model cannot.

One uninterrupted run (`run_a`: N + M steps, a checkpoint every N) is shared by the tests that only read
its outputs; the resume, fine-tuning and baseline runs are started by the tests that need them.
"""

from __future__ import annotations

import collections
import json
import math
import os
import struct

import jax
import numpy as np
import pytest

import elmo_jax
from configs import default
from elmo_jax import trainer
from elmo_jax.training.checkpoint import Checkpoints
from elmo_jax.training.train_step import init_train_state, make_optimizer
from elmo_jax.data.training_corpus import open_training_data
from elmo_jax.formats.vocab_file import Vocab

N, M = 160, 80  # run A: N + M steps with a checkpoint every N; run B: N steps, then resumed to N + M
ATOL = 1e-5
TIMING_KEYS = ("tokens_per_s", "steps_per_s")

NOUNS = {"cat": ("meows", "purrs"), "dog": ("barks", "growls"), "cow": ("moos", "grazes"),
         "bird": ("sings", "flies")}
ADVERBS = ("loudly", "softly", "today")


def make_sentence(rng) -> str:
    words = []
    for clause in range(int(rng.integers(1, 3))):
        if clause:
            words.append("and")
        noun = str(rng.choice(list(NOUNS)))
        words += [str(rng.choice(["the", "a"])), noun, str(rng.choice(NOUNS[noun]))]
        if rng.random() < 0.5:
            words.append(str(rng.choice(ADVERBS)))
    return " ".join(words)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """{"train", "heldout": file paths, "train_sentences", "heldout_sentences", "cache_dir"}."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    sentences = {"train": [make_sentence(rng) for _ in range(300)],
                 "heldout": [make_sentence(rng) for _ in range(60)]}
    out = {"cache_dir": str(root / "prepared")}  # prepared once, shared by every run
    for split, lines in sentences.items():
        path = root / f"{split}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        out[split], out[f"{split}_sentences"] = str(path), lines
    return out


def tiny_config(corpus, **overrides):
    """configs/default.py with a tiny model and schedule; `overrides` use dotted keys ("model.lstm_dim")."""
    config = default.get_config()
    config.model.char_embed_dim = 4
    config.model.filters = [[1, 4], [2, 8], [3, 8]]
    config.model.n_highway = 1
    config.model.lstm_dim = 16
    config.model.projection_dim = 8
    config.data.train_files = corpus["train"]
    config.data.heldout_files = corpus["heldout"]
    config.data.cache_dir = corpus["cache_dir"]
    config.batch_size = 8
    config.unroll_steps = 5
    config.n_negative_samples = 8  # of a vocabulary of 22: sampling and the log-Q correction are live
    config.num_train_steps = N + M
    config.checkpoint_every_steps = N
    config.eval_every_steps = 0
    config.log_every_steps = 1
    config.update_from_flattened_dict(overrides)
    return config


def restore(workdir, config=None, step=None):
    """(TrainState on the host, data stream state) of a workdir's checkpoint (default: the newest)."""
    state, data_state, _ = trainer.restore_checkpoint(workdir, step)
    return jax.device_get(state), data_state


def read_metrics(workdir, kind="train"):
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if r.get("kind") == kind]


def without_timing(record):
    return {k: v for k, v in record.items() if k not in TIMING_KEYS}


def assert_trees_equal(a, b):
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def run_a(corpus, tmp_path_factory):
    """The uninterrupted run: N + M steps, checkpoints at N and N + M. Returns (workdir, config, final)."""
    workdir = str(tmp_path_factory.mktemp("run_a"))
    config = tiny_config(corpus)
    final = trainer.train_and_evaluate(config, workdir)
    return workdir, config, final


# ----------------------------------------------------------------------------- learning


def unigram_perplexity(train_sentences, heldout_sentences):
    """exp of the heldout cross-entropy of the training corpus' unigram distribution over the targets
    of either direction (the words and one sentence-boundary token per sentence)."""
    counts = collections.Counter()
    for s in train_sentences:
        counts.update(s.split() + ["<boundary>"])
    total = sum(counts.values())
    targets = [w for s in heldout_sentences for w in s.split() + ["<boundary>"]]
    return math.exp(-np.mean([math.log(counts[w] / total) for w in targets]))


def test_training_lowers_heldout_perplexity(run_a, corpus):
    """After N + M steps the heldout perplexity is far below the untrained model's (the same
    initialisation, evaluated on the same heldout windows) and below the unigram perplexity."""
    workdir, config, final = run_a
    data = open_training_data(config.data, workdir)
    cfg = trainer.step_config(config, len(data.vocab))
    optimizer = make_optimizer(config.learning_rate, config.adagrad_initial_accumulator, config.clip_norm)
    fresh = init_train_state(jax.random.key(config.seed), cfg, optimizer, config.batch_size)
    untrained = trainer.evaluate(fresh.params, cfg, data.heldout, data.vocab, config.batch_size)
    unigram = unigram_perplexity(corpus["train_sentences"], corpus["heldout_sentences"])

    n_targets = sum(len(s.split()) + 1 for s in corpus["heldout_sentences"])
    assert final["tokens"] == untrained["tokens"] == n_targets
    assert untrained["perplexity"] > 15.0, untrained  # about the vocabulary size (22)
    assert final["perplexity"] < 0.5 * unigram, (final, unigram)
    assert final["perplexity"] < 0.25 * untrained["perplexity"], (final, untrained)
    for direction in ("forward", "backward"):
        assert final[f"{direction}_perplexity"] < 0.6 * unigram, (final, unigram)
    # What the run returned is what its metrics file says about the same evaluation.
    (logged,) = read_metrics(workdir, "eval")
    assert logged["step"] == N + M and logged["perplexity"] == pytest.approx(final["perplexity"], rel=1e-12)


# ----------------------------------------------------------------------------- resume


def test_resume_continues_exactly_like_an_uninterrupted_run(run_a, corpus, tmp_path):
    """Run B stops after N steps and is re-run with num_train_steps = N + M in the same workdir: it
    resumes from the step-N checkpoint, logs exactly A's metrics for steps N+1..N+M and ends with
    A's state bit for bit (parameters, Adagrad accumulators, RNG, carried LSTM state, data position)."""
    workdir_a, config_a, final_a = run_a
    workdir_b = str(tmp_path / "run_b")
    trainer.train_and_evaluate(tiny_config(corpus, num_train_steps=N), workdir_b)
    assert Checkpoints(workdir_b, async_save=False).latest_step() == N
    final_b = trainer.train_and_evaluate(tiny_config(corpus), workdir_b)

    train_a, train_b = read_metrics(workdir_a), read_metrics(workdir_b)
    assert [r["step"] for r in train_b] == list(range(1, N + M + 1))
    assert [without_timing(r) for r in train_b] == [without_timing(r) for r in train_a]
    losses = [r["loss"] for r in train_a]
    assert len(set(losses[N:])) == M, "every step's loss should differ (a stuck run would compare equal)"
    assert final_b == final_a

    state_a, data_a = restore(workdir_a, config_a, step=N + M)
    state_b, data_b = restore(workdir_b, config_a, step=N + M)
    assert int(state_b.step) == N + M
    assert_trees_equal(state_a, state_b)
    assert data_a == data_b
    weights_a = elmo_jax.load_hdf5(os.path.join(workdir_a, "export", "options.json"),
                                   os.path.join(workdir_a, "export", "weights.hdf5"))
    weights_b = elmo_jax.load_hdf5(os.path.join(workdir_b, "export", "options.json"),
                                   os.path.join(workdir_b, "export", "weights.hdf5"))
    assert_trees_equal(weights_a.weights, weights_b.weights)


# ----------------------------------------------------------------------------- export


def test_export_loads_and_embeds_like_the_trained_parameters(run_a, corpus):
    """WORKDIR/export is a model directory (options.json + weights.hdf5 + vocab.txt + params.npz + the
    extractor); `load_hdf5` and `load` of it give the same ELMo vectors as the parameters of the final
    checkpoint, which are not the initial ones."""
    workdir, config, _ = run_a
    export = os.path.join(workdir, "export")
    assert sorted(os.listdir(export)) == ["USAGE.md", "extractor.jax", "manifest.json", "options.json", "params.npz",
                                          "vocab.txt", "weights.hdf5"]
    assert Vocab.load(os.path.join(export, "vocab.txt")).words == Vocab.load(os.path.join(workdir, "vocab.txt")).words
    loaded = elmo_jax.load_hdf5(os.path.join(export, "options.json"), os.path.join(export, "weights.hdf5"))
    model = trainer.model_config(config)
    for section in ("lstm", "char_cnn"):
        assert loaded.config.to_options()[section] == model.to_options()[section]

    state, _ = restore(workdir, config)
    assert int(state.step) == N + M
    trained = elmo_jax.BiLMParams(weights=state.params["bilm"], config=model)
    sentences = [s.split() for s in corpus["heldout_sentences"][:4]] + [["a", "zebra", "dances"], []]
    ids = elmo_jax.batch_to_ids(sentences)
    got, mask = elmo_jax.embed(loaded, ids)
    want, want_mask = elmo_jax.embed(trained, ids)
    np.testing.assert_array_equal(np.asarray(mask), np.asarray(want_mask))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=ATOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(elmo_jax.embed(elmo_jax.load(export), ids)[0]), np.asarray(got))

    initial = elmo_jax.init_params(model, jax.random.split(jax.random.key(config.seed), 3)[0])
    untrained, _ = elmo_jax.embed(initial, ids)
    assert np.max(np.abs(np.asarray(untrained) - np.asarray(want))) > 0.1, "the export must hold trained weights"


# ----------------------------------------------------------------------------- logs


def read_tensorboard_scalars(directory):
    """{tag: {step: value}} from the TFRecord event files under `directory`."""
    from tensorboardX.proto import event_pb2

    scalars = collections.defaultdict(dict)
    files = [os.path.join(root, f) for root, _, names in os.walk(directory) for f in names if "tfevents" in f]
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        offset = 0
        while offset < len(data):  # record: u64 length, u32 crc, payload, u32 crc
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars[value.tag][event.step] = value.simple_value
    return files, scalars


def test_metrics_jsonl_and_tensorboard(run_a):
    """metrics.jsonl: one JSON object per logged step (every step here) with step and a finite loss,
    plus the final evaluation; TensorBoard event files under WORKDIR/tensorboard hold the same losses."""
    workdir, _, _ = run_a
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]  # every line is one JSON object
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, N + M + 1))
    for r in train:
        assert isinstance(r["loss"], float) and math.isfinite(r["loss"])
        assert {"forward_loss", "backward_loss", "grad_norm", "tokens"} <= set(r)
        assert r["loss"] == pytest.approx((r["forward_loss"] + r["backward_loss"]) / 2, rel=1e-6)
    assert [r["kind"] for r in records].count("eval") == 1

    files, scalars = read_tensorboard_scalars(os.path.join(workdir, "tensorboard"))
    assert files, "no TensorBoard event file"
    assert sorted(scalars["train/loss"]) == list(range(1, N + M + 1))
    for r in train:
        assert scalars["train/loss"][r["step"]] == pytest.approx(r["loss"], rel=1e-6)
    assert N + M in scalars["eval/perplexity"]


# ----------------------------------------------------------------------------- fine-tuning


def test_init_from_workdir_keeps_the_softmax_and_export_starts_a_fresh_one(run_a, corpus, tmp_path):
    """A run started from run A's workdir (same vocabulary) begins with A's final biLM and softmax; one
    started from A's export begins with A's biLM and the fresh softmax of a new run. Learning rate 0
    keeps the initial parameters in the step-1 checkpoint. The step-1 loss (computed before the update)
    shows the head start: the same seed gives the same first batch as run A's from-scratch step 1."""
    workdir_a, config_a, _ = run_a
    state_a, _ = restore(workdir_a, config_a)
    steps = dict(num_train_steps=1, checkpoint_every_steps=1, learning_rate=0.0)

    from_workdir = str(tmp_path / "from_workdir")
    trainer.train_and_evaluate(tiny_config(corpus, init_from=workdir_a, **steps), from_workdir)
    state_w, _ = restore(from_workdir, config_a)
    assert_trees_equal(state_w.params, state_a.params)
    loss_a, loss_w = read_metrics(workdir_a)[0]["loss"], read_metrics(from_workdir)[0]["loss"]
    assert loss_w < loss_a - 1.0, (loss_w, loss_a)

    from_export = str(tmp_path / "from_export")
    trainer.train_and_evaluate(tiny_config(corpus, init_from=os.path.join(workdir_a, "export"), **steps), from_export)
    state_e, _ = restore(from_export, config_a)
    assert_trees_equal(state_e.params["bilm"], state_a.params["bilm"])
    cfg = trainer.step_config(config_a, len(Vocab.load(os.path.join(workdir_a, "vocab.txt"))))
    optimizer = make_optimizer(config_a.learning_rate, config_a.adagrad_initial_accumulator, config_a.clip_norm)
    fresh = init_train_state(jax.random.key(config_a.seed), cfg, optimizer, config_a.batch_size)
    assert_trees_equal(state_e.params["softmax"], fresh.params["softmax"])
    assert np.max(np.abs(np.asarray(fresh.params["softmax"]["W"]) - np.asarray(state_a.params["softmax"]["W"]))) > 0.1
