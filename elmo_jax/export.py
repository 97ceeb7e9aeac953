"""Make a model directory (see `elmo_jax.formats.model_dir`) from a training run or a published HDF5 model.

    python -m elmo_jax.export --workdir=runs/demo --output=models/demo            # newest checkpoint
    python -m elmo_jax.export --workdir=runs/demo --step=400 --output=models/demo-400
    python -m elmo_jax.export --options=elmo_options.json --weights=elmo_weights.hdf5 --output=models/elmo
    python -m elmo_jax.export --efml=zh.model --output=models/zh      # an ELMoForManyLangs model

The directory holds the published-format options.json + weights.hdf5, the frozen parameters
(params.npz), the vocabulary of a training run, and `extractor.jax`: the feature extractor as a
`jax.export` StableHLO program that runs with jax alone (left out with --noextractor).
`elmo_jax.load(MODEL_DIR)` reads it back;
`python -m elmo_jax.embed_file --model=MODEL_DIR` embeds files with it. An existing directory is
replaced only with --overwrite, and only once the new one is complete.
"""

from __future__ import annotations

from absl import flags, logging

from elmo_jax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("output", None, "The model directory to write.")
    flags.DEFINE_string("workdir", None, "A training workdir: export its newest checkpoint (or --step).")
    flags.DEFINE_integer("step", None, "With --workdir: the checkpoint step to export (default: the newest).")
    cli.define_hdf5_flags()
    flags.DEFINE_string("vocab", None, "With --options/--weights: a bilm-tf vocabulary file to include.")
    flags.DEFINE_string("efml", None, "An ELMoForManyLangs model directory to convert (docs/MANY_LANGUAGES.md).")
    flags.DEFINE_enum(
        "compute_dtype",
        "float32",
        ["float32", "bfloat16"],
        "Matmul precision of the exported extractor (float32: the same numbers on every backend).",
    )
    flags.DEFINE_bool(
        "extractor",
        True,
        "Include extractor.jax (the StableHLO feature extractor). Without it (--noextractor) the export is "
        "faster and holds the weights and parameters only, which elmo_jax.load and every command read.",
    )
    flags.DEFINE_bool("overwrite", False, "Replace an existing --output directory.")
    cli.define_compilation_cache_flag()


def check_flags() -> None:
    """The flags' mistakes that need no library: refused before anything is imported or read."""
    cli.require("output")
    if bool(FLAGS.workdir) + bool(FLAGS.options or FLAGS.weights) + bool(FLAGS.efml) != 1:
        raise ValueError(
            "pass either --workdir=DIR or --options=FILE --weights=FILE, or --efml=DIR (an ELMoForManyLangs model)"
        )
    if (FLAGS.workdir or FLAGS.efml) and FLAGS.vocab:
        raise ValueError("--vocab goes with --options/--weights; a workdir's own vocabulary is exported")
    if (FLAGS.options or FLAGS.weights) and not (FLAGS.options and FLAGS.weights):
        raise ValueError("--options and --weights go together")
    if not FLAGS.workdir and FLAGS.step is not None:
        raise ValueError("--step goes with --workdir")


def run() -> dict:
    from elmo_jax.formats import model_dir

    inputs = [p for p in (FLAGS.workdir, FLAGS.options, FLAGS.weights, FLAGS.vocab, FLAGS.efml) if p]
    # Fail on an unwritable target before loading anything (a large model takes a while to load).
    model_dir.check_target(FLAGS.output, FLAGS.overwrite, inputs=inputs)
    params, vocab_file, source = _from_workdir() if FLAGS.workdir else _from_efml() if FLAGS.efml else _from_hdf5()
    manifest = model_dir.write_model_dir(
        params,
        FLAGS.output,
        vocab_file=vocab_file,
        source=source,
        compute_dtype=FLAGS.compute_dtype,
        overwrite=FLAGS.overwrite,
        inputs=inputs,
        extractor=FLAGS.extractor,
    )
    total = sum(entry["bytes"] for entry in manifest["files"].values())
    print(f"wrote {FLAGS.output} ({total / 2**20:.1f} MiB: {', '.join(sorted(manifest['files']))}) from {source}")
    return manifest


def _from_workdir():
    from elmo_jax.model.params import BiLMParams
    from elmo_jax.training.start import load_trained

    params, cfg, config, vocab_file, step = load_trained(FLAGS.workdir, FLAGS.step)
    bilm = BiLMParams(weights=params["bilm"], config=cfg.model, vocabulary=cfg.vocabulary)
    return bilm, vocab_file, f"{FLAGS.workdir} step {step}"


def _from_efml():
    from elmo_jax.formats.efml import read_efml

    return read_efml(FLAGS.efml), None, f"ELMoForManyLangs model directory {FLAGS.efml}"


def _from_hdf5():
    from elmo_jax.formats.vocab_file import Vocab
    from elmo_jax.formats.weights_hdf5 import load_hdf5

    if FLAGS.vocab:
        Vocab.load(FLAGS.vocab)  # checked before it is copied in
    return load_hdf5(FLAGS.options, FLAGS.weights), FLAGS.vocab, f"{FLAGS.options} + {FLAGS.weights}"


def main(argv) -> None:
    logging.set_verbosity(logging.WARNING)
    cli.run_main(run, argv, check=check_flags)


def start() -> None:
    """The command: `elmo-export` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.export`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
