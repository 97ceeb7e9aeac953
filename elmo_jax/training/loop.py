"""Training the biLM: `train_and_evaluate(config, workdir)`, which `train.py` calls.

The loop: take the next window of both directions from the batch stream, run the train step (jitted
for the device mesh, `jitted_steps`), read the previous step's metrics (one step late, so the host
never waits on the device), log, evaluate and checkpoint on schedule; at the end, evaluate and export
a model directory. Re-running the same command resumes from the newest complete checkpoint (`start`)
and continues exactly as if never stopped, on any mesh and any number of processes.

Faults (docs/FAULTS.md has the table): SIGTERM/SIGINT checkpoint and stop (`preemption`); after a kill the
newest complete checkpoint that restores is used (`checkpoint`); non-finite steps stop training or
are skipped (`step_report`).

With several processes (`runtime.processes`), each reads and feeds only its own rows of the global batch;
process 0 alone writes logs, metrics and the export; checkpoints are written by all of them (orbax).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from absl import logging

from elmo_jax import storage
from elmo_jax.data.batch_stream import BiLMBatchStream
from elmo_jax.data.training_corpus import TrainingData, open_training_data
from elmo_jax.formats import model_dir
from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.model.flops import char_cnn_flops_per_token, lstm_flops_per_token
from elmo_jax.model.params import BiLMParams, count_parameters
from elmo_jax.model.vocabulary import pad_id
from elmo_jax.runtime import processes
from elmo_jax.runtime.signals import StopSignals
from elmo_jax.storage import compile_cache
from elmo_jax.training import preemption, settings, sharding
from elmo_jax.training.batch_feed import device_batch, distinct_bucket, gather_stream_state
from elmo_jax.training.checkpoint import Checkpoints
from elmo_jax.training.heldout import (
    heldout_perplexity,
    heldout_windows,
    unigram_counts,
    unigram_perplexity,
    unigram_seconds,
    warn_if_worse_than_uniform,
)
from elmo_jax.training.jitted_steps import Steps, jit_steps
from elmo_jax.training.metrics_log import MetricsLog
from elmo_jax.training.softmax import padded_vocab_size
from elmo_jax.training.start import resume_or_start, run_meta
from elmo_jax.training.step_report import RunEnd, StepReport, TrainingError, log_resume
from elmo_jax.training.train_step import StepConfig, TrainState
from elmo_jax.training.weight_average import model_params
from elmo_jax.training.workdir import WorkdirLock, make_workdir


@dataclasses.dataclass
class Run:
    """What a training run holds while it steps; built once by `train_and_evaluate`.

    Attributes:
      config: the run's config.
      cfg: the steps' static settings.
      steps: the train/eval steps jitted for the mesh.
      stream: this process's share of the training batch stream.
      checkpoints: the workdir's checkpoint manager (writer).
      meta: what each checkpoint is saved with (`start.run_meta`).
      heldout: (params, on_window) -> heldout metrics (`heldout_perplexity`'s on_window), or None without
        heldout data.
      signals: SIGTERM/SIGINT requests (`preemption.stop_signals`).
      report: reads, checks and logs each step's metrics.
      after_checkpoint: called in process 0 with the step once its checkpoint is complete, or None.
      check_workdir: raises when the workdir's path no longer names the directory the run locked
      (`WorkdirLock.check`); called before each write by that path.
    """

    config: ml_collections.ConfigDict
    cfg: StepConfig
    steps: Steps
    stream: BiLMBatchStream
    checkpoints: Checkpoints
    meta: dict
    heldout: Callable[[dict], dict[str, float]] | None
    signals: StopSignals
    report: StepReport | None = None
    after_checkpoint: Callable[[int], object] | None = None
    check_workdir: Callable[[], None] = lambda: None


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, after_checkpoint: Callable[[int], object] | None = None
) -> dict[str, float]:
    """Trains (or resumes training) in `workdir`; returns the final heldout metrics (empty without heldout).

    `after_checkpoint(step)` is called in process 0 each time the checkpoint of `step` is complete on disk
    (the loop waits for its background write first), e.g. to copy the workdir somewhere that outlives
    the machine (the training notebook copies it to Google Drive with `workdir_copy.WorkdirCopy`).

    Raises:
      preemption.Stopped: SIGTERM or SIGINT arrived; the step was finished and checkpointed first.
      TrainingError: a non-finite loss or gradient (beyond `max_nonfinite_steps` skipped steps).
      CheckpointWriteError (an OSError): a checkpoint could not be written; the previous one is intact.
      CheckpointCorruptError (a ValueError): checkpoints exist but none restores.
      WorkdirInUseError (an OSError): another run holds the workdir.
      WorkdirMovedError (an OSError): the workdir was moved or replaced while the run trained; it stopped
        before its next write (a metrics record, a checkpoint, the export).
    """
    # A config, mesh or batch that cannot work is reported before anything is written or compiled.
    settings.check_config(config)
    compile_cache.use(config.get("compilation_cache"))  # before the first compile (a resumed run reads them)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
    sharding.check_training_mesh(mesh, config.batch_size, jax.process_count())
    make_workdir(workdir)
    with WorkdirLock(workdir) as lock:  # one run per workdir; a second one stops here, naming the first
        return _train(config, workdir, mesh, after_checkpoint, lock.check)


def _train(
    config: ml_collections.ConfigDict, workdir: str, mesh, after_checkpoint=None, check_workdir=lambda: None
) -> dict[str, float]:
    """`train_and_evaluate` once the workdir is held: data, steps, resume, the loop, the end."""
    is_main = jax.process_index() == 0
    data = _open_data(config, workdir, is_main)
    cfg = settings.step_config(config, len(data.vocab), data.characters)
    optimizer = settings.optimizer(config)
    steps = jit_steps(mesh, cfg, optimizer, config.batch_size, skip_nonfinite=config.max_nonfinite_steps > 0)
    stream = _training_stream(config, cfg, data, steps)
    heldout = _heldout_evaluation(config, cfg, data, steps)
    checkpoints = Checkpoints(workdir, keep=config.keep_checkpoints, writer=True)
    log = None
    with preemption.stop_signals() as signals, _closing(checkpoints, lambda: log):
        run = Run(config, cfg, steps, stream, checkpoints, run_meta(config, cfg, data.vocab), heldout, signals)
        run.after_checkpoint, run.check_workdir = after_checkpoint, check_workdir
        state, data_state, saved = resume_or_start(config, cfg, data.vocab, steps, checkpoints, run.meta)
        if data_state is not None:
            stream.set_state(data_state)
        _log_run(config, cfg, mesh)
        log = MetricsLog(workdir, enabled=is_main, check_workdir=check_workdir)
        run.report = StepReport(config, log, int(state.step), saved, _run_end(config, cfg, data))
        if state.step > 0:
            _log_resumption(run, state, workdir, is_main)
        state = _train_loop(run, state)
        return _finish(run, state, data.vocab, workdir, is_main)


def _run_end(config, cfg: StepConfig, data: TrainingData) -> RunEnd:
    """What the run does after its steps, as the ETA estimates it before measuring: the evaluations'
    windows and the unigram model's pass (none without heldout data), and the export."""
    windows, extra = 0, 0.0
    if data.heldout is not None:
        windows = heldout_windows(data.heldout, config.batch_size, config.unroll_steps, config.eval_max_batches)
        extra = unigram_seconds(data.train, data.heldout)
    return RunEnd(config.eval_every_steps, windows, extra, _export_seconds(cfg))


# The end of a run beside its final evaluation: waiting for the last checkpoint's write, the export
# (writing the model directory, lowering the extractor) and the process's exit; 0.4 + 0.6 + 0.85 s for
# the demo's 0.75M parameters on a 2-core CPU; and the weights at disk speed.
EXPORT_BASE_S, EXPORT_BYTES_PER_S = 2.0, 100e6


def _export_seconds(cfg: StepConfig) -> float:
    """About the seconds the end of the run takes beside its final evaluation (the export, mostly) for
    this run's biLM."""
    return EXPORT_BASE_S + 4 * count_parameters(cfg.model) / EXPORT_BYTES_PER_S


def _heldout_evaluation(config, cfg: StepConfig, data: TrainingData, steps: Steps):
    """(params, on_window=None) -> heldout metrics (warning when a direction does worse than a uniform
    guess), or None without heldout data."""
    if data.heldout is None:
        return None
    # The unigram model's perplexity depends on the targets scored only, the same at every evaluation of
    # a run: computed at the first one (a pass over the training sample and the heldout text), then reused.
    unigram = {}  # tokens scored -> the unigram model's perplexity on them

    def evaluate(params, on_window=None) -> dict[str, float]:
        result = heldout_perplexity(
            params,
            cfg,
            data.heldout,
            data.vocab,
            config.batch_size,
            config.eval_max_batches,
            steps=steps,
            on_window=on_window,
        )
        warn_if_worse_than_uniform(result, len(data.vocab))
        capped = int(result["tokens"]) if config.eval_max_batches else 0
        if capped not in unigram:
            counts = unigram_counts(data.train, data.vocab)
            unigram[capped] = unigram_perplexity(counts, data.heldout, data.vocab, capped)
        result["unigram_perplexity"] = unigram[capped]
        return result

    return evaluate


def _training_stream(config, cfg: StepConfig, data: TrainingData, steps: Steps) -> BiLMBatchStream:
    """This process's rows of the global training batch stream."""
    block, blocks = sharding.process_rows(steps.batch, config.batch_size)
    return BiLMBatchStream(
        data.train,
        data.vocab,
        batch_size=config.batch_size,
        unroll_steps=config.unroll_steps,
        seed=config.seed,
        process_index=block,
        process_count=blocks,
        max_characters_per_token=cfg.model.max_characters_per_token,
        reset_probability=config.state_reset_probability,
        vocabulary=cfg.vocabulary,
    )


def _train_loop(run: Run, state: TrainState) -> TrainState:
    """Steps from `state.step` to `num_train_steps`, checkpointing and evaluating on schedule; returns
    the final state. After SIGTERM/SIGINT it finishes the step, checkpoints it and raises `Stopped`."""
    config, report = run.config, run.report
    pending = None  # (step, metrics on device) of the previous step, read one step late
    for step in range(int(state.step), config.num_train_steps):
        local, positions = device_batch(next(run.stream), run.cfg.model.max_characters_per_token, pad_id(run.cfg.model))
        distinct = distinct_bucket(local, run.steps.local_token_shards) if config.distinct_tokens else None
        positions, distinct, stop = preemption.agree(positions, distinct, run.signals.requested is not None)
        batch = processes.global_batch(local, run.steps.batch, config.batch_size)
        (positions, distinct), new = report.progress.next_shape((positions, distinct))  # its char CNN buckets
        started = time.perf_counter()
        state, metrics = run.steps.train(state, batch, positions, distinct)
        if new:  # the call returned once the step for it was compiled
            _log_compile(run, positions, distinct, time.perf_counter() - started)
        if pending is not None:
            report(*pending)
        pending, done = (step + 1, metrics), step + 1
        # One process stops after the step it was in; several after the step they agreed on.
        stop = stop or (jax.process_count() == 1 and run.signals.requested is not None)
        if done % config.checkpoint_every_steps == 0 or done == config.num_train_steps or stop:
            report(*pending)  # a non-finite loss stops here, before its state is checkpointed
            pending = None
            _checkpoint(run, state, done)
        if stop:  # the evaluation due here, if any, runs when training resumes
            preemption.stop_if_requested(run.signals, done, run.checkpoints, agreed=True)
        if _eval_due(config, done, run.heldout):
            _evaluate(run, done, model_params(state))
    if pending is not None:
        report(*pending)
    return state


def _checkpoint(run: Run, state: TrainState, step: int) -> None:
    """Saves the checkpoint of `step` (its metrics already reported) and calls `run.after_checkpoint`."""
    run.check_workdir()
    _check_finite_state(run, state, step)  # nor parameters a finite step made non-finite
    run.report.log.flush()  # in a bucket, the records up to a checkpoint are there before it is
    run.checkpoints.save(
        step,
        state,
        gather_stream_state(run.stream.get_state()),
        {**run.meta, "progress": run.report.saved()},
    )
    if run.after_checkpoint is not None:
        run.checkpoints.wait()  # every process: the step's checkpoint is complete before it is copied
        if jax.process_index() == 0:
            run.check_workdir()  # it reads the workdir by its path
            run.after_checkpoint(step)


def _check_finite_state(run: Run, state: TrainState, step: int) -> None:
    """Raises TrainingError when the state after `step` holds NaN or Inf, so it is never checkpointed (a
    step's loss and gradient can be finite while its update is not, e.g. with a NaN learning rate)."""
    if not bool(np.asarray(run.steps.finite(state).addressable_data(0))):
        latest = run.checkpoints.latest_step()
        kept = f"the last checkpoint, step {latest}, is kept" if latest is not None else "no checkpoint was written"
        raise TrainingError(
            f"the parameters or optimiser state after step {step} hold NaN or Inf (its loss and gradient were "
            f"finite: check the learning rate and initial accumulator); stopped without saving them, {kept}"
        )


def _finish(run: Run, state: TrainState, vocab: Vocab, workdir: str, is_main: bool) -> dict[str, float]:
    """The end of training: the last checkpoint on disk, the final heldout evaluation (logged and
    returned) and the export to `WORKDIR/export`; a stop signal is honoured between them."""
    step = int(state.step)
    run.checkpoints.wait()  # a failed last write is reported before the export
    preemption.stop_if_requested(run.signals, step, run.checkpoints)
    final = _evaluate(run, step, model_params(state)) if run.heldout is not None else {}
    preemption.stop_if_requested(run.signals, step, run.checkpoints)
    weights = processes.fetch(model_params(state)["bilm"])  # every process takes part
    if is_main:
        run.check_workdir()
        export = storage.join(workdir, "export")
        export_model(
            BiLMParams(weights=weights, config=run.cfg.model, vocabulary=run.cfg.vocabulary),
            vocab,
            export,
            source=f"{workdir} step {step}",
            extractor=run.config.export_extractor,
        )
        logging.info(
            "exported the biLM to %s (a model directory: options.json + weights.hdf5, vocab.txt, "
            "the StableHLO extractor)",
            export,
        )
    return final


def export_model(bilm: BiLMParams, vocab: Vocab, directory: str, source: str = "", extractor: bool = True) -> None:
    """Writes a model directory (`formats.model_dir`) for a trained biLM, replacing an earlier export only
    once the new one is complete. `bilm` must be addressable here (`processes.fetch` of the weights);
    `extractor`: whether it includes extractor.jax (the config's `export_extractor`)."""
    try:
        # The run owns its workdir: the export may go inside it (other commands may not write there).
        model_dir.write_model_dir(
            bilm,
            directory,
            vocab=vocab,
            source=source,
            overwrite=True,
            allow_inside=storage.dirname(storage.absolute(directory)),
            extractor=extractor,
        )
    except OSError as e:  # e.g. a full disk: the new directory is built aside and renamed only when complete
        raise OSError(
            f"could not write the export to {directory} ({e}); the previous export, if any, is "
            "untouched and nothing partial is left"
        ) from e


def _log_resumption(run: Run, state: TrainState, workdir: str, is_main: bool) -> None:
    """Logs where training resumes and how many steps are done again, and runs an evaluation that was
    due at the checkpoint's step (the interrupted run may have stopped before it)."""
    start = int(state.step)
    # Steps logged after this checkpoint by the interrupted run are logged again: a reader keeps, for
    # each step, the record after the last "resume" marker at or below it.
    run.report.log.write(start, log_resume(workdir, start, is_main), kind="resume")
    if _eval_due(run.config, start, run.heldout):
        _evaluate(run, start, model_params(state))


def _log_compile(run: Run, positions: int, distinct: int | None, seconds: float) -> None:
    """The first step with a new pair of char CNN buckets compiles the training step for it (at most C/8
    character-width buckets, times at most 8 distinct-token buckets; a stream of text meets a few, and a
    pair met once runs with a wider one already compiled: `batch_feed.step_shape`); that time is left
    out of the rates, and is the ETA's cost of the compiles it expects (`step_report.StepLine`).
    Compiling every bucket up front would make each run pay for buckets its text may never reach (a
    compile is seconds on CPU, tens of seconds for the large model), so they are compiled when needed."""
    run.report.progress.compiled((positions, distinct), seconds)
    blocks = run.steps.local_token_shards * jax.process_count()  # the batch axis's devices
    per_device = run.config.batch_size * run.config.unroll_steps * 2 // blocks
    logging.info(
        "compiling the training step for tokens of up to %d characters (%d positions, %d rows x %d tokens, "
        "%s of each device's %d tokens distinct): %.1f s, not counted in tokens/s or steps/s",
        positions - 2,  # a token's positions hold its begin and end markers too
        positions,
        run.config.batch_size,
        run.config.unroll_steps,
        "all" if distinct is None else f"up to {distinct}",
        per_device,
        seconds,
    )


def _evaluate(run: Run, step: int, params) -> dict[str, float]:
    """The heldout evaluation after `step`: logged (with a unigram model's and a uniform guess's
    perplexities for scale, and its duration, which the training rates leave out) and written to
    metrics.jsonl; returns it."""
    started = time.perf_counter()
    result = run.heldout(params, run.report.progress.eval_window)
    seconds = time.perf_counter() - started
    run.report.progress.evaluated(step, seconds)
    run.report.log.write(step, result, kind="eval")
    logging.info(
        "heldout after step %d: perplexity %.2f (forward %.2f, backward %.2f) on %d tokens, against %.2f for a "
        "unigram model of the training text and %d for a uniform guess among the vocabulary's words; %.1f s",
        step,
        result["perplexity"],
        result["forward_perplexity"],
        result["backward_perplexity"],
        result["tokens"],
        result["unigram_perplexity"],
        run.cfg.vocab_size,
        seconds,
    )
    return result


def _eval_due(config, step: int, heldout) -> bool:
    """Whether a heldout evaluation is logged after `step` (the one after the last step is the final one)."""
    return (
        heldout is not None
        and config.eval_every_steps > 0
        and step % config.eval_every_steps == 0
        and 0 < step < config.num_train_steps
    )


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


def _open_data(config, workdir: str, is_main: bool) -> TrainingData:
    """The corpus and vocabulary: process 0 prepares them (and writes vocab.txt) before the others read."""
    data = open_training_data(config.data, workdir, write_files=True) if is_main else None
    processes.barrier("elmo_jax.training.loop: training data prepared")
    return data or open_training_data(config.data, workdir, write_files=False)


def _log_run(config, cfg: StepConfig, mesh) -> None:
    n = count_parameters(cfg.model)
    per_token = char_cnn_flops_per_token(cfg.model) + lstm_flops_per_token(cfg.model)
    logging.info(
        "biLM: %s parameters + softmax %d x %d (%d rows with padding); %.1f MFLOP per token forward",
        f"{n:,}",
        cfg.vocab_size,
        cfg.model.projection_dim,
        padded_vocab_size(cfg.vocab_size),
        per_token / 1e6,
    )
    logging.info(
        "mesh: data %d x model %d on %d devices, %d processes",
        mesh.shape["data"],
        mesh.shape["model"],
        jax.device_count(),
        jax.process_count(),
    )
    logging.info(
        "batch: %d rows x %d steps global, %d rows per process, %d per data shard",
        config.batch_size,
        config.unroll_steps,
        config.batch_size // jax.process_count(),
        config.batch_size // mesh.shape["data"],
    )
