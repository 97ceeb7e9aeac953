"""Probing from files, as `python -m elmo_jax.probe` does: labelled targets and a model in (`probe_files`),
the results out as a table (`table`), a JSON file and a bar chart (`write_outputs`). Every path may be
gs://BUCKET/PATH; an output is written complete or not at all (`storage`), and replaces an existing
file only with `overwrite` and only if it is what this module writes (`RESULTS_JSON`, `PLOT`).
"""

from __future__ import annotations

import io
import json

from elmo_jax import storage
from elmo_jax.analysis import probing
from elmo_jax.analysis.probe_data import ProbeItem, read_probe_file
from elmo_jax.formats import output_paths
from elmo_jax.formats.model_source import ModelSource


def probe_files(
    model: ModelSource,
    train_path: str | None,
    test_path: str | None,
    *,
    output: str | None = None,
    plot_path: str | None = None,
    overwrite: bool = False,
    seed: int = 0,
    batch_tokens: int = 4096,
) -> dict:
    """`probing.probe` of the biLM `model` names, trained on the targets of `train_path` and scored on
    those of `test_path` (.jsonl or CoNLL, `probe_data`). The outputs are checked before anything is
    read (then written by `write_outputs`).

    Args:
      model: --model, or --options and --weights.
      train_path, test_path: --train and --test (both required).
      output, plot_path: where `write_outputs` will write the JSON results and the chart, if anywhere.
      overwrite: they may replace a file of their kind.
      seed, batch_tokens: see `probing.probe`.

    Returns:
      `probing.probe`'s results.
    """
    outputs = (("output", output, RESULTS_JSON), ("plot", plot_path, PLOT))
    train, test = read_targets(model, train_path, test_path, outputs, overwrite=overwrite)
    return probing.probe(model.load(), train, test, seed=seed, batch_tokens=batch_tokens)


def read_targets(
    model: ModelSource,
    train_path: str | None,
    test_path: str | None,
    outputs: tuple[tuple[str, str | None, output_paths.Artifact], ...],
    *,
    overwrite: bool,
) -> tuple[list[ProbeItem], list[ProbeItem]]:
    """The training and test targets of a command that reads labelled targets (--train and --test, both
    required), once each (flag, path, artifact) of `outputs` given is known writable: nothing is read
    before a command is sure it can write its results."""
    for name, flag, path in (("train_path", "train", train_path), ("test_path", "test", test_path)):
        if not path:
            raise ValueError(f"{name} is required (the command's --{flag}): a .jsonl or CoNLL file of labelled targets")
    inputs = [train_path, test_path, *model.paths]
    for flag, path, artifact in outputs:
        if path:
            output_paths.check_output(path, artifact, overwrite=overwrite, inputs=inputs, flag=f"--{flag}")
    return read_probe_file(train_path), read_probe_file(test_path)


def table(results: dict) -> str:
    """The accuracies as a small Markdown table (percent)."""
    lines = ["| layer | 1-NN | linear |", "|---|---|---|"]
    for name, scores in results["layers"].items():
        lines.append(f"| {name} | {100 * scores['nearest_neighbour']:.1f} | {100 * scores['linear']:.1f} |")
    base, counts = results["baselines"], results["counts"]
    lines.append(f"| majority class | {100 * base['majority']:.1f} | |")
    lines.append(f"| most frequent label of the word | {100 * base['per_word']:.1f} | |")
    weights = ", ".join(f"{w:.2f}" for w in results["mix_weights"])
    lines.append("")
    lines.append(
        f"{counts['train']} training and {counts['test']} test targets, {counts['labels']} labels, "
        f"{counts['test_unseen_words']} test targets of unseen words; learnt mix softmax(s) = [{weights}], "
        f"gamma {results['mix_gamma']:.2f}"
    )
    return "\n".join(lines)


def write_outputs(results: dict, output: str | None, plot_path: str | None) -> None:
    """The results as JSON at `output` and their bar chart at `plot_path` (each optional; local or gs://,
    each written complete or not at all)."""
    write_results(results, output, plot_path, plot)


def write_results(results: dict, output: str | None, plot_path: str | None, plot_results) -> None:
    """`results` as JSON at `output` and `plot_results(results, plot_path)` (each optional)."""
    if output:
        storage.write_bytes(output, (json.dumps(results, indent=1) + "\n").encode("utf-8"))
    if plot_path:
        plot_results(results, plot_path)


def save_png(figure, path: str) -> None:
    """A matplotlib figure as PNG at `path` (written complete or not at all, locally or to gs://); closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    storage.write_file(path, lambda f: f.write(buffer.getvalue()))


def plot(results: dict, path: str) -> None:
    """A grouped bar chart: 1-NN and linear accuracy per layer, the baselines as lines (written complete or
    not at all, locally or to gs://)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["layers"])
    x = range(len(names))
    figure, axes = plt.subplots(figsize=(1.6 * len(names) + 2, 3.5))
    for offset, (method, label) in enumerate((("nearest_neighbour", "1-NN"), ("linear", "linear"))):
        axes.bar(
            [i + 0.38 * offset - 0.19 for i in x],
            [100 * results["layers"][n][method] for n in names],
            width=0.38,
            label=label,
        )
    for name, style in (("majority", ":"), ("per_word", "--")):
        axes.axhline(100 * results["baselines"][name], linestyle=style, color="gray", label=name.replace("_", " "))
    axes.set(xticks=list(x), xticklabels=names, ylabel="test accuracy (%)")
    axes.legend(fontsize="small", loc="lower right")
    figure.tight_layout()
    save_png(figure, path)


def results_json(description: str, keys: set[str]) -> output_paths.Artifact:
    """The artifact of a results JSON file: an object holding at least `keys`."""

    def recognizes(path: str) -> bool:
        try:
            return keys <= set(json.loads(storage.read_bytes(path)))
        except (OSError, ValueError, TypeError):
            return False

    return output_paths.Artifact(description, is_directory=False, recognizes=recognizes)


def _is_png(path: str) -> bool:
    try:
        with storage.open_file(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


RESULTS_JSON = results_json("a probe results JSON file", {"layers", "baselines", "counts"})
PLOT = output_paths.Artifact("a PNG image", is_directory=False, recognizes=_is_png)
