"""Where a training run starts, and reading a finished one back.

A run resumes from the newest checkpoint of its workdir that restores (parameters, optimiser, RNG,
carried LSTM state and the stream's position), after checking that the checkpoint was made for the
same model, vocabulary, batch and optimiser. Without one it starts fresh, or from `init_from`
(fine-tuning): a training workdir (its biLM, and its softmax when the vocabulary is the same; with
`init_from_optimizer`, the default, also their optimiser state — Adagrad's accumulators, as bilm-tf's
restart.py restores them) or a model directory / published HDF5 pair, also a published model by name
(its biLM, a fresh softmax, a fresh optimiser state). The step count, RNG, carried LSTM state and data
position always start afresh.

`restore_checkpoint` and `load_trained` read a workdir's checkpoint on one device, for the commands.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import ml_collections
from absl import logging

from elmo_jax import storage
from elmo_jax.data import char_vocabulary
from elmo_jax.formats import pretrained, weights_hdf5
from elmo_jax.formats.model_source import names_published_model
from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.params import BiLMParams
from elmo_jax.training import settings, sharding
from elmo_jax.training.checkpoint import Checkpoints
from elmo_jax.training.jitted_steps import Steps
from elmo_jax.training.optimizers import ADAGRAD, Optimizer
from elmo_jax.training.train_step import StepConfig, TrainState, init_train_state
from elmo_jax.training.weight_average import fresh, model_params

# What the log and README recommend when fine-tuning starts from a model without optimiser state, from
# bench/finetune_optimizer.py: from an HDF5 export, a 10x smaller learning rate left the new domain's
# perplexity far higher, and the old domain's no better (measured: bench/RESULTS.md, "Fine-tuning and the
# optimiser state").
HDF5_FINE_TUNING_ADVICE = (
    "keep the pretraining learning rate (0.2 in bilm-tf's recipe): measured, a 10x smaller one leaves the new "
    "softmax far behind without sparing the old domain; limit the run's length instead, evaluating on heldout text"
)
# Must agree to resume (the optimiser: its state's structure; every checkpoint without it is Adagrad's).
RESUME_KEYS = ("model_options", "vocab_size", "vocab_sha256", "batch_size", "unroll_steps", "optimizer")


def run_meta(config: ml_collections.ConfigDict, cfg: StepConfig, vocab: Vocab) -> dict[str, Any]:
    """What a checkpoint was made for (saved with it): the model, the vocabulary (its size and a digest of
    its words in order, since a softmax row means the word at that id), the batch, the optimiser's name
    and the config."""
    return {
        "model_options": cfg.model.to_options(),
        "vocab_size": cfg.vocab_size,
        "vocab_sha256": vocab.sha256(),
        "batch_size": config.batch_size,
        "unroll_steps": config.unroll_steps,
        "optimizer": settings.optimizer(config).name,
        "config": json.loads(config.to_json_best_effort()),
    }


def meta_optimizer(meta: dict) -> str:
    """The name of the optimiser a checkpoint's run used (checkpoints written before the name was saved
    are of Adagrad's runs)."""
    return meta.get("optimizer", ADAGRAD)


def _differences(there: Any, here: Any, path: str) -> list[str]:
    """'path.to.key is X there but Y in this config' for each leaf where two JSON-like values differ."""
    if isinstance(there, dict) and isinstance(here, dict):
        return [
            d
            for k in sorted(set(there) | set(here), key=str)
            for d in _differences(there.get(k), here.get(k), f"{path}.{k}")
        ]
    return [] if there == here else [f"{path} is {there!r} there but {here!r} in this config"]


def check_resume(meta: dict, expected: dict, directory: str) -> None:
    """Raises ValueError naming every difference when a checkpoint's meta is of another run. Checkpoints
    written before the vocabulary digest was saved are compared on the rest; those written before the
    optimiser's name was saved are Adagrad's."""
    meta = {**meta, "optimizer": meta_optimizer(meta)}
    keys = [key for key in RESUME_KEYS if key in meta or key != "vocab_sha256"]
    differences = [d for key in keys for d in _differences(meta.get(key), expected[key], key)]
    if any(d.startswith("vocab_sha256") for d in differences):
        differences = [d for d in differences if not d.startswith("vocab_sha256")] + [
            "vocab_sha256: the vocabulary has the same size but other words or another order than the one "
            "the checkpoints were trained with (each softmax row belongs to the word at its id)"
        ]
    if differences:
        advice = "Use another --workdir (the existing checkpoints are left untouched)"
        if meta["optimizer"] != expected["optimizer"]:  # its state cannot continue; its weights can
            advice += (
                f"; to train these weights with {expected['optimizer']}, give it --config.init_from={directory} "
                "--config.init_from_optimizer=False"
            )
        raise ValueError(f"{directory} holds checkpoints of a different run: {'; '.join(differences)}. {advice}.")


def _same_architecture(options: dict, model: BiLMConfig) -> bool:
    """Whether an options dict describes `model` (training keys aside)."""
    expected = model.to_options()
    return all(options.get(section) == expected[section] for section in ("lstm", "char_cnn"))


def abstract_state(meta: dict) -> tuple[TrainState, Optimizer]:
    """The shapes of the `TrainState` a checkpoint holds (from its meta), and its run's optimiser."""
    run_optimizer = settings.optimizer(ml_collections.ConfigDict(meta["config"]))
    model = BiLMConfig.from_options(meta["model_options"], source="checkpoint meta")
    cfg = StepConfig(
        model=model,
        vocab_size=meta["vocab_size"],
        unroll_steps=meta["unroll_steps"],
        weight_average_decay=_kept_average_decay(meta),
    )
    state = jax.eval_shape(lambda: init_train_state(jax.random.key(0), cfg, run_optimizer, meta["batch_size"]))
    return state, run_optimizer


def _kept_average_decay(meta: dict) -> float:
    """The weight average's decay of a checkpoint's run (0: it kept none, as every run before the key existed)."""
    return float(meta["config"].get("weight_average_decay", 0.0))


def _restore_target(abstract: TrainState, meta: dict) -> TrainState:
    """This run's abstract state, with a weight average exactly when the checkpoint's run kept one."""
    if _kept_average_decay(meta) > 0:
        return abstract if abstract.average is not None else abstract.replace(average=abstract.params["bilm"])
    return abstract.replace(average=None)


def _with_this_runs_average(state: TrainState, steps: Steps) -> TrainState:
    """A resumed state with a weight average exactly when this run keeps one: a checkpoint without one
    (its run kept none) starts it at the resumed weights; one this run does not keep is dropped."""
    if (state.average is None) == (steps.abstract_state.average is None):
        return state
    if state.average is None:
        logging.info("the checkpoint holds no weight average: the average starts from the resumed weights")
        return state.replace(average=jax.jit(fresh, out_shardings=steps.state.params["bilm"])(state.params["bilm"]))
    logging.info("weight_average_decay is 0: the checkpoint's weight average is dropped, the weights continue")
    return state.replace(average=None)


def resume_or_start(
    config: ml_collections.ConfigDict, cfg: StepConfig, vocab: Vocab, steps: Steps, checkpoints: Checkpoints, meta: dict
) -> tuple[TrainState, dict | None, dict]:
    """(state, data stream state or None, the progress the checkpoint kept: `StepReport.saved`, {} if none).

    The newest checkpoint that restores (an unrestorable newer one is reported and moved aside), with
    the stream state to move the stream to; else a fresh state, created sharded, from `init_from`'s
    weights when set.
    """
    directory = storage.dirname(checkpoints.directory)
    found = checkpoints.restore_newest(
        lambda m: _restore_target(steps.abstract_state, m), lambda m: check_resume(m, meta, directory), move_aside=True
    )
    if found is None:
        bilm, softmax, optimizer_state = _initial_weights(config, cfg, vocab, steps.mesh)
        state = steps.init(jax.random.key(config.seed), bilm, softmax)
        if optimizer_state is not None:
            kept = ("bilm", "softmax") if softmax is not None else ("bilm",)
            state = state.replace(
                opt_state=jax.device_put(
                    continue_optimizer_state(state.opt_state, optimizer_state, kept), steps.state.opt_state
                )
            )
        return state, None, {}
    _, state, data_state, saved_meta = found
    return _with_this_runs_average(state, steps), data_state, saved_meta.get("progress", {})


def continue_optimizer_state(fresh: Any, source: Any, parts: tuple[str, ...]) -> Any:
    """`fresh` (a new run's optimiser state) with the state of the parameters under `parts` ("bilm",
    "softmax") taken from `source`, the optimiser state of the run fine-tuning starts from.

    Both come from the same optimiser (`_initial_weights` checks its name) for the same parameter
    structure, so their leaves line up by path; a leaf under a part named in `parts` must be present in
    `source` with the same shape.
    """
    found = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(source)}

    def pick(path, leaf):
        if not any(getattr(entry, "key", None) in parts for entry in path):
            return leaf
        name = jax.tree_util.keystr(path)
        if name not in found or found[name].shape != leaf.shape:
            raise ValueError(f"--config.init_from: its optimiser state has no {name} of shape {leaf.shape}")
        return found[name]

    return jax.tree_util.tree_map_with_path(pick, fresh)


def _initial_weights(config, cfg: StepConfig, vocab: Vocab, mesh) -> tuple[BiLMParams | None, dict | None, Any]:
    """Fine-tuning start: (biLM, softmax, optimiser state) from `init_from`, or (None, None, None) for a
    fresh model. The optimiser state is that of the source run (its Adagrad accumulators) when it is a
    workdir and `init_from_optimizer` is set, else None; the source run must then have used this
    config's optimiser.

    A checkpoint's arrays are restored directly into their shards on `mesh`.
    """
    source = config.init_from
    if not source:
        return None, None, None
    source = _init_from_directory(source)
    options, weights = storage.join(source, "options.json"), storage.join(source, "weights.hdf5")
    if storage.exists(weights):  # a published or exported model: the softmax starts fresh
        return _bilm_from_model(config, cfg, source, options, weights), None, None
    return _weights_from_workdir(config, cfg, vocab, mesh, source)


def _init_from_directory(source: str) -> str:
    """The directory `init_from` names (a published model's name: its cached model directory); raises
    FileNotFoundError when it is not a directory."""
    if names_published_model(source):
        source = pretrained.fetch(source)  # a published model by name: its cached model directory
    problem = settings.init_from_problem(source)
    if problem is not None:  # checked before the run began: it went since
        raise FileNotFoundError(problem)
    return source


def _bilm_from_model(config, cfg: StepConfig, source: str, options: str, weights: str) -> BiLMParams:
    """The biLM of a model directory's (or published) options and weights files, checked against
    `cfg.model`; the optimiser state starts afresh (logged)."""
    bilm = weights_hdf5.load_hdf5(options, weights)
    if not _same_architecture(bilm.config.to_options(), cfg.model):
        raise ValueError(
            f"--config.init_from={source}: its options describe a different model than "
            "config.model; set config.model to match the options file"
        )
    logging.info("initialising the biLM from %s (fresh softmax)", weights)
    _warn_no_optimizer_state(config, source)
    return bilm


def _weights_from_workdir(
    config, cfg: StepConfig, vocab: Vocab, mesh, source: str
) -> tuple[BiLMParams, dict | None, Any]:
    """(biLM, softmax, optimiser state) of a training workdir's newest checkpoint: the softmax when that
    run's vocabulary is `vocab`, the optimiser state when `init_from_optimizer` is set, else None."""
    run_optimizer = settings.optimizer(config).name
    keep_optimizer = bool(config.init_from_optimizer)
    step, state = _restore_init_checkpoint(source, cfg, mesh, run_optimizer, keep_optimizer)
    source_vocab = storage.join(source, "vocab.txt")
    same_vocab = storage.exists(source_vocab) and Vocab.load(source_vocab).words == vocab.words
    logging.info(
        "initialising from %s step %d (softmax %s; %s state %s)",
        source,
        step,
        "kept" if same_vocab else "fresh: another vocabulary",
        run_optimizer,
        ("kept for the biLM and softmax" if same_vocab else "kept for the biLM")
        if keep_optimizer
        else "fresh (init_from_optimizer=False)",
    )
    weights = model_params(state)  # the model that run stands for, the weights its export holds
    bilm = BiLMParams(weights=weights["bilm"], config=cfg.model)
    return bilm, (weights["softmax"] if same_vocab else None), (state.opt_state if keep_optimizer else None)


def _restore_init_checkpoint(
    source: str, cfg: StepConfig, mesh, run_optimizer: str, keep_optimizer: bool
) -> tuple[int, TrainState]:
    """(step, state) of the newest checkpoint of the workdir `source` that restores, restored into its
    shards on `mesh`; raises ValueError when it is of another model (or, its optimiser state kept, of
    another optimiser than `run_optimizer`), FileNotFoundError when there is none."""

    def check(meta):
        if not _same_architecture(meta["model_options"], cfg.model):
            raise ValueError(f"--config.init_from={source}: its checkpoint is of a different model than config.model")
        if keep_optimizer and meta_optimizer(meta) != run_optimizer:
            raise ValueError(
                f"--config.init_from={source}: its run trained with --config.optimizer={meta_optimizer(meta)}, "
                f"whose state cannot continue into {run_optimizer}'s; set --config.init_from_optimizer=False "
                f"to start {run_optimizer} afresh from its weights"
            )

    def target(meta):
        abstract, optimizer = abstract_state(meta)
        # That run's carried LSTM state is not used; replicated, its batch need not divide this mesh.
        return sharding.with_shardings(
            abstract, sharding.state_shardings(mesh, abstract, optimizer, replicate_lstm=True)
        )

    checkpoints = Checkpoints(source, async_save=False)
    try:
        found = checkpoints.restore_newest(target, check)
    finally:
        checkpoints.close()
    if found is None:
        raise FileNotFoundError(f"--config.init_from={source}: no weights.hdf5 and no checkpoint in it")
    step, state = found[:2]
    return step, state


def _warn_no_optimizer_state(config, source: str) -> None:
    """The log line of a fine-tuning start from a model without optimiser state (an HDF5 pair)."""
    name = settings.optimizer(config).name
    if name != ADAGRAD:
        logging.info("%s holds no optimiser state: %s starts afresh", source, name)
        return
    logging.warning(
        "%s holds no optimiser state: Adagrad's accumulators start afresh at %g, so the first updates "
        "are as large as a new run's (up to learning_rate = %g per weight and step) where a long "
        "pretraining run ended with larger accumulators and smaller steps, and the softmax is new. "
        "Advice: %s (README, Fine-tuning)",
        source,
        config.adagrad_initial_accumulator,
        config.learning_rate,
        HDF5_FINE_TUNING_ADVICE,
    )


def restore_checkpoint(workdir: str, step: int | None = None) -> tuple[TrainState, dict, dict]:
    """(state, data stream state, meta) of a workdir's checkpoint, on one device.

    Without `step`, the newest one that restores: a newer one that does not (a truncated or deleted
    file) is named in an error log line and left where it is.

    Raises FileNotFoundError when the workdir has no checkpoint (and creates nothing there), and
    `CheckpointCorruptError` (a ValueError naming each one) when none restores.
    """
    if not storage.isdir(storage.join(workdir, "checkpoints")):  # checked first: opening would create it
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


def load_trained(workdir: str, step: int | None = None):
    """A workdir's checkpoint (default: the newest that restores) with what it needs to be used.

    Returns:
      (params {"bilm", "softmax"}: the model the run stands for, its weight average when it kept one
      (`weight_average.model_params`); step config, training config, vocabulary file, step).
    """
    if not storage.isdir(workdir):
        raise FileNotFoundError(f"--workdir={workdir}: not a directory")
    state, _, meta = restore_checkpoint(workdir, step)
    params = model_params(state)  # its weight average when the run kept one
    _check_finite_params(params, f"{workdir} step {int(state.step)}")
    config = ml_collections.ConfigDict(meta["config"])
    vocab_file = config.data.vocab_file or storage.join(workdir, "vocab.txt")
    vocab = Vocab.load(vocab_file)
    characters = None  # the run's own characters (data.characters "corpus"), kept beside vocab.txt
    if config.data.get("characters", "bytes") == "corpus":
        characters = char_vocabulary.read_characters(storage.join(workdir, char_vocabulary.FILE))
    return params, settings.step_config(config, len(vocab), characters), config, vocab_file, int(state.step)


def _check_finite_params(params: dict, source: str) -> None:
    """Raises ValueError naming the first array of `params` ({"bilm", "softmax"}) that holds NaN or Inf;
    checked on the device, one array at a time."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if not bool(jax.numpy.all(jax.numpy.isfinite(leaf))):
            name = "/".join(str(getattr(p, "key", p)) for p in path)
            raise ValueError(
                f"{source}: non-finite weights: {name} holds NaN or Inf; refusing to use a diverged checkpoint"
            )
