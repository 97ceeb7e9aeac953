"""What each layer of a biLM knows: nearest-neighbour and linear probes of every layer (Peters et al. 2018,
section 5.3) on labelled targets.

    python -m elmo_jax.probe --model=MODEL_DIR --train=probes/wordnet/wsd.train.jsonl \\
        --test=probes/wordnet/wsd.test.jsonl [--output=results.json] [--plot=layers.png]

Inputs are JSON lines (`{"tokens": [...], "target": i or [start, end), "label": ...}`) or CoNLL-style
`TOKEN<TAB>LABEL` files (see `elmo_jax.features.probe_data`). For the token layer, each LSTM layer and
a learned mix, prints a table of the test accuracy of a 1-nearest-neighbour classifier (cosine, among
training items of the same word) and of a linear classifier, with the majority-class and per-word
baselines; `--output` writes the same as JSON (`elmo_jax.features.probing.probe`), `--plot` a bar chart.
Every path may be gs://BUCKET/PATH; the outputs are written complete or not at all (`storage`).
"""

from __future__ import annotations

import json

from absl import flags

from elmo_jax import cli
from elmo_jax.formats.output_paths import Artifact

FLAGS = flags.FLAGS


def define_flags() -> None:
    cli.define_model_flags()
    flags.DEFINE_string("train", None, "Labelled training targets (.jsonl or CoNLL).")
    flags.DEFINE_string("test", None, "Labelled test targets (.jsonl or CoNLL).")
    flags.DEFINE_string("output", None, "Write the results as JSON here.")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --output or --plot, if it is what this command writes.")
    flags.DEFINE_string("plot", None, "Write a bar chart of the accuracies here (.png; needs matplotlib).")
    flags.DEFINE_integer("seed", 0, "Seed of the linear classifiers (their initialisation and batches).")
    flags.DEFINE_integer("batch_tokens", 4096, "Padded tokens per embedding batch.")


def run() -> dict:
    from elmo_jax.features import probing  # after flag parsing, so --help is fast
    from elmo_jax.features.probe_data import read_probe_file
    from elmo_jax.formats import output_paths
    from elmo_jax.formats.model_source import load_model

    for name in ("train", "test"):
        if not getattr(FLAGS, name):
            raise ValueError(f"--{name} is required: a .jsonl or CoNLL file of labelled targets")
    inputs = [p for p in (FLAGS.train, FLAGS.test, FLAGS.model, FLAGS.options, FLAGS.weights) if p]
    outputs = {"output": (FLAGS.output, _JSON_RESULTS), "plot": (FLAGS.plot, _PLOT)}
    for flag, (path, artifact) in outputs.items():
        if path:
            output_paths.check_output(path, artifact, overwrite=FLAGS.overwrite, inputs=inputs, flag=f"--{flag}")
    train, test = read_probe_file(FLAGS.train), read_probe_file(FLAGS.test)
    params = load_model(FLAGS.model, FLAGS.options, FLAGS.weights)
    results = probing.probe(params, train, test, seed=FLAGS.seed, batch_tokens=FLAGS.batch_tokens)
    print(table(results))
    write_outputs(results, FLAGS.output, FLAGS.plot)
    return results


def write_outputs(results: dict, output: str | None, plot_path: str | None) -> None:
    """The results as JSON at `output` and their bar chart at `plot_path` (each optional; local or gs://,
    each written complete or not at all)."""
    from elmo_jax.formats import storage

    if output:
        storage.write_bytes(output, (json.dumps(results, indent=1) + "\n").encode("utf-8"))
    if plot_path:
        plot(results, plot_path)


def _is_results_json(path: str) -> bool:
    from elmo_jax.formats import storage

    try:
        return {"layers", "baselines", "counts"} <= set(json.loads(storage.read_bytes(path)))
    except (OSError, ValueError, TypeError):
        return False


def _is_png(path: str) -> bool:
    from elmo_jax.formats import storage

    try:
        with storage.open_file(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


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


def plot(results: dict, path: str) -> None:
    """A grouped bar chart: 1-NN and linear accuracy per layer, the baselines as lines (written complete or
    not at all, locally or to gs://)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from elmo_jax.formats import storage

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
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    storage.write_file(path, lambda f: f.write(buffer.getvalue()))


_JSON_RESULTS = Artifact("a probe results JSON file", is_directory=False, recognizes=_is_results_json)
_PLOT = Artifact("a PNG image", is_directory=False, recognizes=_is_png)


def main(argv) -> None:
    cli.run_main(run, argv)


if __name__ == "__main__":
    cli.start(main, define_flags)
