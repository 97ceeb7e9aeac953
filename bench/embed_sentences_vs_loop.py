"""`embed_sentences` against the best simple hand loop of `embed` on the same sentences (issue #33).

    python bench/embed_sentences_vs_loop.py                                  # 1,000 and 50,000 sentences
    python bench/embed_sentences_vs_loop.py --sentences=1000,10000 --cpu_devices=2 --rounds=1

Model: the small published size (`BiLMConfig.preset("small")`) with random weights (`init_params`),
nothing downloaded; every layer returned (layers="all", AllenNLP's `ElmoEmbedder` output), float32.
Input: sentences of lognormal lengths clipped to 1-60 tokens (median ~15, mean ~17) from a fixed seed,
of words drawn Zipf-like from 20,000 types of 1-20 letters, the frequent ones short (so most sentences
need 16 character positions in the char CNN and some 24, as English text does).

Per case (a number of sentences, on one device or on all local devices):

- `embed_sentences` first call (in this process: it compiles what the earlier cases did not; the
  weights' finiteness check, which `embed` shares, is compiled before the first case) and
  second call (a new call, a new SentenceEmbedder: it should compile nothing), their seconds and
  tokens/s, the XLA compiles during each (`jax.monitoring`), its batches and their distinct shapes, and
  its padding: token positions run per real token (`stats["padded_tokens"] / stats["tokens"]`;
  boundaries excluded on both sides).
- The best simple hand loop: the sentences sorted by length, cut into batches of --batch_sizes
  sentences, each through `elmo_jax.embed(params, batch_to_ids(batch))` (padded to its own longest
  sentence, so one program per distinct batch shape) and fetched to NumPy, results put back in input
  order. Each size runs once to compile its shapes, then warm. `embed` runs on the default device only,
  so it is the same loop in the "all devices" cases.
- The ratio: `embed_sentences` warm tokens/s over the best warm hand loop's, taken per round (--rounds
  alternations of every hand loop and one more `embed_sentences` call), the median reported, so that the
  machine's load weighs on both sides alike.

--cpu_devices=N splits a CPU into N JAX devices (`jax_num_cpu_devices`), so that the "all devices" case
has more than one on a machine without accelerators. Results: bench/RESULTS.md.
"""

from __future__ import annotations

import collections
import os
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root, for bench.common

import jax
import numpy as np
from absl import app, flags, logging

import elmo_jax
from bench.common import platform_line
from bench.workloads import make_sentences
from elmo_jax.features.embed import check_params

FLAGS = flags.FLAGS
flags.DEFINE_list("sentences", ["1000", "50000"], "Sentence counts, one case each.")
flags.DEFINE_list("devices", ["one", "all"], "'one' (the first local device) and/or 'all' local devices.")
flags.DEFINE_list("batch_sizes", ["32", "64", "128"], "Sentences per batch of the hand loop; the best is taken.")
flags.DEFINE_integer("rounds", 2, "Alternating warm rounds (every hand loop, then embed_sentences) per case.")
flags.DEFINE_integer("batch_tokens", 4096, "embed_sentences' batch_tokens (its default).")
flags.DEFINE_integer("cpu_devices", 0, "Split the CPU into this many JAX devices (0: leave JAX's default).")
flags.DEFINE_enum("size", "small", ["small", "medium", "original"], "Published model size (random weights).")
flags.DEFINE_integer("seed", 0, "Seed of the sentences.")


class Compiles:
    """XLA compiles seen since the last `take` (jax.monitoring's backend-compile events)."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name: str, seconds: float, **kwargs) -> None:
        if name.endswith("backend_compile_duration"):
            self.count += 1

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


def hand_loop(params, sentences: list[list[str]], batch_size: int) -> tuple[list[np.ndarray], int]:
    """(vectors in input order, padded token positions): sorted by length, batches of `batch_size`."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out: list[np.ndarray | None] = [None] * len(sentences)
    padded = 0
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = [sentences[i] for i in rows]
        if not any(batch):
            continue
        ids = elmo_jax.batch_to_ids(batch)
        padded += ids.shape[0] * ids.shape[1]
        layers = np.asarray(elmo_jax.embed(params, ids)[0])
        for row, i in enumerate(rows):
            out[i] = layers[row, :, : len(sentences[i])]
    return out, padded


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def run_case(params, sentences, devices, compiles: Compiles) -> dict:
    tokens = sum(len(s) for s in sentences)
    options = dict(batch_tokens=FLAGS.batch_tokens, devices=devices)

    def embed_sentences():
        embedder = elmo_jax.SentenceEmbedder(params, **options)
        vectors = embedder.embed(sentences)
        return embedder, vectors

    compiles.take()
    (first, vectors), first_s = timed(embed_sentences)
    first_compiles = compiles.take()
    del vectors
    (second, vectors), second_s = timed(embed_sentences)
    second_compiles = compiles.take()
    del vectors
    sizes = [int(b) for b in FLAGS.batch_sizes]
    hand_first, hand_compiles, hand_padded = {}, {}, {}
    for size in sizes:  # compiles this size's shapes (none left in a later case with the same sentences)
        (vectors, hand_padded[size]), hand_first[size] = timed(hand_loop, params, sentences, size)
        hand_compiles[size] = compiles.take()
        del vectors
    ratios, warm_es, warm_hand = [], [], collections.defaultdict(list)
    for _ in range(FLAGS.rounds):
        for size in sizes:
            (vectors, _), seconds = timed(hand_loop, params, sentences, size)
            warm_hand[size].append(tokens / seconds)
            del vectors
        (_, vectors), seconds = timed(embed_sentences)
        del vectors
        warm_es.append(tokens / seconds)
        ratios.append(warm_es[-1] / max(warm_hand[s][-1] for s in sizes))
    best = max(sizes, key=lambda s: statistics.median(warm_hand[s]))
    return {
        "sentences": len(sentences),
        "tokens": tokens,
        "devices": len(first.runner.devices),
        "first_s": first_s,
        "first_compiles": first_compiles,
        "second_s": second_s,
        "second_compiles": second_compiles,
        "warm_tps": statistics.median(warm_es),
        "batches": first.stats["batches"],
        "shapes": len(first.runner.shapes),
        "padding": first.stats["padded_tokens"] / tokens,
        "hand": {
            s: (statistics.median(warm_hand[s]), hand_padded[s] / tokens, hand_compiles[s], hand_first[s])
            for s in sizes
        },
        "best": best,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "load": os.getloadavg()[0],
    }


def revision() -> str:
    try:
        root = pathlib.Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty.strip() else "")
    except OSError:
        return "unknown"


def main(argv):
    del argv
    if FLAGS.cpu_devices:
        jax.config.update("jax_num_cpu_devices", FLAGS.cpu_devices)  # before any device is used
    compiles = Compiles()
    one, five, fifteen = os.getloadavg()
    print(
        f"{platform_line()}; revision {revision()}; {os.cpu_count()} cores, load average {one:.1f} / {five:.1f} / "
        f"{fifteen:.1f}; model {FLAGS.size} (random weights), layers=all float32, batch_tokens={FLAGS.batch_tokens}"
    )
    logging.set_verbosity(logging.WARNING)  # embed_sentences logs a line per call
    params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(FLAGS.size), jax.random.key(0))
    check_params(params)  # the weights' finiteness check, which both sides share, compiled before any case
    rows = []
    for n in (int(s) for s in FLAGS.sentences):
        sentences = make_sentences(n, FLAGS.seed)
        for which in FLAGS.devices:
            devices = [0] if which == "one" else None
            if which == "all" and len(jax.local_devices()) == 1 and "one" in FLAGS.devices:
                print(f"{n} sentences, all devices: one local device, the same as 'one'; skipped")
                continue
            result = run_case(params, sentences, devices, compiles)
            rows.append(result)
            hand = ", ".join(
                f"{s}: {tps:,.0f} tok/s pad {pad:.2f} ({c} compiles, first run {first:.1f} s)"
                for s, (tps, pad, c, first) in result["hand"].items()
            )
            print(
                f"{n} sentences on {result['devices']} device(s): ratio {result['ratio']:.2f} "
                f"(rounds {', '.join(f'{r:.2f}' for r in result['ratios'])}); hand loops: {hand}; "
                f"load {result['load']:.1f}",
                flush=True,
            )
    print()
    print(
        "| sentences | tokens | devices | embed_sentences 1st call s (tok/s) | 2nd call s (tok/s) | warm tok/s "
        "| best hand loop tok/s (batch) | ratio | padding es / hand | compiles 1st / 2nd / hand | batches (shapes) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tps, pad, c, _ = r["hand"][r["best"]]
        print(
            f"| {r['sentences']:,} | {r['tokens']:,} | {r['devices']} | {r['first_s']:.1f} "
            f"({r['tokens'] / r['first_s']:,.0f}) | {r['second_s']:.1f} ({r['tokens'] / r['second_s']:,.0f}) "
            f"| {r['warm_tps']:,.0f} | {tps:,.0f} ({r['best']}) | {r['ratio']:.2f} | {r['padding']:.3f} / {pad:.3f} "
            f"| {r['first_compiles']} / {r['second_compiles']} / {c} | {r['batches']} ({r['shapes']}) |"
        )


if __name__ == "__main__":
    app.run(main)
