"""`python -m elmo_jax.serve` under load on loopback, against offline `embed_sentences` in the same run (#34).

    python bench/serve_load.py                                  # small model, random weights, ~10 minutes
    python bench/serve_load.py --sentences=2000 --duration_s=20 --connections=16

The model: the small published size (`BiLMConfig.preset("small")`) with random weights written to a
temporary model directory, nothing downloaded. Sentences: `bench/workloads.make_sentences`
(lognormal lengths of 1-60 tokens, Zipf-like words), sent --per_request at a time, every layer
(`"layers": "all"`, AllenNLP's output) as .npy (`Accept: application/x-npy`).

The service runs in its own process (`--max_wait_ms`, the rest at its defaults); this process is the
load generator (threads, one keep-alive connection each) and the offline reference: `embed_sentences`
of all the sentences, warm (the second call is timed), on this process's devices, while the service
idles. Each phase is bounded by --duration_s, and counts the XLA compiles the service made during it
(`elmo_compiles`); a saturated phase first warms the service with real traffic (not measured: the
shapes real requests merge into that the service's own warm-up missed). Then:

1. saturated: --connections closed-loop connections: tokens/s, against offline (the ratio), in
   --rounds alternations of an offline pass and a saturated phase (the median ratio);
2. single: one request at a time (one connection): the single-request latency (median);
3. open loop at 25%, 50% and 90% of the saturated request rate (Poisson arrivals, a request counted
   from its scheduled start): latency p50/p95/p99, and p99 against the single-request median;
4. past saturation, 150%: what is answered, what is refused (503 + Retry-After), p99 of the answered,
   the service's resident memory before and after (bounded: the queue is bounded in tokens).

Results: bench/RESULTS.md ("the embedding service under load").
"""

from __future__ import annotations

import concurrent.futures
import http.client
import io
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import elmo_jax  # noqa: E402
from bench.common import platform_line  # noqa: E402
from bench.workloads import make_sentences  # noqa: E402
from elmo_jax.formats.model_dir import write_model_dir  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("sentences", 4000, "Sentences to draw requests from (cycled when a phase needs more).")
flags.DEFINE_integer("per_request", 8, "Sentences per request.")
flags.DEFINE_integer("connections", 64, "Concurrent connections of the saturating phase.")
flags.DEFINE_float("duration_s", 30.0, "Seconds per phase at most.")
flags.DEFINE_float("max_wait_ms", 5.0, "The service's --max_wait_ms.")
flags.DEFINE_integer("max_batch_tokens", 4096, "The service's --max_batch_tokens.")
flags.DEFINE_integer("workers", 2, "The service's --workers.")
flags.DEFINE_integer("tail_steps", 16, "The service's --tail_steps.")
flags.DEFINE_integer("max_queue_tokens", 8192, "The service's --max_queue_tokens (small: overload shows 503s).")
flags.DEFINE_enum("size", "small", ["small", "medium", "original"], "Published model size (random weights).")
flags.DEFINE_integer("rounds", 2, "Alternating rounds of offline and saturated (the median ratio is reported).")
flags.DEFINE_string("output", "", "Also write the results as JSON here.")

_DECODE_LOCK = threading.Lock()  # see Client.embed


def write_model(directory: str) -> elmo_jax.BiLMParams:
    params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(FLAGS.size), jax.random.key(0))
    write_model_dir(params, directory, extractor=False)
    return params


def start_service(model_dir: str) -> tuple[subprocess.Popen, int, float]:
    """The service's process, its port, and the seconds from its start to ready (warm-up included)."""
    start = time.perf_counter()
    argv = [
        sys.executable, "-m", "elmo_jax.serve", f"--model={model_dir}", "--port=0",
        f"--max_wait_ms={FLAGS.max_wait_ms}", f"--max_queue_tokens={FLAGS.max_queue_tokens}",
        f"--max_batch_tokens={FLAGS.max_batch_tokens}", f"--workers={FLAGS.workers}",
        f"--tail_steps={FLAGS.tail_steps}",
        "--max_sentence_tokens=64",
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    if not line.startswith("serving on"):
        raise RuntimeError(f"the service did not start: {line!r}")
    port = int(line.split(":")[2].split(" ")[0])
    while True:  # ready once the warm-up has compiled
        try:
            if get(port, "/readyz")[0] == 200:
                return process, port, time.perf_counter() - start
        except OSError:
            pass
        time.sleep(0.5)


def get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class Client:
    """One keep-alive connection; `embed` returns (status, seconds, tokens)."""

    def __init__(self, port: int):
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def _post(self, body: bytes) -> http.client.HTTPResponse:
        headers = {"Accept": "application/x-npy", "Content-Type": "application/json"}
        self.connection.request("POST", "/v1/embed", body=body, headers=headers)
        return self.connection.getresponse()

    def embed(self, sentences: list[list[str]]) -> tuple[int, float, int]:
        body = json.dumps({"sentences": sentences, "layers": "all"}).encode()
        start = time.perf_counter()
        try:
            response = self._post(body)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The service closes a keep-alive connection idle for 5 s (uvicorn's default): open another.
            self.connection.close()
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            response = self._post(body)
        data = response.read()
        seconds = time.perf_counter() - start
        if response.status == 200:
            # The client reads what it gets. One thread at a time: np.load parses the .npy header with
            # ast.literal_eval, and CPython 3.11's AST constructor is not safe to run in several threads
            # at once (it raised "SystemError: AST constructor recursion depth mismatch" in one run of
            # 64 connections here; https://github.com/python/cpython/issues/106905).
            with _DECODE_LOCK:
                np.load(io.BytesIO(data))
        return response.status, seconds, sum(len(s) for s in sentences)


def requests_of(sentences: list[list[str]]):
    """An endless cycle of requests of --per_request sentences."""
    k, i = FLAGS.per_request, 0
    while True:
        yield [sentences[(i + j) % len(sentences)] for j in range(k)]
        i += k


def single_phase(port: int, sentences) -> dict:
    client, source, latencies = Client(port), requests_of(sentences), []
    deadline = time.perf_counter() + FLAGS.duration_s / 2
    while time.perf_counter() < deadline and len(latencies) < 200:
        status, seconds, _ = client.embed(next(source))
        assert status == 200, status
        latencies.append(seconds)
    return {"requests": len(latencies), "p50_s": float(np.median(latencies)), "p99_s": _p(latencies, 99)}


def saturated_phase(port: int, sentences) -> dict:
    """Closed loop: every connection sends its next request as soon as it has the last answer."""
    source, lock, results = requests_of(sentences), threading.Lock(), []
    deadline = time.perf_counter() + FLAGS.duration_s

    def connection_loop():
        client = Client(port)
        while time.perf_counter() < deadline:
            with lock:
                batch = next(source)
            results.append(client.embed(batch))

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(FLAGS.connections) as pool:
        for f in [pool.submit(connection_loop) for _ in range(FLAGS.connections)]:
            f.result()
    seconds = time.perf_counter() - start
    ok = [r for r in results if r[0] == 200]
    return {
        "requests": len(results),
        "refused": len(results) - len(ok),
        "seconds": seconds,
        "tokens_per_s": sum(r[2] for r in ok) / seconds,
        "requests_per_s": len(ok) / seconds,
        "p50_s": float(np.median([r[1] for r in ok])),
        "p99_s": _p([r[1] for r in ok], 99),
    }


def open_loop_phase(port: int, sentences, rate: float) -> dict:
    """Poisson arrivals at `rate` requests/s for --duration_s; latency counted from the scheduled start."""
    rng, source = random.Random(1), requests_of(sentences)
    schedule, t = [], 0.0
    while t < FLAGS.duration_s:
        t += rng.expovariate(rate)
        schedule.append(t)
    clients = threading.local()
    start = time.perf_counter() + 0.2

    def one(at: float, batch):
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if not hasattr(clients, "client"):
            clients.client = Client(port)
        status, _, tokens = clients.client.embed(batch)
        return status, time.perf_counter() - (start + at), tokens

    with concurrent.futures.ThreadPoolExecutor(128) as pool:  # more than the service's queue holds
        futures = [pool.submit(one, at, next(source)) for at in schedule]
        results = [f.result() for f in futures]
    seconds = time.perf_counter() - start
    ok = [r for r in results if r[0] == 200]
    latencies = [r[1] for r in ok]
    return {
        "rate": rate,
        "requests": len(results),
        "answered": len(ok),
        "refused_503": sum(r[0] == 503 for r in results),
        "tokens_per_s": sum(r[2] for r in ok) / seconds,
        "p50_s": _p(latencies, 50),
        "p95_s": _p(latencies, 95),
        "p99_s": _p(latencies, 99),
    }


def _p(values, q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def compiles(port: int) -> int:
    """The service's XLA compiles so far (its /metrics)."""
    for line in get(port, "/metrics")[1].decode().splitlines():
        if line.startswith("elmo_compiles "):
            return int(float(line.split()[1]))
    raise RuntimeError("no elmo_compiles in /metrics")


def measured(port: int, phase, *args) -> dict:
    """`phase(port, *args)` with the compiles it caused (a shape the warm-up missed shows here)."""
    before = compiles(port)
    result = phase(port, *args)
    result["compiles"] = compiles(port) - before
    return result


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def offline(params, sentences) -> dict:
    """`embed_sentences` of all the sentences, warm: the second call timed."""
    elmo_jax.embed_sentences(params, sentences, layers="all")
    start = time.perf_counter()
    elmo_jax.embed_sentences(params, sentences, layers="all")
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens_per_s": sum(map(len, sentences)) / seconds}


def main(argv):
    del argv
    sentences = make_sentences(FLAGS.sentences, seed=0)
    print(platform_line(), f"| {os.cpu_count()} cores | {FLAGS.size} model, random weights", flush=True)
    with tempfile.TemporaryDirectory(prefix="serve_load_") as tmp:
        params = write_model(os.path.join(tmp, "model"))
        process, port, ready_s = start_service(os.path.join(tmp, "model"))
        try:
            results = {"warmup_compiles": compiles(port), "start_to_ready_s": ready_s}
            # Traffic before measuring: the shapes real requests merge into that the warm-up missed.
            results["warm_traffic"] = measured(port, saturated_phase, sentences)
            print("warm traffic (not measured):", results["warm_traffic"], flush=True)
            # Offline and saturated alternate (--rounds), so that the machine's load weighs on both alike.
            results.update(offline=[], saturated=[])
            for _ in range(FLAGS.rounds):
                results["offline"].append(offline(params, sentences))
                print("offline embed_sentences:", results["offline"][-1], flush=True)
                results["saturated"].append(measured(port, saturated_phase, sentences))
                ratio = results["saturated"][-1]["tokens_per_s"] / results["offline"][-1]["tokens_per_s"]
                results["saturated"][-1]["ratio_to_offline"] = ratio
                print("saturated:", results["saturated"][-1], flush=True)
            results["ratio_to_offline"] = float(np.median([r["ratio_to_offline"] for r in results["saturated"]]))
            saturated = max(results["saturated"], key=lambda r: r["requests_per_s"])
            results["single"] = measured(port, single_phase, sentences)
            print("single requests:", results["single"], flush=True)
            single = results["single"]["p50_s"]
            for fraction in (0.25, 0.5, 0.9, 1.5):
                if fraction == 1.5:
                    results["rss_mib_before_overload"] = rss_mib(process.pid)
                phase = measured(port, open_loop_phase, sentences, fraction * saturated["requests_per_s"])
                phase["p99_over_single"] = phase["p99_s"] / single
                results[f"load_{int(fraction * 100)}"] = phase
                print(f"{fraction:.0%} of saturation:", phase, flush=True)
            results["rss_mib_after_overload"] = rss_mib(process.pid)
            results["metrics"] = [
                line for line in get(port, "/metrics")[1].decode().splitlines() if line.startswith("elmo_")
            ]
        finally:
            process.terminate()
            process.wait(120)
    results["service_exit_code"] = process.returncode
    print(json.dumps({k: v for k, v in results.items() if k != "metrics"}, indent=1))
    if FLAGS.output:
        pathlib.Path(FLAGS.output).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    app.run(main)
