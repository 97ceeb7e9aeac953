"""Tokens/s of the training batch stream on one core, against the tokens/s training consumes.

    python bench/data_throughput.py                         # demo + 1B-Word-like, profile, demo train step
    python bench/data_throughput.py --sentences=5500000 --seconds=30    # 16 shards, closer to a real 1B Word

Two corpora, each read the way training reads it (ArrayRecord shards written by
`local_corpus.prepare_local_corpus`, opened with `local_corpus.open_split`) through `data.BiLMBatchStream` with
seed shuffling: both directions, whole windows including the character ids.
  demo     the embedded default corpus (Python standard-library docstrings) exactly as configs/demo.py
           trains on it (`training_data.open_training_data`: its vocabulary, its 32 x 20 windows);
  1b-like  a synthetic corpus with 1B Word Benchmark statistics, generated with NumPy in a temporary
           directory: --sentences sentences of 1 + NegativeBinomial(3) tokens (mean --mean_tokens),
           words drawn Zipf-Mandelbrot (p ~ 1/(rank + 2.7)) from --types types whose lengths grow with
           the rank like English (about 5 letters per token, 8 per type); vocabulary `vocab.build_vocab`
           of its counts; 128 x 20 windows.
Both streams draw state resets as training does (`state_reset_probability` of configs/default.py).

Tokens are target tokens of both directions: the true entries of the forward and the backward
window's mask (every window is full with repeat=True, so 2 x B x T per window), as the trainer's
tokens/s counts them. Each stream is timed for --seconds after --warmup_windows windows. Corpus
preparation (building the text, writing ArrayRecord, counting the vocabulary) is timed separately
and excluded. "+device_batch" adds `batch_feed.device_batch` (stacking the directions, the char CNN's
content bucket), the rest of the trainer's host work per step.

One core: the stream runs with the main thread pinned to one core (`os.sched_setaffinity`); the
threads it starts while pinned (array_record's reader pool, started per read) inherit the pin. The
JAX runtime is started before pinning, and the pin is lifted before training is timed, so training
uses every core. tokens/CPU-s (tokens per second of this process's CPU time in `next(stream)`) is the
figure least disturbed by other processes on a busy machine; CPU/wall below 1 means the core was shared.

Training consumption: the jitted `train_step` of configs/demo.py (its model, batch, vocabulary and
negatives) on one real window of the demo stream, compile excluded, best of --train_steps steps,
on all cores. The issue's targets: stream >= 10x that, and > 200k tokens/s on the 1B-Word-like corpus.

--profile: cProfile of the 1B-Word-like stream broken down by stage (cProfile's overhead inflates
the share of many small Python calls); the cost of reading records in blocks of 1, 16 (the stream's
read-ahead per row) and 2048 sentences; and the same stream over the sentences held in a Python
list, whose difference to the real one is what reading costs, unprofiled.

Corpus size matters: a random-access read of ArrayRecord costs time in proportion to the records of
every shard it touches, so the default corpus (one shard) reads faster than a real 1B Word corpus
(~64 shards of ~470k sentences). The stream must be timed over many read-ahead periods
(--seconds): a stream that reads in large bursts would otherwise be timed between two bursts.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pathlib
import pstats
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/, configs/

import jax
import numpy as np
from absl import app, flags, logging

from bench.common import platform_line
from bench.synthetic_corpus import write_synthetic_corpus
from configs import demo as demo_config
from elmo_jax.data import batch_stream, local_corpus, vocab_builder
from elmo_jax.data.training_corpus import open_training_data
from elmo_jax.training import settings
from elmo_jax.training.batch_feed import device_batch
from elmo_jax.training.train_step import init_train_state, train_step

FLAGS = flags.FLAGS
flags.DEFINE_list("corpora", ["demo", "1b-like"], "Streams to time: demo, 1b-like.")
flags.DEFINE_integer("sentences", 300_000, "1B-Word-like corpus: sentences.")
flags.DEFINE_integer("types", 100_000, "1B-Word-like corpus: word types.")
flags.DEFINE_float("mean_tokens", 27.0, "1B-Word-like corpus: mean tokens per sentence.")
flags.DEFINE_integer("batch_size", 128, "1B-Word-like stream: rows B.")
flags.DEFINE_integer("unroll_steps", 20, "1B-Word-like stream: window length T.")
flags.DEFINE_float("seconds", 10.0, "Timed seconds per stream (after the warm-up).")
flags.DEFINE_integer("warmup_windows", 30, "Windows read before timing (read-ahead, page cache, char cache).")
flags.DEFINE_integer("core", -1, "Core to pin the stream to (-1: the highest core this process may use).")
flags.DEFINE_bool("pin", True, "Pin the stream to one core.")
flags.DEFINE_integer("train_steps", 10, "Timed demo train steps (after compile and one warm-up step).")
flags.DEFINE_bool("profile", True, "Profile the 1B-Word-like stream and time record reads.")
flags.DEFINE_integer("profile_windows", 40, "Windows under cProfile.")
flags.DEFINE_string("workdir", "", "Keep the prepared corpora here and reuse them ('' = a temporary directory).")

TARGET_RATIO = 10.0  # stream tokens/s over the demo training's
TARGET_1B_TOKENS_PER_S = 200_000.0
IN_MEMORY_LIMIT = 2_000_000  # sentences held in a Python list for the comparison without reads


# ----------------------------------------------------------------------------- preparation


def prepare_demo(workdir: str):
    """The demo config's data exactly as `train_and_evaluate` opens it; (config, TrainingData, seconds)."""
    config = demo_config.get_config()
    start = time.perf_counter()
    data = open_training_data(config.data, os.path.join(workdir, "demo"))
    seconds = time.perf_counter() - start
    print(
        f"  demo: {len(data.train):,} sentences, vocabulary {len(data.vocab):,}; default corpus + ArrayRecord + "
        f"vocabulary {seconds:.1f} s"
    )
    return config, data, seconds


def prepare_1b_like(workdir: str):
    """(sentences, vocab, {stage: seconds}, text path) of the synthetic corpus, through the real preparation path."""
    times = {}
    start = time.perf_counter()
    path = os.path.join(workdir, f"synthetic_{FLAGS.sentences}_{FLAGS.types}_{FLAGS.mean_tokens:g}.txt")
    counts = write_synthetic_corpus(path, FLAGS.sentences, FLAGS.types, FLAGS.mean_tokens)
    times["generate"] = time.perf_counter() - start
    start = time.perf_counter()
    corpus = local_corpus.prepare_local_corpus(path, None, os.path.join(workdir, "prepared"), name="synthetic")
    sentences = local_corpus.open_split(corpus, "train")
    times["ArrayRecord"] = time.perf_counter() - start
    shards = [shard.records for shard in corpus.splits["train"]]
    print(
        f"  1b-like ArrayRecord: {len(shards)} shard(s) of {min(shards):,}-{max(shards):,} sentences "
        f"({local_corpus.SHARD_BYTES >> 20} MiB of text per shard: the 1B Word corpus makes ~64 shards of ~470k)"
    )
    start = time.perf_counter()
    vocab = vocab_builder.build_vocab(counts)
    times["vocabulary"] = time.perf_counter() - start
    print(f"  1b-like: vocabulary {len(vocab):,}; " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    return sentences, vocab, times, path


# ----------------------------------------------------------------------------- measurements


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@contextlib.contextmanager
def one_core(core: int):
    """Pins the calling thread (and threads it starts meanwhile) to one core; yields the core, or None."""
    if not FLAGS.pin or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    allowed = os.sched_getaffinity(0)
    chosen = max(allowed) if core < 0 else core
    if chosen not in allowed:
        raise ValueError(f"--core={core}: this process may only run on cores {sorted(allowed)}")
    os.sched_setaffinity(0, {chosen})
    try:
        yield chosen
    finally:
        os.sched_setaffinity(0, allowed)


def time_stream(stream: batch_stream.BiLMBatchStream, seconds: float, warmup: int) -> dict[str, float]:
    """Reads windows for `seconds` after `warmup`; rates of the stream alone and with `device_batch`."""
    max_chars = stream.max_chars
    for _ in range(warmup):
        device_batch(next(stream), max_chars)
    cache = getattr(stream, "_char_cache", {})  # private; only to report how often a token misses it
    cached_before = len(cache)
    tokens = windows = 0
    stream_s = stream_cpu = batch_s = 0.0
    cpu_start, start = time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds or windows < 5:
        t0, c0 = time.perf_counter(), time.process_time()
        window = next(stream)
        t1, c1 = time.perf_counter(), time.process_time()
        device_batch(window, max_chars)
        stream_s, stream_cpu = stream_s + t1 - t0, stream_cpu + c1 - c0
        batch_s += time.perf_counter() - t1
        tokens += sum(int(window[d]["mask"].sum()) for d in batch_stream.DIRECTIONS)
        windows += 1
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - start
    return {
        "windows": windows,
        "tokens": tokens,
        "tokens_per_s": tokens / stream_s,
        "with_batch": tokens / (stream_s + batch_s),
        "per_cpu_s": tokens / stream_cpu,
        "cpu_over_wall": cpu / wall,
        "misses_per_k": 1000.0 * (len(cache) - cached_before) / tokens,
    }


def time_demo_training(config, vocab_size: int, window, steps: int) -> dict[str, float]:
    """The demo config's `train_step` on one stream window, as the trainer calls it (NumPy batch in)."""
    cfg = settings.step_config(config, vocab_size)
    optimizer = settings.optimizer(config)
    state = init_train_state(jax.random.key(config.seed), cfg, optimizer, config.batch_size)
    batch, positions = device_batch(window, cfg.model.max_characters_per_token)
    tokens = int(batch["mask"].sum())
    start = time.perf_counter()
    for _ in range(2):  # compile, then one warm-up step
        state, metrics = train_step(state, batch, cfg=cfg, optimizer=optimizer, content_positions=positions)
        jax.block_until_ready((state, metrics))
    first_two = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, metrics = train_step(state, batch, cfg=cfg, optimizer=optimizer, content_positions=positions)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - start)
    best = min(times)
    return {
        "tokens": tokens,
        "best_s": best,
        "median_s": statistics.median(times),
        "tokens_per_s": tokens / best,
        "compile_s": first_two - 2 * best,
    }


# ----------------------------------------------------------------------------- profile

# (label, depth, file suffix or "~" for builtins, function name, "cum" or "own")
PROFILE_ROWS = (
    (
        "reading sentences (_Direction.text; refills read up to 256 sentences per low row at once)",
        0,
        "elmo_jax/data/batch_stream.py",
        "text",
        "cum",
    ),
    (
        "ArrayRecord __getitems__ (a new Python thread pool per call, around the C++ read)",
        1,
        "array_record_data_source.py",
        "__getitems__",
        "cum",
    ),
    ("grain index_shuffle", 1, "~", "index_shuffle", "cum"),
    (
        "encoding sentences (BiLMBatchStream._encode, without the read)",
        0,
        "elmo_jax/data/batch_stream.py",
        "_encode",
        "cum-text",
    ),
    ("str.split", 1, "~", "<method 'split' of 'str' objects>", "cum"),
    (
        "(vocabulary id, char row) per token (BiLMBatchStream._word_entry, one cached lookup)",
        1,
        "elmo_jax/data/batch_stream.py",
        "_word_entry",
        "cum",
    ),
    ("of which token_to_raw_ids (cache misses)", 2, "elmo_jax/model/chars.py", "token_to_raw_ids", "cum"),
    (
        "window assembly (BiLMBatchStream._window, own time: per-row loop, slice copies)",
        0,
        "elmo_jax/data/batch_stream.py",
        "_window",
        "own",
    ),
)


def profile_stream(stream: batch_stream.BiLMBatchStream, windows: int) -> None:
    """cProfile of `windows` windows, as a table of PROFILE_ROWS (rows name data.py's private methods)."""
    profiler = cProfile.Profile()
    tokens = 0
    profiler.enable()
    for _ in range(windows):
        window = next(stream)
        tokens += sum(int(window[d]["mask"].sum()) for d in batch_stream.DIRECTIONS)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)

    def find(suffix: str, name: str) -> tuple[int, float, float]:
        hits = [
            (v[1], v[2], v[3])
            for (file, _, func), v in stats.items()
            if (name in func if suffix == "~" else func == name and file.endswith(suffix))
        ]
        return (sum(h[0] for h in hits), sum(h[1] for h in hits), sum(h[2] for h in hits)) if hits else (0, 0.0, 0.0)

    total = find("elmo_jax/data/batch_stream.py", "__next__")[2]
    print(
        f"\ncProfile of the 1b-like stream: {windows} windows, {tokens:,} tokens in {total:.2f} s under the "
        f"profiler ({tokens / total:,.0f} tokens/s; main thread only)"
    )
    print(f"  {'stage':86}{'calls':>9}{'s':>7}{'share':>7}{'us/token':>9}")
    for label, depth, suffix, name, kind in PROFILE_ROWS:
        calls, own, cum = find(suffix, name)
        seconds = own if kind == "own" else cum
        if kind == "cum-text":
            seconds = cum - find("elmo_jax/data/batch_stream.py", "text")[2]
        print(
            f"  {'  ' * depth + label:86}{calls:>9,}{seconds:>7.2f}{seconds / total:>7.0%}"
            f"{1e6 * seconds / tokens:>9.2f}"
        )


def time_reads(sentences, n_calls: int = 30) -> None:
    """us per sentence of `__getitems__` on random indices, in blocks of 1, 16 and 2048, and per target token."""
    rng = np.random.default_rng(1)
    tokens_per_sentence = np.mean([len(sentences[int(i)].split()) + 1 for i in rng.integers(0, len(sentences), 500)])
    print(
        f"\nreading {type(sentences).__name__} records at random (the stream's path; "
        f"{tokens_per_sentence:.1f} targets per sentence and direction):"
    )
    for block in (1, batch_stream._Direction.READ_AHEAD, 2048):
        calls = max(3, n_calls * 16 // block)
        keys = [rng.integers(0, len(sentences), block).tolist() for _ in range(calls + 1)]
        sentences.__getitems__(keys[0])
        start = time.perf_counter()
        for k in keys[1:]:
            sentences.__getitems__(k)
        per_sentence = (time.perf_counter() - start) / (calls * block)
        print(
            f"  {block:>5} per call: {1e3 * per_sentence * block:8.2f} ms per call, {1e6 * per_sentence:7.1f} us "
            f"per sentence, {1e6 * per_sentence / tokens_per_sentence:5.2f} us per target token"
        )


def without_reads(path: str, vocab, with_reads: dict[str, float]) -> None:
    """The 1b-like stream over the same sentences held in a Python list: what reading them costs, unprofiled.

    At most IN_MEMORY_LIMIT sentences (the first ones) are held, so a full-size corpus fits in memory.
    """
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line, _ in zip(f, range(IN_MEMORY_LIMIT))]
    stream = batch_stream.BiLMBatchStream(
        lines,
        vocab,
        batch_size=FLAGS.batch_size,
        unroll_steps=FLAGS.unroll_steps,
        seed=0,
        reset_probability=demo_config.get_config().state_reset_probability,
    )
    r = time_stream(stream, FLAGS.seconds / 2, FLAGS.warmup_windows)
    total, rest = 1e6 / with_reads["per_cpu_s"], 1e6 / r["per_cpu_s"]
    print(
        f"\nthe same stream over {len(lines):,} of the sentences in a Python list (no ArrayRecord reads): "
        f"{r['tokens_per_s']:,.0f} tokens/s, {r['per_cpu_s']:,.0f} tokens/CPU-s "
        f"(CPU/wall {r['cpu_over_wall']:.2f})"
    )
    print(
        f"  per target token, in CPU time: {total:.2f} us with reads = {total - rest:.2f} us reading "
        f"({(total - rest) / total:.0%}) + {rest:.2f} us encoding and windowing"
    )


# ----------------------------------------------------------------------------- main


def demo_stream(config, demo) -> batch_stream.BiLMBatchStream:
    """The batch stream `train_and_evaluate` builds for configs/demo.py (one process)."""
    return batch_stream.BiLMBatchStream(
        demo.train,
        demo.vocab,
        batch_size=config.batch_size,
        unroll_steps=config.unroll_steps,
        seed=config.seed,
        max_characters_per_token=config.model.max_characters_per_token,
        reset_probability=config.state_reset_probability,
    )


def time_streams(streams: dict) -> dict[str, dict[str, float]]:
    """Times each (stream, sentences, vocabulary size, preparation seconds) and prints a table row for it."""
    header = (
        f"{'corpus':9}{'BxT':>8}{'sentences':>11}{'vocab':>9}{'prep s':>8}{'windows':>9}"
        f"{'tokens/s':>10}{'+dev_batch':>11}{'tok/CPU-s':>11}{'CPU/wall':>9}{'misses/ktok':>12}"
    )
    print(header)
    print("-" * len(header))
    results = {}
    for name, (stream, n_sentences, n_vocab, prep) in streams.items():
        r = results[name] = time_stream(stream, FLAGS.seconds, FLAGS.warmup_windows)
        shape = f"{stream.batch_size}x{stream.unroll_steps}"
        print(
            f"{name:9}{shape:>8}{n_sentences:>11,}{n_vocab:>9,}{prep:>8.1f}{r['windows']:>9,}"
            f"{r['tokens_per_s']:>10,.0f}{r['with_batch']:>11,.0f}{r['per_cpu_s']:>11,.0f}"
            f"{r['cpu_over_wall']:>9.2f}{r['misses_per_k']:>12.1f}",
            flush=True,
        )
    return results


def print_targets(results: dict[str, dict[str, float]], train: dict[str, float]) -> None:
    print("\ntargets:")
    for name, r in results.items():
        ratio, per_cpu = r["tokens_per_s"] / train["tokens_per_s"], r["per_cpu_s"] / train["tokens_per_s"]
        print(
            f"  {name:8} stream / demo training: {ratio:6.1f}x  (target >= {TARGET_RATIO:g}x: "
            f"{'met' if ratio >= TARGET_RATIO else 'NOT met'}; per CPU-s {per_cpu:.1f}x)"
        )
    if "1b-like" in results:
        rate = results["1b-like"]["tokens_per_s"]
        print(
            f"  1b-like  stream: {rate:,.0f} tokens/s  (target > {TARGET_1B_TOKENS_PER_S:,.0f}: "
            f"{'met' if rate > TARGET_1B_TOKENS_PER_S else 'NOT met'}; per CPU-s "
            f"{results['1b-like']['per_cpu_s']:,.0f})"
        )


def main(argv):
    del argv
    logging.set_verbosity(logging.ERROR)
    unknown = sorted(set(FLAGS.corpora) - {"demo", "1b-like"})
    if unknown:
        raise app.UsageError(f"--corpora: unknown {unknown}; expected demo and/or 1b-like")
    # Starts the JAX runtime (and its thread pool) before any pinning, so training is not pinned.
    print(f"{platform_line()}; {os.cpu_count()} cores, may use {usable_cores()}")
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="elmo_data_throughput_")
    os.makedirs(workdir, exist_ok=True)
    try:
        print(f"preparing in {workdir} (excluded from the rates):")
        config, demo, demo_prep = prepare_demo(workdir)
        streams = {}
        if "demo" in FLAGS.corpora:
            streams["demo"] = (demo_stream(config, demo), len(demo.train), len(demo.vocab), demo_prep)
        if "1b-like" in FLAGS.corpora:
            sentences, vocab, times, text_path = prepare_1b_like(workdir)
            stream = batch_stream.BiLMBatchStream(
                sentences,
                vocab,
                batch_size=FLAGS.batch_size,
                unroll_steps=FLAGS.unroll_steps,
                seed=0,
                reset_probability=config.state_reset_probability,
            )
            streams["1b-like"] = (stream, len(sentences), len(vocab), sum(times.values()))

        with one_core(FLAGS.core) as core:
            print(
                f"\nbatch stream, {f'pinned to core {core}' if core is not None else 'not pinned'}; tokens = "
                f"target tokens of both directions; {FLAGS.warmup_windows} warm-up windows, then "
                f"{FLAGS.seconds:g} s each"
            )
            results = time_streams(streams)
            if FLAGS.profile and "1b-like" in streams:
                profile_stream(streams["1b-like"][0], FLAGS.profile_windows)
                time_reads(sentences)
                without_reads(text_path, vocab, results["1b-like"])

        train = time_demo_training(config, len(demo.vocab), next(demo_stream(config, demo)), FLAGS.train_steps)
        print(
            f"\ndemo training (configs/demo.py: B x T {config.batch_size}x{config.unroll_steps}, vocabulary "
            f"{len(demo.vocab):,}, {config.n_negative_samples} negatives) on {jax.devices()[0].device_kind}, "
            f"{usable_cores()} cores: step {1e3 * train['best_s']:.1f} ms best, "
            f"{1e3 * train['median_s']:.1f} ms median of {FLAGS.train_steps}; {train['tokens_per_s']:,.0f} tokens/s "
            f"(best; compile {train['compile_s']:.1f} s excluded)"
        )
        print_targets(results, train)
    finally:
        if not FLAGS.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
