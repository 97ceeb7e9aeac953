"""The service's warm-up on this machine: what each set of shapes costs at start-up, and what a request
mix meets outside it (issue #51; the figures in docs/SERVING.md, "Warm-up").

    python bench/serve_warmup.py --root=/tmp/serve_warmup                  # ~20 min on 2 cores
    python bench/serve_warmup.py --root=/tmp/serve_warmup --parts=ready    # the start-ups alone

The model: the small published size (`BiLMConfig.preset("small")`) with random weights in a model
directory under --root, nothing downloaded. Three parts (--parts):

- `programs`: every warm-up batch of `--warmup_shapes=all`, one at a time in this process, twice (the
  second run is the batch alone), with an empty compilation cache and then, in a second process, warm:
  CPU seconds (user + system of the process) per program, compiling and running;
- `mix`: the shapes `bench/workloads.make_sentences`' sentences run into, in requests of 8 (as
  bench/serve_load.py sends them) or of 1, merged 1, 2, 4 or 8 requests at a time or into full batches
  (from the packer alone: its batches are recorded, nothing runs); for each set, the share of batches
  outside it and what those shapes cost to compile once (from `programs`);
- `ready`: `python -m elmo_jax.serve` with `--nowarmup`, the CPU's default (`common`) and
  `--warmup_shapes=all`, each started with an empty compilation cache and again with the one it filled:
  the wall and CPU seconds from its start to `/readyz` answering 200, the machine's load average over
  that time, the warm-up's log lines, and one request of each kind sent twice after it.

Run it on a quiet machine, or compare within one run: wall times move with the load, CPU times hardly.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import resource
import subprocess
import sys
import threading
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FLAGS = flags.FLAGS
flags.DEFINE_string("root", None, "Where the model, the caches and the figures go.", required=True)
flags.DEFINE_list("parts", ["programs", "mix", "ready"], "Which parts to run (see the module doc).")
flags.DEFINE_integer("max_programs", 0, "The `programs` part times the first this many (0: all 168; a quick try).")
flags.DEFINE_string("program_cache", None, "Internal: run the `programs` part in this process with this cache.")

SETS = {  # a set's name -> whether a (rows, T2, S) shape is in it
    "all": lambda shape: True,
    "widths 16, 24": lambda shape: shape[2] in (16, 24),
    "rows <= 16": lambda shape: shape[0] <= 16,
    "common: rows <= 8, T2 <= 64": lambda shape: shape[0] <= 8 and shape[1] <= 64,
    "rows <= 4": lambda shape: shape[0] <= 4,
    "none": lambda shape: False,
}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def model_dir() -> str:
    """The small model's shapes with random weights, written once under --root."""
    directory = os.path.join(FLAGS.root, "small")
    if not os.path.exists(directory):
        import jax

        import elmo_jax
        from elmo_jax.formats.model_dir import write_model_dir

        params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset("small"), jax.random.key(0))
        write_model_dir(params, directory, extractor=False)
    return directory


def embedder(cache: str | None = None):
    """A service's embedder of the model (its defaults), its programs kept in `cache`."""
    from elmo_jax.formats.model_dir import load
    from elmo_jax.storage import compile_cache

    if cache is not None:
        compile_cache.use(cache)
    from elmo_jax.features.sentences import SentenceEmbedder

    return SentenceEmbedder(load(model_dir()), layers="all", batch_tokens=4096, tail_steps=16)


def programs_here(cache: str) -> list[dict]:
    """Each warm-up batch run twice in this process: CPU seconds of the first run and of the second."""
    from elmo_jax.serving.dynamic_batching import warmup_set

    e = embedder(cache)
    shapes, real = [], e.runner.dispatch
    e.runner.dispatch = lambda batch: shapes.append(tuple(batch.shape)) or real(batch)
    rows = []
    for sentences in warmup_set(e, 512, "all")[: FLAGS.max_programs or None]:
        shapes.clear()
        times = []
        for _ in range(2):
            start = cpu_seconds()
            list(e.stream(sentences, window=len(sentences)))
            times.append(cpu_seconds() - start)
        rows.append({"shape": shapes[0], "first_cpu_s": times[0], "run_cpu_s": times[1]})
    return rows


def programs() -> dict:
    """`programs_here` with an empty cache, then warm, each in a process of its own."""
    cache, results = os.path.join(FLAGS.root, "cache_programs"), {}
    for kind in ("cold", "warm"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                f"--root={FLAGS.root}",
                f"--program_cache={cache}",
                f"--max_programs={FLAGS.max_programs}",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[kind] = json.loads(out.strip().splitlines()[-1])
        first = [r["first_cpu_s"] for r in results[kind]]
        run = [r["run_cpu_s"] for r in results[kind]]
        print(f"{kind}: {len(first)} programs, {sum(first):.0f} CPU-s; per program {sum(first) / len(first):.2f}, "
              f"of it running the batch {sum(run) / len(run):.2f}", flush=True)  # fmt: skip
    return results


def mix_shapes() -> dict:
    """ "{per} per request, {k} per batch" -> Counter of the (rows, T2, S) shapes the packer gives the
    mix's batches (nothing runs: the batches are recorded and answered with zeros)."""
    import numpy as np

    from bench.workloads import make_sentences

    e, seen = embedder(), []
    layers, width = e.runner.config.n_output_layers, e.runner.config.output_dim

    def dispatch(batch):
        seen.append(tuple(batch.shape))
        rows, T2, _ = batch.shape
        return np.zeros((rows, layers, T2, width), np.float32)

    e.runner.dispatch = dispatch
    sentences = make_sentences(4000, seed=0)
    mixes = {}
    for per in (8, 1):
        requests = [sentences[i : i + per] for i in range(0, len(sentences), per)]
        for k in (1, 2, 4, 8, "full"):
            seen.clear()
            for batch in merged(requests, k):
                list(e.stream(batch, window=len(batch)))
            mixes[f"{per} per request, {k} per batch"] = collections.Counter(seen)
    return mixes


def merged(requests: list, k) -> list:
    """The requests' sentences k requests per batch, or ("full") as many as 4,096 tokens hold (the
    service's --max_batch_tokens; a request is never split)."""
    batches, i = [], 0
    while i < len(requests):
        j, tokens = i, 0
        while j < len(requests) and (k == "full" or j - i < k):
            n = sum(map(len, requests[j]))
            if k == "full" and j > i and tokens + n > 4096:
                break
            tokens, j = tokens + n, j + 1
        batches.append([s for r in requests[i:j] for s in r])
        i = j
    return batches


def trade_off(costs: dict, mixes: dict) -> list[dict]:
    """Per set: its programs, their CPU at a cold and at a warm start, and per mix the share of batches
    outside it, those shapes, and what they cost to compile once (first run less the run, cold; warm)."""
    per_shape = {kind: {tuple(r["shape"]): r for r in rows} for kind, rows in costs.items()}
    every = set(per_shape["cold"])  # the programs timed (all of `all` unless --max_programs)
    table = []
    for name, chosen in SETS.items():
        shapes = {s for s in every if chosen(s)}
        row = {"set": name, "programs": len(shapes)}
        for kind in ("cold", "warm"):
            row[f"{kind}_cpu_s"] = round(sum(per_shape[kind][s]["first_cpu_s"] for s in shapes), 1)
        union = set()
        for mix, counts in mixes.items():
            out = [s for s in counts if not chosen(s)]
            union |= set(out)
            row[mix] = {"batches_outside": f"{100 * sum(counts[s] for s in out) / sum(counts.values()):.0f}%",
                        "shapes_outside": len(out)}  # fmt: skip
        for kind in ("cold", "warm"):
            once = sum(compile_s(per_shape[kind], s, kind) for s in union)
            row[f"once_over_every_mix_{kind}_cpu_s"] = round(once, 1)
        row["shapes_outside_over_every_mix"] = len(union)
        table.append(row)
        print(json.dumps(row), flush=True)
    return table


def compile_s(per_shape: dict, shape: tuple, kind: str) -> float:
    """What `shape` costs to compile (or read) once: its first run less the batch's own run (a shape no
    warm-up holds: the mean of those measured)."""
    if shape in per_shape:
        return per_shape[shape]["first_cpu_s"] - per_shape[shape]["run_cpu_s"]
    values = [r["first_cpu_s"] - r["run_cpu_s"] for r in per_shape.values()]
    return sum(values) / len(values)


def ready(label: str, cache: str, *serve_flags: str) -> dict:
    """One start of the service: wall and CPU seconds to /readyz 200, the load over it, the warm-up's
    lines, and the latency of one request of each kind, twice."""
    argv = [sys.executable, "-m", "elmo_jax.serve", f"--model={model_dir()}", "--port=0",
            f"--compilation_cache={cache}", *serve_flags]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
    port = int(process.stdout.readline().split(":")[2].split(" ")[0])
    loads = []
    while get(port, "/readyz") != 200:
        loads.append(os.getloadavg()[0])
        time.sleep(0.2)
    seconds = time.perf_counter() - start
    with open(f"/proc/{process.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    latency = requests_after(port)
    process.terminate()
    process.wait(120)
    warmup = [line.split("] ", 1)[-1].strip() for line in lines if "warm-up" in line]
    load = round(sum(loads) / max(len(loads), 1), 1)
    result = {"case": label, "ready_s": round(seconds, 1), "cpu_s": round(cpu, 1), "load": load}
    result.update(latency_s=latency, warmup_lines=warmup)
    print(json.dumps(result), flush=True)
    return result


def get(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def requests_after(port: int) -> dict:
    """Seconds of one request of 8 of the mix's sentences, of one short sentence and of 64 sentences,
    each sent twice (the first may meet a shape to compile)."""
    from bench.workloads import make_sentences

    mix = make_sentences(200, seed=1)
    kinds = {"8 sentences": mix[:8], "1 short sentence": [["The", "bank", "."]], "64 sentences": mix[8:72]}
    latency = {}
    for name, sentences in kinds.items():
        for attempt in ("first", "again"):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            start = time.perf_counter()
            body = json.dumps({"sentences": sentences})
            connection.request(
                "POST", "/v1/embed", body, {"Content-Type": "application/json", "Accept": "application/x-npy"}
            )
            response = connection.getresponse()
            response.read()
            connection.close()
            assert response.status == 200, response.status
            latency[f"{name}, {attempt}"] = round(time.perf_counter() - start, 2)
    return latency


def main(argv):
    del argv
    if FLAGS.program_cache:  # the `programs` part's own process
        print(json.dumps(programs_here(FLAGS.program_cache)))
        return
    os.makedirs(FLAGS.root, exist_ok=True)
    results = {}
    if "programs" in FLAGS.parts:
        results["programs"] = programs()
    if "mix" in FLAGS.parts:
        mixes = mix_shapes()
        results["mix"] = {name: {",".join(map(str, s)): n for s, n in c.items()} for name, c in mixes.items()}
        if "programs" in results:
            results["trade_off"] = trade_off(results["programs"], mixes)
    if "ready" in FLAGS.parts:
        results["ready"] = []
        for label, serve_flags in (("nowarmup", ["--nowarmup"]), ("common", []), ("all", ["--warmup_shapes=all"])):
            cache = os.path.join(FLAGS.root, f"cache_{label}")
            for start in ("empty cache", "warm cache"):
                results["ready"].append(ready(f"{label}, {start}", cache, *serve_flags))
    with open(os.path.join(FLAGS.root, "serve_warmup.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    app.run(main)
