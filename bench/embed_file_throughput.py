"""`python -m elmo_jax.embed_file` on realistic text: length bucketing against input-order batches, and memory.

    python bench/embed_file_throughput.py                    # small model, 2,000 sentences; memory at 10k / 100k
    python bench/embed_file_throughput.py --size=original --sentences=1000 --memory_sentences=

Throughput: a 1B-Word-like file (sentence lengths 1 + NegativeBinomial with mean 27 tokens, Zipfian
words; `bench/synthetic_corpus.py`) embedded with random weights of a published size, `--layers=all`,
float32, the same --batch_tokens both ways:
  bucketed     sentences grouped by (length bucket, char-width bucket): one batch shape per bucket;
  input order  batches in file order, each padded to its own longest sentence (AllenNLP's way): a new
               shape, hence a new XLA compile, for almost every batch.
Each is run twice in one process: "cold" includes the compiles, "warm" has every shape compiled.
Ratios are taken within this run.

Memory: fresh processes embed files of --memory_sentences sentences (a tiny model and --layers=top
float16, so that the pipeline, not the model, is measured) and report their peak RSS: it should not grow
with the file (`--sentence_index=false`: the AllenNLP-format index holds every sentence by design).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root

import jax
from absl import app, flags

import elmo_jax
from bench.common import platform_line
from bench.synthetic_corpus import write_synthetic_corpus
from elmo_jax.features import file_embedding as ef
from elmo_jax.formats.model_dir import write_model_dir

FLAGS = flags.FLAGS
flags.DEFINE_enum("size", "small", ["small", "medium", "original"], "Published model size (random weights).")
flags.DEFINE_integer("sentences", 2000, "Sentences in the throughput file.")
flags.DEFINE_integer("batch_tokens", 4096, "embed_file --batch_tokens.")
flags.DEFINE_list("memory_sentences", ["10000", "100000"], "File sizes for the peak-memory runs ('' to skip).")
flags.DEFINE_string("workdir", "", "Keep the generated files here ('' = a temporary directory).")

TINY = elmo_jax.BiLMConfig(
    char_embed_dim=4, filters=((1, 4), (2, 8), (3, 16)), n_highway=1, lstm_dim=64, projection_dim=16, n_layers=2
)


def time_embed_file(params, path: str, output: str, bucketing: bool) -> dict:
    options = ef.Options(layers="all", batch_tokens=FLAGS.batch_tokens, bucketing=bucketing)
    cold = ef.embed_file(params, path, output, options)
    warm = ef.embed_file(params, path, output, options)
    return {"cold": cold, "warm": warm}


def peak_rss_of_embed_file(model: str, path: str, output: str) -> tuple[float, float]:
    """(peak RSS MiB, seconds) of a fresh `python -m elmo_jax.embed_file` process."""
    script = (
        "import resource, runpy, sys\n"
        "try:\n    runpy.run_module('elmo_jax.embed_file', run_name='__main__')\n"
        "finally:\n    print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    )
    args = [
        f"--model={model}",
        f"--input={path}",
        f"--output={output}",
        "--layers=top",
        "--float16",
        "--sentence_index=false",
        "--progress=false",
        f"--batch_tokens={FLAGS.batch_tokens}",
    ]
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1])}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    kib = [int(line.split()[1]) for line in result.stderr.splitlines() if line.startswith("PEAK_KIB")][0]
    return kib / 1024, seconds


def main(argv):
    del argv
    print(platform_line())
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="embed_file_bench.")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, f"text-{FLAGS.sentences}.txt")
    write_synthetic_corpus(path, FLAGS.sentences, 100_000, 27.0)
    params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(FLAGS.size), jax.random.key(0))
    results = {
        name: time_embed_file(params, path, os.path.join(workdir, f"{name}.hdf5"), bucketing)
        for name, bucketing in (("bucketed", True), ("input order", False))
    }
    print(
        f"\n## {FLAGS.size}: {FLAGS.sentences:,} sentences, --batch_tokens={FLAGS.batch_tokens}, --layers=all float32\n"
    )
    print("| batching | run | seconds | sentences/s | tokens/s | batches | compiled shapes |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        for run, counts in runs.items():
            s = counts["seconds"]
            shapes = counts["compiled_shapes"] if run == "cold" else "(cached)"
            print(
                f"| {name} | {run} | {s:.1f} | {counts['sentences'] / s:,.1f} | {counts['tokens'] / s:,.0f} | "
                f"{counts['batches']} | {shapes} |"
            )
    for run in ("cold", "warm"):
        ratio = results["input order"][run]["seconds"] / results["bucketed"][run]["seconds"]
        print(f"bucketed vs input order, {run}: {ratio:.2f}x faster")

    sizes = [int(n) for n in FLAGS.memory_sentences if n]
    if sizes:
        model = os.path.join(workdir, "tiny-model")
        if not os.path.exists(model):
            write_model_dir(elmo_jax.init_params(TINY, jax.random.key(0)), model)
        print("\n## Peak memory of a fresh embed_file process (tiny model, --layers=top --float16)\n")
        print("| sentences | tokens | peak RSS MiB | seconds | output MiB |")
        print("|---|---|---|---|---|")
        for n in sizes:
            text = os.path.join(workdir, f"text-{n}.txt")
            counts = write_synthetic_corpus(text, n, 100_000, 27.0)
            output = os.path.join(workdir, f"memory-{n}.hdf5")
            rss, seconds = peak_rss_of_embed_file(model, text, output)
            print(
                f"| {n:,} | {sum(counts.values()):,} | {rss:,.0f} | {seconds:.1f} | "
                f"{os.path.getsize(output) / 2**20:,.0f} |"
            )
            os.unlink(output)


if __name__ == "__main__":
    app.run(main)
