"""`embed_file` against `embed` on the same sentences, compiled programs for 10,000 sentences, batching, memory.

    python bench/embed_file_throughput.py                       # small model, 2,000 sentences, 3 rounds
    python bench/embed_file_throughput.py --size=original --sentences=1000 --compile_sentences=0

Input: a 1B-Word-like file (sentence lengths 1 + NegativeBinomial with mean 27 tokens, Zipfian words;
`bench/synthetic_corpus.py`), random weights of a published size, --layers=all float32, one device.

1. embed_file vs embed, same sentences (the headline; issue #16 asks >= 0.85): the batches embed_file
   forms (length x width buckets of --batch_tokens) are built once as character ids, and `embed` runs
   them back to back (all dispatched, then waited for: pure device time, no host work at all); then
   `embed_file` embeds the file to HDF5 (reading, character ids, batching, the spool, the HDF5 file).
   Both are compiled first, then timed in alternation, --rounds times, so that the machine's load weighs
   on both alike; the ratio of tokens/s is taken per round and its median reported, with the load average.
   A third column runs embed_file with the token cache of a vocabulary (the words seen at least twice,
   as a model trained on such text would have), as it does when a model directory has a vocab.txt.
2. Compiled programs for a --compile_sentences file: XLA programs compiled by one cold embed_file run,
   counted in the jit cache, against the (length, width) buckets its sentences fall into.
3. Optional (--input_order): bucketed batches against input-order batches (AllenNLP's way), cold and warm.
4. Memory (--memory_sentences): peak RSS of fresh embed_file processes on growing files (a tiny model,
   --layers=top --float16, so that the pipeline is measured): it should not grow with the file.
"""

from __future__ import annotations

import os
import pathlib
import statistics
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
from elmo_jax.features import batch_runner
from elmo_jax.features.length_buckets import LENGTHS, BucketBatcher, Piece, length_bucket
from elmo_jax.features.token_ids import CharIdTable, width_bucket
from elmo_jax.files import file_embedding as ef
from elmo_jax.files import sentence_input
from elmo_jax.formats.model_dir import write_model_dir

FLAGS = flags.FLAGS
flags.DEFINE_enum("size", "small", ["small", "medium", "original"], "Published model size (random weights).")
flags.DEFINE_integer("sentences", 2000, "Sentences in the throughput file.")
flags.DEFINE_integer("batch_tokens", 4096, "embed_file --batch_tokens.")
flags.DEFINE_integer("rounds", 3, "Alternating embed / embed_file rounds.")
flags.DEFINE_integer("compile_sentences", 10_000, "Sentences of the compile-count file (0 to skip).")
flags.DEFINE_bool("input_order", False, "Also time input-order batches against bucketed ones.")
flags.DEFINE_list("memory_sentences", [], "File sizes for the peak-memory runs, e.g. 10000,100000.")
flags.DEFINE_string("workdir", "", "Keep the generated files here ('' = a temporary directory).")

TINY = elmo_jax.BiLMConfig(
    char_embed_dim=4, filters=((1, 4), (2, 8), (3, 16)), n_highway=1, lstm_dim=64, projection_dim=16, n_layers=2
)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1/5/15 min) on {os.cpu_count()} cores"


def file_batches(path: str, C: int) -> list:
    """The character-id batches embed_file forms for `path` on one device."""
    batcher, ids, batches = BucketBatcher(FLAGS.batch_tokens, C), CharIdTable(C), []
    for line, tokens in sentence_input.lines(path):
        if tokens:
            chars, width = ids.ids(tokens)
            batches += batcher.add(Piece(line, 0, chars, width_bucket(width, C)))
    return batches + list(batcher.flush())


def time_embed(params, batches) -> float:
    """Seconds of `embed` over the batches: all dispatched, then waited for (device time only)."""
    start = time.perf_counter()
    results = [elmo_jax.embed(params, batch.chars)[0] for batch in batches]
    jax.block_until_ready(results)
    return time.perf_counter() - start


def time_file(params, path: str, output: str, **kwargs) -> dict:
    options = ef.Options(layers="all", batch_tokens=FLAGS.batch_tokens, overwrite=True, devices=(0,))
    return ef.embed_file(params, path, output, options, **kwargs)


def throughput(params, path: str, workdir: str, vocabulary: list[str]) -> None:
    summary = sentence_input.scan(path)
    batches = file_batches(path, params.config.max_characters_per_token)
    padded = sum(b.chars.shape[0] * b.chars.shape[1] for b in batches)
    output = os.path.join(workdir, "out.hdf5")
    start = time.perf_counter()
    cold = time_file(params, path, output)
    cold_file = time.perf_counter() - start
    start = time.perf_counter()
    time_embed(params, batches)
    cold_embed = time.perf_counter() - start
    time_file(params, path, output, vocabulary=vocabulary)  # compiles the cache programs
    print(
        f"\n## {FLAGS.size}: embed_file vs embed on the same {summary.lines:,} sentences ({summary.tokens:,} tokens)\n"
    )
    print(
        f"{len(batches)} batches of --batch_tokens={FLAGS.batch_tokens} ({padded:,} padded token slots, "
        f"{summary.tokens / padded:.0%} real); cold (compiling): embed_file {cold_file:.1f} s, "
        f"embed {cold_embed:.1f} s; "
        f"{cold['compiled_shapes']} programs\n"
    )
    print("| round | embed tokens/s | embed_file tokens/s | ratio | embed_file + token cache tokens/s | ratio | load |")
    print("|---|---|---|---|---|---|---|")
    ratios, cached_ratios = [], []
    for r in range(FLAGS.rounds):
        embed_s = time_embed(params, batches)
        file_s = time_file(params, path, output)["seconds"]
        cached = time_file(params, path, output, vocabulary=vocabulary)
        ratios.append(embed_s / file_s)
        cached_ratios.append(embed_s / cached["seconds"])
        print(
            f"| {r + 1} | {summary.tokens / embed_s:,.0f} | {summary.tokens / file_s:,.0f} | {ratios[-1]:.2f} | "
            f"{summary.tokens / cached['seconds']:,.0f} | {cached_ratios[-1]:.2f} | {os.getloadavg()[0]:.1f} |"
        )
    print(
        f"\nembed_file / embed, median of {FLAGS.rounds} rounds: {statistics.median(ratios):.2f} "
        f"(with the token cache: {statistics.median(cached_ratios):.2f}; {cached['cached_types']:,} cached types); "
        f"{load()}"
    )


def compile_count(params, workdir: str) -> None:
    path = os.path.join(workdir, f"text-{FLAGS.compile_sentences}.txt")
    write_synthetic_corpus(path, FLAGS.compile_sentences, 100_000, 27.0, seed=1)
    C, ids, buckets = params.config.max_characters_per_token, CharIdTable(params.config.max_characters_per_token), set()
    for _, tokens in sentence_input.lines(path):
        if tokens:
            buckets.add((length_bucket(len(tokens), LENGTHS), width_bucket(ids.ids(tokens)[1], C)))
    program = batch_runner._chars_program(batch_runner.device_mesh(jax.local_devices()[:1]), "all", "float32")
    before = program._cache_size()
    counts = time_file(params, path, os.path.join(workdir, "compile.hdf5"))
    print(
        f"\n## Programs for {FLAGS.compile_sentences:,} sentences ({counts['tokens']:,} tokens), cold\n\n"
        f"{program._cache_size() - before} XLA programs compiled (jit cache; {counts['compiled_shapes']} batch "
        f"shapes used) for {len(buckets)} (length, width) buckets; {counts['batches']} batches, "
        f"{counts['seconds']:.1f} s including the compiles; {load()}"
    )


def input_order(params, path: str, workdir: str) -> None:
    print("\n## Bucketed vs input-order batches (AllenNLP's way), fresh shapes each\n")
    print("| batching | run | seconds | tokens/s | batches | compiled shapes |")
    print("|---|---|---|---|---|---|")
    for name, bucketing in (("input order", False),):
        options = ef.Options(layers="all", batch_tokens=FLAGS.batch_tokens, bucketing=bucketing, overwrite=True)
        for run in ("cold", "warm"):
            counts = ef.embed_file(params, path, os.path.join(workdir, "order.hdf5"), options)
            s = counts["seconds"]
            print(
                f"| {name} | {run} | {s:.1f} | {counts['tokens'] / s:,.0f} | {counts['batches']} | "
                f"{counts['compiled_shapes']} |"
            )


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
        "--overwrite",
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


def memory(workdir: str, sizes: list[int]) -> None:
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
        size = os.path.getsize(output) / 2**20
        print(f"| {n:,} | {sum(counts.values()):,} | {rss:,.0f} | {seconds:.1f} | {size:,.0f} |")
        os.unlink(output)


def main(argv):
    del argv
    print(f"{platform_line()}; {load()}")
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="embed_file_bench.")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, f"text-{FLAGS.sentences}.txt")
    counts = write_synthetic_corpus(path, FLAGS.sentences, 100_000, 27.0)
    vocabulary = [w for w, c in sorted(counts.items(), key=lambda item: -item[1]) if c >= 2]
    covered = sum(counts[w] for w in vocabulary) / sum(counts.values())
    print(
        f"  vocabulary for the token cache: {len(vocabulary):,} words seen twice or more, {covered:.0%} of the tokens"
    )
    params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(FLAGS.size), jax.random.key(0))
    if FLAGS.compile_sentences:  # first: every program it needs is compiled by it
        compile_count(params, workdir)
    throughput(params, path, workdir, vocabulary)
    if FLAGS.input_order:
        input_order(params, path, workdir)
    sizes = [int(n) for n in FLAGS.memory_sentences if n]
    if sizes:
        memory(workdir, sizes)


if __name__ == "__main__":
    app.run(main)
