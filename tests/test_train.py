"""End-to-end training: the real `loop.train_and_evaluate(config, workdir)` on configs/tiny.py and the
agreement language of tests/support/corpora.py.

The session's uninterrupted run (`trained_run`: N + M steps, a checkpoint every N) is shared by the tests
that only read its outputs; the resume, fine-tuning and baseline runs are started by the tests that need
them.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import struct

import jax
import numpy as np
import pytest

import elmo_jax
from configs import tiny
from elmo_jax.data.training_corpus import open_training_data
from elmo_jax.formats import extractor
from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.model import distinct_tokens
from elmo_jax.training import heldout, loop, settings, sharding, start, workdir_copy
from elmo_jax.training.checkpoint import Checkpoints
from elmo_jax.training.jitted_steps import jit_steps
from elmo_jax.training.train_step import init_train_state
from elmo_jax.training.weight_average import model_params
from tests.support.compare import TRAINING_EXPORT_FILES, assert_trees_equal, read_metrics, restored, without_timing
from tests.support.configs import TRAINED_STEPS, with_overrides

N, M = TRAINED_STEPS  # the trained run: N + M steps with a checkpoint every N; run B: N steps, then resumed
ATOL = 1e-5


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


def test_training_lowers_heldout_perplexity(trained_run, corpus):
    """After N + M steps the heldout perplexity is far below the untrained model's (the same
    initialisation, evaluated on the same heldout windows) and below the unigram perplexity."""
    workdir, config, final = trained_run.workdir, trained_run.config, trained_run.final
    data = open_training_data(config.data, workdir)
    cfg = settings.step_config(config, len(data.vocab))
    optimizer = settings.optimizer(config)
    fresh = init_train_state(jax.random.key(config.seed), cfg, optimizer, config.batch_size)
    untrained = heldout.heldout_perplexity(fresh.params, cfg, data.heldout, data.vocab, config.batch_size)
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


@pytest.mark.slow
def test_resume_continues_exactly_like_an_uninterrupted_run(trained_run, corpus, tmp_path, caplog):
    """Run B stops after N steps and is re-run with num_train_steps = N + M in the same workdir: it
    resumes from the step-N checkpoint, logs exactly A's metrics for steps N+1..N+M and ends with
    A's state bit for bit (parameters, Adagrad accumulators, RNG, carried LSTM state, data position).
    Its log says when the step is compiled for a new character-width bucket (once per bucket), how far
    an evaluation is, and puts the heldout perplexity beside a uniform guess's."""
    workdir_a, config_a, final_a = trained_run.workdir, trained_run.config, trained_run.final
    workdir_b = str(tmp_path / "run_b")
    with caplog.at_level(logging.INFO, logger="absl"):
        loop.train_and_evaluate(with_overrides(config_a, num_train_steps=N), workdir_b)
    # "... tokens of up to W characters (..., up to S of each device's N tokens distinct): ..."
    compiles = [r.getMessage().split(" distinct)")[0] for r in caplog.records if "compiling the training" in r.msg]
    assert compiles and len(compiles) == len(set(compiles)), compiles  # each pair of buckets once
    widths = extractor.content_buckets(config_a.model.max_characters_per_token)
    assert len(compiles) <= len(widths) * distinct_tokens.CAPACITY_STEPS
    assert Checkpoints(workdir_b, async_save=False).latest_step() == N
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"), pytest.MonkeyPatch.context() as patch:
        patch.setattr(heldout, "PROGRESS_EVERY_S", 0.0)  # a progress line per window of the evaluation
        final_b = loop.train_and_evaluate(config_a, workdir_b)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("evaluating heldout: 1 windows, ") for m in messages)
    vocab_size = len(Vocab.load(os.path.join(workdir_b, "vocab.txt")))
    final_lines = [m for m in messages if m.startswith(f"heldout after step {N + M}:")]
    assert len(final_lines) == 1 and f"and {vocab_size} for a uniform guess" in final_lines[0], final_lines
    assert f"against {final_b['unigram_perplexity']:.2f} for a unigram model" in final_lines[0], final_lines

    train_a, train_b = read_metrics(workdir_a), read_metrics(workdir_b)
    assert [r["step"] for r in train_b] == list(range(1, N + M + 1))
    assert [without_timing(r) for r in train_b] == [without_timing(r) for r in train_a]
    losses = [r["loss"] for r in train_a]
    assert len(set(losses[N:])) == M, "every step's loss should differ (a stuck run would compare equal)"
    assert final_b == final_a

    state_a, data_a = restored(workdir_a, step=N + M)
    state_b, data_b = restored(workdir_b, step=N + M)
    assert int(state_b.step) == N + M
    assert_trees_equal(state_a, state_b)
    assert data_a == data_b
    weights_a = elmo_jax.load_hdf5(
        os.path.join(workdir_a, "export", "options.json"), os.path.join(workdir_a, "export", "weights.hdf5")
    )
    weights_b = elmo_jax.load_hdf5(
        os.path.join(workdir_b, "export", "options.json"), os.path.join(workdir_b, "export", "weights.hdf5")
    )
    assert_trees_equal(weights_a.weights, weights_b.weights)


# ----------------------------------------------------------------------------- export


def test_export_loads_and_embeds_like_the_trained_parameters(trained_run, corpus):
    """WORKDIR/export is a model directory (options.json + weights.hdf5 + vocab.txt + params.npz + the
    extractor); `load_hdf5` and `load` of it give the same ELMo vectors as the parameters of the final
    checkpoint, which are not the initial ones."""
    workdir, config = trained_run.workdir, trained_run.config
    export = os.path.join(workdir, "export")
    assert sorted(os.listdir(export)) == TRAINING_EXPORT_FILES
    assert Vocab.load(os.path.join(export, "vocab.txt")).words == Vocab.load(os.path.join(workdir, "vocab.txt")).words
    loaded = elmo_jax.load_hdf5(os.path.join(export, "options.json"), os.path.join(export, "weights.hdf5"))
    model = settings.model_config(config)
    for section in ("lstm", "char_cnn"):
        assert loaded.config.to_options()[section] == model.to_options()[section]

    state, _ = restored(workdir)
    assert int(state.step) == N + M
    trained = elmo_jax.BiLMParams(weights=model_params(state)["bilm"], config=model)  # the weights' average
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


def test_metrics_jsonl_and_tensorboard(trained_run):
    """metrics.jsonl: one JSON object per logged step (every step here) with step and a finite loss,
    plus the final evaluation; TensorBoard event files under WORKDIR/tensorboard hold the same losses."""
    workdir = trained_run.workdir
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


def initial_state(config, workdir):
    """The state a run of `config` in a new `workdir` starts from (`start.resume_or_start`), on the host."""
    os.makedirs(workdir)
    data = open_training_data(config.data, workdir)
    cfg = settings.step_config(config, len(data.vocab))
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
    steps = jit_steps(mesh, cfg, settings.optimizer(config), config.batch_size)
    checkpoints = Checkpoints(workdir, async_save=False)
    try:
        meta = start.run_meta(config, cfg, data.vocab)
        state, _, _ = start.resume_or_start(config, cfg, data.vocab, steps, checkpoints, meta)
    finally:
        checkpoints.close()
    return jax.device_get(state)


def test_init_from_workdir_keeps_the_softmax_and_export_starts_a_fresh_one(trained_run, tmp_path, caplog):
    """A run started from run A's workdir (same vocabulary) begins with A's final biLM and softmax; one
    started from A's export begins with A's biLM and the fresh softmax of a new run. The first step's
    loss (computed before its update) shows the head start: the same seed gives the same first batch
    as run A's from-scratch step 1."""
    workdir_a, config_a = trained_run.workdir, trained_run.config
    state_a, _ = restored(workdir_a)

    from_workdir = with_overrides(config_a, init_from=workdir_a, num_train_steps=1, checkpoint_every_steps=1)
    state_w = initial_state(from_workdir, str(tmp_path / "w0"))
    assert_trees_equal(state_w.params, model_params(state_a))  # the model A stands for: its weight average
    assert_trees_equal(state_w.opt_state, state_a.opt_state)  # Adagrad's accumulators continue (restart.py)
    assert int(state_w.step) == 0
    # The training notebook's copy to Drive: made from the loop once each checkpoint is complete.
    copies, drive = [], str(tmp_path / "drive_copy")

    def copy_to_drive(step: int) -> None:
        copies.append(step)
        workdir_copy.copy_workdir(str(tmp_path / "from_workdir"), drive)

    loop.train_and_evaluate(from_workdir, str(tmp_path / "from_workdir"), after_checkpoint=copy_to_drive)
    assert copies == [1]
    copied = Checkpoints(drive, async_save=False)
    assert copied.latest_step() == 1 and copied.restore_meta(1)["vocab_size"], "the copy holds step 1 whole"
    copied.close()
    assert not os.path.exists(os.path.join(drive, ".elmo_jax.lock")) and os.path.isfile(
        os.path.join(drive, "vocab.txt")
    )
    loss_a, loss_w = read_metrics(workdir_a)[0]["loss"], read_metrics(tmp_path / "from_workdir")[0]["loss"]
    assert loss_w < loss_a - 1.0, (loss_w, loss_a)

    from_export = with_overrides(config_a, init_from=os.path.join(workdir_a, "export"))
    with caplog.at_level(logging.WARNING):
        state_e = initial_state(from_export, str(tmp_path / "w1"))
    assert any("holds no optimiser state" in r.getMessage() for r in caplog.records)
    assert_trees_equal(state_e.opt_state, settings.optimizer(config_a).init(state_e.params))
    assert_trees_equal(state_e.params["bilm"], model_params(state_a)["bilm"])
    cfg = settings.step_config(config_a, len(Vocab.load(os.path.join(workdir_a, "vocab.txt"))))
    fresh = init_train_state(jax.random.key(config_a.seed), cfg, settings.optimizer(config_a), config_a.batch_size)
    assert_trees_equal(state_e.params["softmax"], fresh.params["softmax"])
    assert np.max(np.abs(np.asarray(fresh.params["softmax"]["W"]) - np.asarray(state_a.params["softmax"]["W"]))) > 0.1


def test_init_from_workdir_can_restart_the_optimiser(trained_run, tmp_path):
    """init_from_optimizer=False: the workdir's weights with Adagrad's accumulators back at their initial
    value; with another vocabulary, the biLM's accumulators continue and the fresh softmax's restart."""
    workdir_a, config_a = trained_run.workdir, trained_run.config
    state_a, _ = restored(workdir_a)
    fresh = with_overrides(config_a, init_from=workdir_a, init_from_optimizer=False)
    state_f = initial_state(fresh, str(tmp_path / "w0"))
    assert_trees_equal(state_f.params, model_params(state_a))
    assert_trees_equal(state_f.opt_state, settings.optimizer(config_a).init(state_a.params))

    words = Vocab.load(os.path.join(workdir_a, "vocab.txt")).words
    other_vocab = tmp_path / "vocab.txt"
    other_vocab.write_text("\n".join(words + ["zebra"]) + "\n", encoding="utf-8")
    other = with_overrides(config_a, init_from=workdir_a, **{"data.vocab_file": str(other_vocab)})
    state_o = initial_state(other, str(tmp_path / "w1"))
    accumulators = lambda state: state.opt_state[1][0].sum_of_squares  # chain(clip, adagrad(rss, lr))
    acc_o, acc_a = accumulators(state_o), accumulators(state_a)
    assert_trees_equal(acc_o["bilm"], acc_a["bilm"])
    assert np.all(np.asarray(acc_o["softmax"]["W"]) == config_a.adagrad_initial_accumulator)
    assert np.max(np.asarray(acc_a["bilm"]["CNN_proj"]["W_proj"])) > 1.5  # they did grow


def test_checkpoints_without_an_optimizer_name_are_adagrads():
    """Checkpoints written before the meta named the optimiser resume with Adagrad, the only one then."""
    meta = {"model_options": {}, "vocab_size": 5, "batch_size": 2, "unroll_steps": 3}
    start.check_resume(meta, {**meta, "optimizer": "adagrad"}, "W")
    with pytest.raises(ValueError, match="optimizer is 'adagrad' there but 'adam' in this config"):
        start.check_resume(meta, {**meta, "optimizer": "adam"}, "W")


def test_check_config_refuses_an_init_from_optimizer_that_is_not_a_bool():
    config = tiny.get_config()
    config.init_from_optimizer = None  # ml_collections lets None through; ints and strings are a TypeError
    with pytest.raises(ValueError, match=r"--config.init_from_optimizer=None: expected True \(continue"):
        settings.check_config(config)
