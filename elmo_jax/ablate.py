"""The paper's ablations on your labelled targets: which biLM layers a task model should use (Peters et
al. 2018, Table 2) and how much task data ELMo saves (section 5.4).

    python -m elmo_jax.ablate --model=MODEL_DIR --train=probes/wordnet/pos.train.jsonl \\
        --test=probes/wordnet/pos.test.jsonl [--seeds=3] [--output=ablation.json] [--plot=ablation.png]

Inputs are what `python -m elmo_jax.probe` reads (JSON lines of targets, or CoNLL-style TOKEN<TAB>LABEL
files). The same small task model (a window classifier over the target and its neighbours, with word
vectors trained on the task's data: `elmo_jax.analysis.ablation_model`) is trained without ELMo, with one
layer, the average, and a learned mix with and without L2 on its weights, for each seed; then the baseline
and the learned mix on 1%, 10%, 30% and 100% of the training items (`--fractions`), with learning curves.
Prints the tables; `--output` writes the figures as JSON, `--plot` the sample-efficiency plot (PNG).
Every path may be gs://BUCKET/PATH; outputs are written complete or not at all.
"""

from __future__ import annotations

from absl import flags

from elmo_jax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    cli.define_labelled_targets_flags()
    flags.DEFINE_string("plot", None, "Write the sample-efficiency plot here (.png; needs matplotlib, the plot extra).")
    flags.DEFINE_list(
        "variants",
        "baseline,token,top,average,learned,learned_l2",
        "The layer ablation's variants: baseline (no ELMo), token, top, average, learned (a learned scalar mix), "
        "learned_l2 (the same with the paper's L2 of 0.001 on its weights).",
    )
    # Seeds 0..N-1 go to NumPy's default_rng and jax.random.key (an int64): checked with the flags,
    # before the model loads (at least 1: `ablation.Settings`, for callers of the library too).
    flags.DEFINE_integer(
        "seeds",
        3,
        "Seeds per variant and fraction (the initialisation, batches and sub-sample).",
        upper_bound=2**63,
    )
    flags.DEFINE_list("fractions", "0.01,0.1,0.3,1", "Shares of the training items for the sample-efficiency sweep.")
    flags.DEFINE_integer("max_updates", 3000, "Most updates of one training run (early stopping usually ends it).")


def check_flags() -> None:
    """The flags' mistakes that need no library: refused before the model loads."""
    cli.require("train", "test")
    _fractions(FLAGS.fractions)
    cli.check_installed("plot", "matplotlib", extra="plot")


def run() -> dict:
    from elmo_jax.analysis import ablation, ablation_files  # after flag parsing, so --help is fast
    from elmo_jax.formats.model_source import ModelSource

    settings = ablation.Settings(
        variants=tuple(FLAGS.variants),
        seeds=FLAGS.seeds,
        fractions=_fractions(FLAGS.fractions),
        max_updates=FLAGS.max_updates,
    )
    results = ablation_files.ablate_files(
        ModelSource(FLAGS.model, FLAGS.options, FLAGS.weights),
        FLAGS.train,
        FLAGS.test,
        settings,
        output=FLAGS.output,
        plot_path=FLAGS.plot,
        overwrite=FLAGS.overwrite,
        batch_tokens=FLAGS.batch_tokens,
    )
    print(ablation_files.tables(results))
    ablation_files.write_outputs(results, FLAGS.output, FLAGS.plot)
    return results


def _fractions(values: list[str]) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in values)
    except ValueError:
        raise ValueError(f"--fractions must be numbers in (0, 1], found {','.join(values)!r}") from None


def main(argv) -> None:
    cli.run_main(run, argv, check=check_flags)


def start() -> None:
    """The command: `elmo-ablate` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.ablate`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
