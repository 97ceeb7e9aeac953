"""Training and evaluating the biLM: `train_and_evaluate(config, workdir)`, which `train.py` calls.

The loop: take the next window of both directions from the batch stream, run the train step
(jitted for the device mesh, `sharding.jit_steps`), read the previous step's metrics (one step late,
so the host never waits on the device), log, evaluate and checkpoint on schedule. Re-running the same
command resumes from the newest complete checkpoint — parameters, optimiser, RNG, carried LSTM state
and the stream's position — and continues exactly as if never stopped, on any mesh and any number of
processes.

Faults (BUILD.md has the table): SIGTERM/SIGINT checkpoint and stop (`preemption`); after a kill the
newest complete checkpoint that restores is used (`checkpoint`); non-finite steps stop training or
are skipped (`step_report`).

With several processes (`multihost`), each reads and feeds only its own rows of the global batch;
process 0 alone writes logs, metrics and the export; checkpoints are written by all of them (orbax).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from elmo_jax.formats import model_dir, weights_hdf5
from elmo_jax.training import multihost, preemption, sharding
from elmo_jax.model.char_cnn import content_bucket
from elmo_jax.training.checkpoint import Checkpoints
from elmo_jax.model.config import BiLMConfig
from elmo_jax.data.batch_stream import DIRECTIONS, BiLMBatchStream
from elmo_jax.model.flops import char_cnn_flops_per_token, lstm_flops_per_token
from elmo_jax.model.lstm import zero_state
from elmo_jax.training.metrics_log import MetricsLog
from elmo_jax.model.params import BiLMParams, count_parameters
from elmo_jax.training.softmax import padded_vocab_size
from elmo_jax.training.step_report import StepReport, TrainingError, log_resume  # noqa: F401 (TrainingError: API)
from elmo_jax.training.train_step import StepConfig, TrainState, eval_step, init_train_state, make_optimizer
from elmo_jax.data.training_corpus import check_data, open_training_data
from elmo_jax.formats.vocab_file import Vocab


def model_config(config: ml_collections.ConfigDict) -> BiLMConfig:
    m = config.model
    return BiLMConfig(char_embed_dim=m.char_embed_dim, filters=tuple(tuple(f) for f in m.filters),
                      n_highway=m.n_highway, activation=m.activation,
                      max_characters_per_token=m.max_characters_per_token, lstm_dim=m.lstm_dim,
                      projection_dim=m.projection_dim, n_layers=m.n_layers, cell_clip=m.cell_clip,
                      proj_clip=m.proj_clip, use_skip_connections=m.use_skip_connections)


def step_config(config: ml_collections.ConfigDict, vocab_size: int) -> StepConfig:
    return StepConfig(model=model_config(config), vocab_size=vocab_size, unroll_steps=config.unroll_steps,
                      dropout=config.dropout, n_negative_samples=config.n_negative_samples,
                      full_softmax=config.full_softmax, softmax_chunk=config.softmax_chunk,
                      loss_scale_by_unroll=config.loss_scale_by_unroll, compute_dtype=config.compute_dtype,
                      scan_unroll=config.scan_unroll)


def device_batch(window: dict[str, dict[str, np.ndarray]], max_chars: int) -> tuple[dict[str, np.ndarray], int]:
    """Stacks a stream window's directions on a leading D axis; also the char CNN's position bucket."""
    batch = {k: np.stack([window[d][k] for d in DIRECTIONS]) for k in ("char_ids", "targets", "mask", "carry", "reset")}
    # content_bucket reads shifted ids with 0 for "no token": shift the real positions only.
    shifted = np.where(batch["mask"][..., None], batch["char_ids"] + 1, 0)
    return batch, content_bucket(shifted, max_chars)


def evaluate(params: dict, cfg: StepConfig, sentences, vocab: Vocab, batch_size: int,
             max_batches: int = 0, *, steps: sharding.Steps | None = None) -> dict[str, float]:
    """Full-softmax perplexities over a heldout corpus (one in-order pass).

    Args:
      steps: the jitted steps of the training mesh (params sharded as they say; with several processes
        each feeds its own rows); None runs on the device `params` are on.

    Returns: forward_perplexity, backward_perplexity, perplexity (exp of the mean of the two
    cross-entropies, as bilm-tf reports it), and tokens (targets scored per direction).
    """
    if steps is not None and steps.batch_size != batch_size:
        raise ValueError(f"evaluate: batch_size {batch_size} differs from the {steps.batch_size} rows the steps "
                         "were built for")
    block, blocks = sharding.process_rows(steps.batch, batch_size) if steps is not None else (0, 1)
    stream = BiLMBatchStream(sentences, vocab, batch_size=batch_size, unroll_steps=cfg.unroll_steps, seed=None,
                             repeat=False, process_index=block, process_count=blocks,
                             max_characters_per_token=cfg.model.max_characters_per_token)
    lstm = zero_state(cfg.model, batch_size) if steps is None else steps.zero_lstm()
    several = jax.process_count() > 1
    sums, counts = np.zeros(2), np.zeros(2)
    for i in itertools.count():
        window = next(stream, None)
        if (max_batches and i >= max_batches) or (window is None and not several):
            break
        # Every process takes part in every step: one whose rows are done feeds empty windows until
        # no process has tokens left.
        batch, positions = device_batch(window or stream.empty_window(), cfg.model.max_characters_per_token)
        if steps is None:
            s, c, lstm = eval_step(params, lstm, batch, cfg=cfg, content_positions=positions)
        else:
            global_batch = multihost.global_batch(batch, steps.batch, batch_size)
            s, c, lstm = steps.eval(params, lstm, global_batch, multihost.agree_max(positions))
        c = np.asarray(c, np.float64)
        if several and not c.any():
            break
        sums += np.asarray(s, np.float64)
        counts += c
    ce = sums / np.maximum(counts, 1.0)
    return {"forward_perplexity": float(np.exp(ce[0])), "backward_perplexity": float(np.exp(ce[1])),
            "perplexity": float(np.exp(ce.mean())), "cross_entropy": float(ce.mean()), "tokens": float(counts[0])}


def _run_meta(config: ml_collections.ConfigDict, cfg: StepConfig) -> dict[str, Any]:
    """What a checkpoint was made for; a resume must agree on the model, vocabulary and batch."""
    return {"model_options": cfg.model.to_options(), "vocab_size": cfg.vocab_size,
            "batch_size": config.batch_size, "unroll_steps": config.unroll_steps,
            "config": json.loads(config.to_json_best_effort())}


def _differences(there: Any, here: Any, path: str) -> list[str]:
    """'path.to.key is X there but Y in this config' for each leaf where two JSON-like values differ."""
    if isinstance(there, dict) and isinstance(here, dict):
        return [d for k in sorted(set(there) | set(here), key=str)
                for d in _differences(there.get(k), here.get(k), f"{path}.{k}")]
    return [] if there == here else [f"{path} is {there!r} there but {here!r} in this config"]


def _check_resume(meta: dict, expected: dict, directory: str) -> None:
    differences = [d for key in ("model_options", "vocab_size", "batch_size", "unroll_steps")
                   for d in _differences(meta.get(key), expected[key], key)]
    if differences:
        raise ValueError(f"{directory} holds checkpoints of a different run: {'; '.join(differences)}. Use "
                         "another --workdir (the existing checkpoints are left untouched).")


def _same_architecture(options: dict, model: BiLMConfig) -> bool:
    """Whether an options dict describes `model` (training keys aside)."""
    expected = model.to_options()
    return all(options.get(section) == expected[section] for section in ("lstm", "char_cnn"))


def _initial_weights(config, cfg: StepConfig, vocab: Vocab, mesh) -> tuple[BiLMParams | None, dict | None]:
    """Fine-tuning start: (biLM, softmax) from `init_from`, or (None, None) for a fresh model.

    A checkpoint's arrays are restored directly into their shards on `mesh`.
    """
    source = config.init_from
    if not source:
        return None, None
    if not os.path.isdir(source):
        raise FileNotFoundError(f"--config.init_from={source}: not a directory (expected a training workdir or "
                                "a model directory with options.json and weights.hdf5)")
    options, weights = os.path.join(source, "options.json"), os.path.join(source, "weights.hdf5")
    if os.path.exists(weights):  # a published or exported model: the softmax starts fresh
        bilm = weights_hdf5.load_hdf5(options, weights)
        if not _same_architecture(bilm.config.to_options(), cfg.model):
            raise ValueError(f"--config.init_from={source}: its options describe a different model than "
                             "config.model; set config.model to match the options file")
        logging.info("initialising the biLM from %s (fresh softmax)", weights)
        return bilm, None

    def check(meta):
        if not _same_architecture(meta["model_options"], cfg.model):
            raise ValueError(f"--config.init_from={source}: its checkpoint is of a different model than config.model")

    def target(meta):
        abstract, optimizer = abstract_state(meta)
        # That run's carried LSTM state is not used; replicated, its batch need not divide this mesh.
        return sharding.with_shardings(abstract, sharding.state_shardings(mesh, abstract, optimizer,
                                                                          replicate_lstm=True))

    checkpoints = Checkpoints(source, async_save=False)
    try:
        found = checkpoints.restore_newest(target, check)
    finally:
        checkpoints.close()
    if found is None:
        raise FileNotFoundError(f"--config.init_from={source}: no weights.hdf5 and no checkpoint in it")
    step, state = found[:2]
    source_vocab = os.path.join(source, "vocab.txt")
    same_vocab = os.path.exists(source_vocab) and Vocab.load(source_vocab).words == vocab.words
    logging.info("initialising from %s step %d (softmax %s)", source, step, "kept" if same_vocab else "fresh")
    return BiLMParams(weights=state.params["bilm"], config=cfg.model), (state.params["softmax"] if same_vocab else None)


def abstract_state(meta: dict) -> tuple[TrainState, Any]:
    """The shapes of the `TrainState` a checkpoint holds (from its meta), and its run's optimiser."""
    config = ml_collections.ConfigDict(meta["config"])
    model = BiLMConfig.from_options(meta["model_options"], source="checkpoint meta")
    optimizer = make_optimizer(config.learning_rate, config.adagrad_initial_accumulator, config.clip_norm)
    cfg = StepConfig(model=model, vocab_size=meta["vocab_size"], unroll_steps=meta["unroll_steps"])
    return jax.eval_shape(lambda: init_train_state(jax.random.key(0), cfg, optimizer, meta["batch_size"])), optimizer


def restore_checkpoint(workdir: str, step: int | None = None) -> tuple[TrainState, dict, dict]:
    """(state, data stream state, meta) of a workdir's checkpoint, on one device.

    Without `step`, the newest one that restores: a newer one that does not (a truncated or deleted
    file) is named in an error log line and left where it is.

    Raises FileNotFoundError when the workdir has no checkpoint (and creates nothing there), and
    `CheckpointCorruptError` (a ValueError naming each one) when none restores.
    """
    if not os.path.isdir(os.path.join(workdir, "checkpoints")):  # checked first: opening would create it
        raise FileNotFoundError(f"{workdir}: no checkpoint (no checkpoints/ directory)")
    checkpoints = Checkpoints(workdir, async_save=False)
    try:
        if step is not None:
            return checkpoints.restore(step, abstract_state(checkpoints.restore_meta(step))[0])
        found = checkpoints.restore_newest(lambda meta: abstract_state(meta)[0])
        if found is None:
            raise FileNotFoundError(f"{workdir}: no checkpoint in {checkpoints.directory}")
        return found[1:]
    finally:
        checkpoints.close()


def export_model(params: dict, cfg: StepConfig, vocab: Vocab, directory: str, source: str = "") -> None:
    """Writes a model directory (`elmo_jax.model_dir`): the published options.json + weights.hdf5, vocab.txt,
    params.npz and the StableHLO feature extractor, replacing an earlier export only once complete.

    `params["bilm"]` must be addressable here (one process, or `multihost.fetch` of the weights).
    """
    bilm = BiLMParams(weights=jax.device_get(params["bilm"]), config=cfg.model)
    try:
        model_dir.write_model_dir(bilm, directory, vocab=vocab, source=source, overwrite=True)
    except OSError as e:  # e.g. a full disk: the new directory is built aside and renamed only when complete
        raise OSError(f"could not write the export to {directory} ({e}); the previous export, if any, is "
                      "untouched and nothing partial is left") from e


def _check_schedule(config) -> None:
    for key in ("num_train_steps", "batch_size", "unroll_steps", "checkpoint_every_steps", "log_every_steps",
                "keep_checkpoints"):
        if config[key] < 1:
            raise ValueError(f"--config.{key} must be at least 1, found {config[key]}")
    for key in ("eval_every_steps", "eval_max_batches", "max_nonfinite_steps"):
        if config[key] < 0:
            raise ValueError(f"--config.{key} must be 0 (off) or positive, found {config[key]}")


def _make_workdir(workdir: str, config) -> None:
    """Creates `workdir` once the data settings have passed their cheap checks, so a typo in a corpus
    path leaves nothing behind; errors name --workdir."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(f"--workdir={workdir}: is a file, expected a directory")
    check_data(config.data)
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise type(e)(e.errno, f"cannot create --workdir={workdir}: {e.strerror}") from None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Trains (or resumes training) in `workdir`; returns the final heldout metrics (empty without heldout).

    Raises:
      preemption.Stopped: SIGTERM or SIGINT arrived; the step was finished and checkpointed first.
      TrainingError: a non-finite loss or gradient (beyond `max_nonfinite_steps` skipped steps).
      CheckpointWriteError (an OSError): a checkpoint could not be written; the previous one is intact.
      CheckpointCorruptError (a ValueError): checkpoints exist but none restores.
    """
    # A mesh, batch or schedule that cannot work is reported before anything is written or compiled.
    _check_schedule(config)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
    sharding.check_training_mesh(mesh, config.batch_size, jax.process_count())
    _make_workdir(workdir, config)
    is_main = jax.process_index() == 0
    data = _open_data(config, workdir, is_main)
    cfg = step_config(config, len(data.vocab))
    optimizer = make_optimizer(config.learning_rate, config.adagrad_initial_accumulator, config.clip_norm)
    meta = _run_meta(config, cfg)
    steps = sharding.jit_steps(mesh, cfg, optimizer, config.batch_size, skip_nonfinite=config.max_nonfinite_steps > 0)
    block, blocks = sharding.process_rows(steps.batch, config.batch_size)
    stream = BiLMBatchStream(data.train, data.vocab, batch_size=config.batch_size, unroll_steps=config.unroll_steps,
                             seed=config.seed, process_index=block, process_count=blocks,
                             max_characters_per_token=cfg.model.max_characters_per_token,
                             reset_probability=config.state_reset_probability)
    heldout = None if data.heldout is None else (
        lambda params: evaluate(params, cfg, data.heldout, data.vocab, config.batch_size, config.eval_max_batches,
                                steps=steps))
    checkpoints = Checkpoints(workdir, keep=config.keep_checkpoints, writer=True)
    log = None
    with preemption.StopSignals() as signals, _closing(checkpoints, lambda: log):
        state, skipped = _resume_or_start(config, cfg, data.vocab, steps, checkpoints, stream, meta)
        _log_run(config, cfg, mesh)
        log = MetricsLog(workdir, enabled=is_main)
        start = int(state.step)
        if start > 0:
            # Steps logged after this checkpoint by the interrupted run are logged again: a reader keeps, for
            # each step, the record after the last "resume" marker at or below it.
            lost = log_resume(workdir, start, is_main)
            log.write(start, {} if lost is None else {"lost_steps": lost}, kind="resume")
            if _eval_due(config, start, heldout):  # the interrupted run may have stopped before it
                log.write(start, heldout(state.params), kind="eval")
        report = StepReport(config, log, start, skipped)
        state = _train_loop(config, cfg, state, stream, steps, checkpoints, meta, report, heldout, signals)
        checkpoints.wait()  # a failed last write is reported before the export
        signals.stop_if_requested(int(state.step), checkpoints)
        final = {}
        if heldout is not None:
            final = heldout(state.params)
            log.write(int(state.step), final, kind="eval")
            logging.info("heldout after step %d: perplexity %.2f (forward %.2f, backward %.2f) on %d tokens",
                         int(state.step), final["perplexity"], final["forward_perplexity"],
                         final["backward_perplexity"], final["tokens"])
        signals.stop_if_requested(int(state.step), checkpoints)
        weights = multihost.fetch(state.params["bilm"])  # every process takes part
        if is_main:
            export_model({"bilm": weights}, cfg, data.vocab, os.path.join(workdir, "export"),
                         source=f"{workdir} step {int(state.step)}")
            logging.info("exported the biLM to %s (a model directory: options.json + weights.hdf5, vocab.txt, "
                         "the StableHLO extractor)", os.path.join(workdir, "export"))
        return final


def _train_loop(config, cfg: StepConfig, state, stream: BiLMBatchStream, steps: sharding.Steps,
                checkpoints: Checkpoints, meta: dict, report: StepReport, heldout, signals: preemption.StopSignals):
    """Steps from `state.step` to `num_train_steps`, checkpointing and evaluating on schedule; returns
    the final state. After SIGTERM/SIGINT it finishes the step, checkpoints it and raises `Stopped`."""
    pending = None  # (step, metrics on device) of the previous step, read one step late
    for step in range(int(state.step), config.num_train_steps):
        local, positions = device_batch(next(stream), cfg.model.max_characters_per_token)
        positions, stop = preemption.agree(positions, signals.received is not None)
        batch = multihost.global_batch(local, steps.batch, config.batch_size)
        state, metrics = steps.train(state, batch, positions)
        if pending is not None:
            report(*pending)
        pending, done = (step + 1, metrics), step + 1
        # One process stops after the step it was in; several after the step they agreed on.
        stop = stop or (jax.process_count() == 1 and signals.received is not None)
        if done % config.checkpoint_every_steps == 0 or done == config.num_train_steps or stop:
            report(*pending)  # never checkpoint a non-finite state
            pending = None
            checkpoints.save(done, state, multihost.gather_stream_state(stream.get_state()),
                             {**meta, "progress": {"nonfinite_skipped": report.skipped}})
        if stop:  # the evaluation due here, if any, runs when training resumes
            signals.stop_if_requested(done, checkpoints, agreed=True)
        if _eval_due(config, done, heldout):
            report.log.write(done, heldout(state.params), kind="eval")
    if pending is not None:
        report(*pending)
    return state


def _eval_due(config, step: int, heldout) -> bool:
    """Whether a heldout evaluation is logged after `step` (the one after the last step is the final one)."""
    return (heldout is not None and config.eval_every_steps > 0 and step % config.eval_every_steps == 0
            and 0 < step < config.num_train_steps)


@contextlib.contextmanager
def _closing(checkpoints: Checkpoints, log):
    """Closes the checkpoints (waiting for the last write) and the metrics log (`log()`, maybe None)
    however training ends; an error while closing does not hide the one that ended training."""
    try:
        yield
    except BaseException:
        try:
            checkpoints.close()
        except Exception as e:  # e.g. the last write failed too: say so, but report the first error
            logging.error("%s", e)
        if log() is not None:
            log().close()
        raise
    try:
        checkpoints.close()
    finally:
        if log() is not None:
            log().close()


def _resume_or_start(config, cfg: StepConfig, vocab: Vocab, steps: sharding.Steps, checkpoints: Checkpoints,
                     stream: BiLMBatchStream, meta: dict):
    """(state, non-finite steps skipped so far): the newest checkpoint that restores, with the stream
    moved to its position (an unrestorable newer one is reported and moved aside), else a fresh
    sharded state."""
    directory = os.path.dirname(checkpoints.directory)
    found = checkpoints.restore_newest(lambda _: steps.abstract_state, lambda m: _check_resume(m, meta, directory),
                                       move_aside=True)
    if found is None:
        bilm, softmax = _initial_weights(config, cfg, vocab, steps.mesh)
        return steps.init(jax.random.key(config.seed), bilm, softmax), 0
    _, state, data_state, saved_meta = found
    stream.set_state(data_state)
    return state, int(saved_meta.get("progress", {}).get("nonfinite_skipped", 0))


def _open_data(config, workdir: str, is_main: bool):
    """The corpus and vocabulary: process 0 prepares them (and writes vocab.txt) before the others read."""
    data = open_training_data(config.data, workdir, write_files=True) if is_main else None
    multihost.barrier("elmo_jax.trainer: training data prepared")
    return data or open_training_data(config.data, workdir, write_files=False)


def _log_run(config, cfg: StepConfig, mesh) -> None:
    n = count_parameters(cfg.model)
    per_token = char_cnn_flops_per_token(cfg.model) + lstm_flops_per_token(cfg.model)
    logging.info("biLM: %s parameters + softmax %d x %d (%d rows with padding); %.1f MFLOP per token forward",
                 f"{n:,}", cfg.vocab_size, cfg.model.projection_dim, padded_vocab_size(cfg.vocab_size),
                 per_token / 1e6)
    logging.info("mesh: data %d x model %d on %d devices, %d processes", mesh.shape["data"], mesh.shape["model"],
                 jax.device_count(), jax.process_count())
    logging.info("batch: %d rows x %d steps global, %d rows per process, %d per data shard",
                 config.batch_size, config.unroll_steps, config.batch_size // jax.process_count(),
                 config.batch_size // mesh.shape["data"])
