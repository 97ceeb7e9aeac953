"""The latency an ideal batcher reaches at a given load with the batch costs of this machine (#34).

    python bench/serve_latency_model.py                 # small model, random weights, 5-10 minutes on 2 cores

`bench/serve_load.py` measures the service; this script asks what an ideal batcher would do with the
same model on the same cores, so that a measured p99 can be told apart from one the batch costs set
(for any batcher that runs one batch at a time and takes what waits, as the service does under light
and moderate load).

1. The batch cost curve: after the service's warm-up, the seconds one batch of k requests (k x
   --per_request sentences, the requests `serve_load.py` sends) costs in `SentenceEmbedder.stream` (the
   batcher's own call), the mean over --samples different batches per k, for k from 1 to the most a
   batch of --max_batch_tokens holds.
2. A queue of Poisson arrivals at 25%, 50% and 90% of the saturated rate (the most requests a batch
   holds over its cost) served by an ideal batcher: one batch at a time, nothing lost between batches
   (no HTTP, no Python, no other process on the cores), each batch as soon as the last ends, holding
   every request waiting then (up to the batch's size). Latency: from arrival to the end of the batch.
3. The same queue on a hypothetical device on which a batch costs the same whatever it holds (the
   single request's cost): the regime dynamic batching is made for.

The issue's goal is a p99 at 50% load within 3x the single-request latency. For a cost growing with
the batch (a CPU's cores run every row's products), queueing alone sets a floor above that: a request
waits for the batch running when it arrives, and Poisson arrivals bunch. Results: bench/RESULTS.md
("the embedding service under load").
"""

from __future__ import annotations

import bisect
import json
import os
import pathlib
import random
import sys
import time
from collections.abc import Callable, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import elmo_jax  # noqa: E402
from bench.common import platform_line  # noqa: E402
from bench.workloads import make_sentences  # noqa: E402
from elmo_jax.serving import warmup_sentences  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """This script's own flags (defined when it runs, not when a test imports it)."""
    flags.DEFINE_integer("sentences", 4000, "Sentences to draw requests from (as bench/serve_load.py).")
    flags.DEFINE_integer("per_request", 8, "Sentences per request.")
    flags.DEFINE_integer("max_batch_tokens", 4096, "Tokens per batch at most (the service's --max_batch_tokens).")
    flags.DEFINE_integer("tail_steps", 16, "The embedder's tail_steps (the service's --tail_steps).")
    flags.DEFINE_integer("samples", 8, "Batches timed per batch size (their mean is taken: a queue's load).")
    flags.DEFINE_integer("arrivals", 100_000, "Requests simulated per load.")
    flags.DEFINE_list("loads", ["0.25", "0.5", "0.9"], "Loads, as fractions of the saturated request rate.")
    flags.DEFINE_string("output", "", "Write the cost curve and the table here as JSON ('': nowhere).")
    flags.DEFINE_enum("size", "small", ["small", "medium", "original"], "Published model size (random weights).")


def simulate(arrivals: Sequence[float], cost: Callable[[int], float], max_requests: int) -> np.ndarray:
    """Latencies (s) of requests arriving at `arrivals` (sorted seconds) served by an ideal batcher.

    One batch runs at a time; when one ends (or a request arrives to an idle batcher) the next starts at
    once with every request waiting then, at most `max_requests`, and takes `cost(k)` seconds for k
    requests. A request's latency runs from its arrival to the end of its batch.
    """
    latencies = np.empty(len(arrivals))
    free, i = 0.0, 0
    while i < len(arrivals):
        start = max(free, arrivals[i])
        j = min(bisect.bisect_right(arrivals, start, lo=i), i + max_requests)
        free = start + cost(j - i)
        latencies[i:j] = free - np.asarray(arrivals[i:j])
        i = j
    return latencies


def poisson(rate: float, n: int, seed: int = 1) -> list[float]:
    """`n` arrival times (s) of a Poisson process of `rate` per second."""
    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        times.append(t)
    return times


def cost_curve(embedder, requests: list[list[list[str]]], max_requests: int, samples: int) -> np.ndarray:
    """Mean seconds of a batch of k consecutive requests, k = 1 .. max_requests (index k - 1)."""
    costs = []
    for k in range(1, max_requests + 1):
        times = []
        for s in range(samples + 1):  # the first is not timed: it may compile a shape the warm-up missed
            batch = [sentence for r in requests[s * k : (s + 1) * k] for sentence in r]
            start = time.perf_counter()
            list(embedder.stream(batch, window=len(batch)))
            if s:
                times.append(time.perf_counter() - start)
        costs.append(float(np.mean(times)))
        print(f"  {k:2d} requests: {1e3 * costs[-1]:7.1f} ms", flush=True)
    return np.array(costs)


def queue_table(costs: np.ndarray, loads: Sequence[float], n: int) -> list[dict]:
    """Per load, p50/p99 latency of the ideal batcher on the measured curve and on a flat one."""
    max_requests = len(costs)
    saturated = max_requests / costs[-1]  # requests/s with every batch full
    single = float(costs[0])
    rows = []
    for load in loads:
        arrivals = poisson(load * saturated, n)
        row = {"load": load, "rate": load * saturated}
        for name, cost in (("measured", lambda k: costs[k - 1]), ("flat", lambda k: single)):
            latencies = simulate(arrivals, cost, max_requests)
            p50, p99 = np.percentile(latencies, [50, 99])
            row[name] = {"p50_s": float(p50), "p99_s": float(p99), "p99_over_single": float(p99 / single)}
        rows.append(row)
    return rows


def main(argv):
    del argv
    print(platform_line(), f"| {os.cpu_count()} cores | {FLAGS.size} model, random weights", flush=True)
    sentences = make_sentences(FLAGS.sentences, seed=0)
    k = FLAGS.per_request
    requests = [sentences[i : i + k] for i in range(0, len(sentences) - k + 1, k)]
    per_request = float(np.mean([sum(map(len, r)) for r in requests]))
    max_requests = max(1, int(FLAGS.max_batch_tokens // per_request))
    if (FLAGS.samples + 1) * max_requests > len(requests):
        raise app.UsageError(f"--sentences={FLAGS.sentences} is too few for --samples={FLAGS.samples}")
    params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(FLAGS.size), jax.random.key(0))
    embedder = elmo_jax.SentenceEmbedder(
        params, layers="all", batch_tokens=FLAGS.max_batch_tokens, tail_steps=FLAGS.tail_steps
    )
    start = time.perf_counter()
    warmup = warmup_sentences(embedder, max_tokens=64)  # as serve_load.py's service (--max_sentence_tokens=64)
    for batch in warmup:
        list(embedder.stream(batch, window=len(batch)))
    print(f"warm-up: {len(warmup)} batches, {time.perf_counter() - start:.0f} s")
    print(f"batch cost, requests of {k} sentences (about {per_request:.0f} tokens), up to {max_requests} a batch:")
    costs = cost_curve(embedder, requests, max_requests, FLAGS.samples)
    print(
        f"single request {1e3 * costs[0]:.1f} ms; saturated {max_requests / costs[-1]:.1f} requests/s "
        f"({1e3 * costs[-1] / max_requests:.1f} ms a request in full batches)"
    )
    print("| load | rate /s | ideal batcher, costs measured: p50 / p99 (p99 / single) | flat cost: p50 / p99 (x) |")
    print("|---|---|---|---|")
    table = queue_table(costs, [float(x) for x in FLAGS.loads], FLAGS.arrivals)
    for row in table:
        cells = [
            f"{1e3 * r['p50_s']:.0f} / {1e3 * r['p99_s']:.0f} ms ({r['p99_over_single']:.1f}x)"
            for r in (row["measured"], row["flat"])
        ]
        print(f"| {row['load']:.0%} | {row['rate']:.1f} | {cells[0]} | {cells[1]} |")
    if FLAGS.output:
        result = {"platform": platform_line(), "batch_seconds": costs.tolist(), "loads": table}
        pathlib.Path(FLAGS.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    define_flags()
    app.run(main)
