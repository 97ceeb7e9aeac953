"""What each layer of a biLM knows: nearest-neighbour and linear probes of every layer (Peters et al. 2018,
section 5.3) on labelled targets.

    python -m elmo_jax.probe --model=MODEL_DIR --train=probes/wordnet/wsd.train.jsonl \\
        --test=probes/wordnet/wsd.test.jsonl [--output=results.json] [--plot=layers.png]

Inputs are JSON lines (`{"tokens": [...], "target": i or [start, end), "label": ...}`) or CoNLL-style
`TOKEN<TAB>LABEL` files (see `elmo_jax.analysis.probe_data`). For the token layer, each LSTM layer and
a learned mix, prints a table of the test accuracy of a 1-nearest-neighbour classifier (cosine, among
training items of the same word) and of a linear classifier, with the majority-class and per-word
baselines; `--output` writes the same as JSON (`elmo_jax.analysis.probing.probe`), `--plot` a bar chart.
Every path may be gs://BUCKET/PATH; the outputs are written complete or not at all (`storage`).
"""

from __future__ import annotations

from absl import flags

from elmo_jax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    cli.define_labelled_targets_flags()
    flags.DEFINE_string(
        "plot", None, "Write a bar chart of the accuracies here (.png; needs matplotlib, the plot extra)."
    )
    # The seed goes to NumPy's default_rng (any integer >= 0) and jax.random.key (an int64): checked
    # with the flags, before the model loads.
    flags.DEFINE_integer(
        "seed",
        0,
        "Seed of the linear classifiers (their initialisation and batches).",
        lower_bound=0,
        upper_bound=2**63 - 1,
    )


def check_flags() -> None:
    """The flags' mistakes that need no library: refused before the model loads."""
    cli.require("train", "test")
    cli.check_installed("plot", "matplotlib", extra="plot")


def run() -> dict:
    from elmo_jax.analysis import probe_files  # after flag parsing, so --help is fast
    from elmo_jax.formats.model_source import ModelSource

    results = probe_files.probe_files(
        ModelSource(FLAGS.model, FLAGS.options, FLAGS.weights),
        FLAGS.train,
        FLAGS.test,
        output=FLAGS.output,
        plot_path=FLAGS.plot,
        overwrite=FLAGS.overwrite,
        seed=FLAGS.seed,
        batch_tokens=FLAGS.batch_tokens,
    )
    print(probe_files.table(results))
    probe_files.write_outputs(results, FLAGS.output, FLAGS.plot)
    return results


def main(argv) -> None:
    cli.run_main(run, argv, check=check_flags)


def start() -> None:
    """The command: `elmo-probe` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.probe`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
