"""The ablations from files, as `python -m elmo_jax.ablate` runs them: labelled targets and a model in
(`ablate_files`), the results out as Markdown tables (`tables`), a JSON file and a two-panel plot
(`write_outputs`). Paths may be gs://BUCKET/PATH; outputs are written complete or not at all, and replace
an existing file only with `overwrite` and only if it is what this module writes.
"""

from __future__ import annotations

from elmo_jax.analysis import ablation, probe_files
from elmo_jax.formats.model_source import ModelSource

# The paper's reference figures (Peters et al. 2018, Table 2: SQuAD dev F1) for the variants it reports.
PAPER_TABLE_2 = {"baseline": 80.8, "top": 84.7, "average": 85.0, "learned_l2": 85.2}


def ablate_files(
    model: ModelSource,
    train_path: str | None,
    test_path: str | None,
    settings: ablation.Settings,
    *,
    output: str | None = None,
    plot_path: str | None = None,
    overwrite: bool = False,
    batch_tokens: int = 4096,
) -> dict:
    """`ablation.ablate` of the biLM `model` on the targets of `train_path` and `test_path` (.jsonl or
    CoNLL). The settings and the outputs are checked before anything is read or trained."""
    settings.check()
    outputs = (("output", output, RESULTS_JSON), ("plot", plot_path, probe_files.PLOT))
    train, test = probe_files.read_targets(model, train_path, test_path, outputs, overwrite=overwrite)
    return ablation.ablate(model.load(), train, test, settings, batch_tokens=batch_tokens)


def tables(results: dict) -> str:
    """The layer ablation and the sample-efficiency sweep as Markdown tables (accuracy %, mean +- std)."""
    seeds = results["counts"]["seeds"]
    header = (
        f"| variant | test accuracy, % ({seeds} seed{'s' if seeds != 1 else ''}) | layer weights | paper (SQuAD F1) |"
    )
    lines = [header, "|---|---|---|---|"]
    for name, summary in results["variants"].items():
        weights = ", ".join(f"{w:.2f}" for w in summary.get("layer_weights", []))
        paper = PAPER_TABLE_2.get(name, "")
        lines.append(f"| {name} | {_score(summary)} | {weights} | {paper} |")
    lines += ["", "| training items | " + " | ".join(results["sample_efficiency"]) + " |"]
    lines.append("|---" * (1 + len(results["sample_efficiency"])) + "|")
    fractions = list(next(iter(results["sample_efficiency"].values())))
    for f in fractions:
        runs = [sweep[f] for sweep in results["sample_efficiency"].values()]
        lines.append(f"| {float(f):.0%} ({runs[0]['items']:,}) | " + " | ".join(_score(r) for r in runs) + " |")
    counts = results["counts"]
    lines += ["", f"{counts['train']:,} training and {counts['test']:,} test targets, {counts['labels']:,} labels"]
    return "\n".join(lines)


def _score(summary: dict) -> str:
    return f"{100 * summary['mean']:.1f} +- {100 * summary['std']:.1f}"


def write_outputs(results: dict, output: str | None, plot_path: str | None) -> None:
    """The results as JSON at `output` and their plot at `plot_path` (each optional)."""
    probe_files.write_results(results, output, plot_path, plot)


def plot(results: dict, path: str) -> None:
    """Two panels: test accuracy by share of the training items (mean, error bars one std), and the
    learning curves on all of them (mean test accuracy by update)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_size, by_update) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, sweep in results["sample_efficiency"].items():
        fractions = sorted(sweep, key=float)
        by_size.errorbar(
            [100 * float(f) for f in fractions],
            [100 * sweep[f]["mean"] for f in fractions],
            yerr=[100 * sweep[f]["std"] for f in fractions],
            marker="o",
            capsize=3,
            label=name,
        )
        curve = sweep[fractions[-1]]["curve"]
        by_update.plot([p[0] for p in curve], [100 * p[2] for p in curve], label=f"{name} ({float(fractions[-1]):.0%})")
    by_size.set(xscale="log", xlabel="training items used (%)", ylabel="test accuracy (%)")
    by_update.set(xlabel="updates", ylabel="test accuracy (%)")
    for axes in (by_size, by_update):
        axes.legend(fontsize="small", loc="lower right")
    figure.tight_layout()
    probe_files.save_png(figure, path)


RESULTS_JSON = probe_files.results_json("an ablation results JSON file", {"variants", "sample_efficiency", "counts"})
