"""Start-up with an empty and with a warm compilation cache: what the persistent cache saves each command.

    python bench/start_times.py --root=/tmp/start_times --out=bench/results_start_times.json   # ~12 min, 2 cores

Each case runs twice in processes of their own: first with an empty compilation cache (cold: a new
machine, a new jax), then again with the cache the first run filled (warm: a restart), both through
`$ELMO_JAX_COMPILATION_CACHE` (docs/COMPILATION_CACHE.md). Wall time and CPU time (user + system of the
process and its threads) are measured to the point the case names:

- `embed_text`: `python -m elmo_jax.embed_text --model=small-shaped "..." "..."`, to its exit;
- `readme`: the README's first command less its `pip install` (`train.py --config=configs/demo.py`, then
  `embed_text` of the export), to its exit; warm: the same command again (the run is complete: it loads,
  finds nothing to train, evaluates and exports again);
- `resume`: `train.py` resuming the demo from its step-200 checkpoint, to its first step (the line saying
  the step was compiled, printed once the first step has run); warm: a copy of the same checkpoint;
- `serve`: `python -m elmo_jax.serve --model=small-shaped` (default flags), to `/readyz` answering 200.

The small-shaped model is `BiLMConfig.preset("small")` with random weights written to a model directory
under --root: nothing is downloaded. Figures depend on the machine's load: run it on a quiet machine and
compare cold with warm within one run.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FLAGS = flags.FLAGS
flags.DEFINE_string("root", None, "Where models, runs and caches go (must not exist).", required=True)
flags.DEFINE_string("out", None, "Where to write the figures as JSON (optional).")
flags.DEFINE_list("cases", ["embed_text", "readme", "resume", "serve"], "Which cases to run.")
flags.DEFINE_list("serve_flags", [], "Extra flags for the service (e.g. --warmup=all).")

SENTENCES = ["Return the value of the attribute .", "The bank of the river ."]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process and its threads so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_to_exit(argv: list[str], env: dict[str, str], log: str) -> tuple[float, float]:
    """(wall s, CPU s) of a command run to its exit (CPU of it and its children); raises on failure."""
    before = os.times()
    start = time.perf_counter()
    with open(log, "w") as out:
        subprocess.run(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=True)
    wall, after = time.perf_counter() - start, os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def run_until(argv: list[str], env: dict[str, str], log: str, done) -> tuple[float, float]:
    """(wall s, CPU s) of a command up to the first output line for which `done(line)` holds; then it is
    stopped (SIGTERM, then SIGKILL)."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with open(log, "w") as out:
            for line in process.stdout:
                out.write(line)
                if done(line):
                    return time.perf_counter() - start, cpu_seconds(process.pid)
        raise RuntimeError(f"{argv[1:3]} ended before the point measured; see {log}")
    finally:
        _stop(process)


def service_ready(argv: list[str], env: dict[str, str], log: str) -> tuple[float, float]:
    """(wall s, CPU s) of the service from its start to /readyz 200."""
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=out, text=True)
    try:
        line = process.stdout.readline()
        if not line.startswith("serving on"):
            raise RuntimeError(f"the service did not start: {line!r}; see {log}")
        port = int(line.split(":")[2].split(" ")[0])
        while not _ready(port):
            if process.poll() is not None:
                raise RuntimeError(f"the service stopped; see {log}")
            time.sleep(0.2)
        return time.perf_counter() - start, cpu_seconds(process.pid)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not ended within a minute."""
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def _ready(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def small_model(root: str) -> str:
    """A model directory of the small published shapes with random weights (made once under `root`)."""
    directory = os.path.join(root, "small_model")
    if not os.path.isdir(directory):
        code = (
            "import jax, elmo_jax; from elmo_jax.formats.model_dir import write_model_dir; "
            "write_model_dir(elmo_jax.init_params(elmo_jax.BiLMConfig.preset('small'), jax.random.key(0)), "
            f"{directory!r}, extractor=False)"
        )
        subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return directory


def case_commands(name: str, root: str):
    """[(label, measure(env, log) -> (wall, cpu))] for the cold and the warm run of a case."""
    python = sys.executable
    if name == "embed_text":
        argv = [python, "-m", "elmo_jax.embed_text", f"--model={small_model(root)}", *SENTENCES]
        return [(label, lambda env, log: run_to_exit(argv, env, log)) for label in ("cold", "warm")]
    if name == "readme":
        workdir = os.path.join(root, "readme_run")
        train = [python, "train.py", "--config=configs/demo.py", f"--workdir={workdir}"]
        embed = [python, "-m", "elmo_jax.embed_text", f"--model={workdir}/export", *SENTENCES]

        def readme(env, log):
            wall, cpu = run_to_exit(train, env, log)
            more = run_to_exit(embed, env, log + ".embed")
            return wall + more[0], cpu + more[1]

        return [(label, readme) for label in ("cold", "warm")]
    if name == "resume":
        return [(label, _resume(root, label)) for label in ("cold", "warm")]
    if name == "serve":
        argv = [python, "-m", "elmo_jax.serve", f"--model={small_model(root)}", "--port=0", *FLAGS.serve_flags]
        return [(label, lambda env, log: service_ready(argv, env, log)) for label in ("cold", "warm")]
    raise app.UsageError(f"--cases: unknown case {name!r}")


def _resume(root: str, label: str):
    """Resumes a copy of the demo's step-200 checkpoint (trained once, with a cache of its own) to its first step."""
    checkpointed = os.path.join(root, "resume_200")
    train = [sys.executable, "train.py", "--config=configs/demo.py"]

    def measure(env, log):
        if not os.path.isdir(checkpointed):
            own = {**env, "ELMO_JAX_COMPILATION_CACHE": os.path.join(root, "cache_resume_setup")}
            run_to_exit(train + [f"--workdir={checkpointed}", "--config.num_train_steps=200"], own, log + ".setup")
        workdir = os.path.join(root, f"resume_{label}")
        shutil.copytree(checkpointed, workdir)
        return run_until(train + [f"--workdir={workdir}"], env, log, lambda line: "compiling the training step" in line)

    return measure


def main(argv):
    del argv
    os.makedirs(FLAGS.root)
    results = {}
    for name in FLAGS.cases:
        cache = os.path.join(FLAGS.root, f"cache_{name}")
        env = {**os.environ, "ELMO_JAX_COMPILATION_CACHE": cache}
        for label, measure in case_commands(name, FLAGS.root):
            wall, cpu = measure(env, os.path.join(FLAGS.root, f"{name}_{label}.log"))
            results[f"{name}/{label}"] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}
            print(f"{name:10s} {label}: {wall:6.1f} s wall, {cpu:6.1f} s CPU", flush=True)
        size = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache)) if os.path.isdir(cache) else 0
        results[f"{name}/cache_bytes"] = size
    print("\n| case | cold wall | cold CPU | warm wall | warm CPU |\n|---|---:|---:|---:|---:|")
    for name in FLAGS.cases:
        cold, warm = results[f"{name}/cold"], results[f"{name}/warm"]
        print(f"| {name} | {cold['wall_s']} s | {cold['cpu_s']} s | {warm['wall_s']} s | {warm['cpu_s']} s |")
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    app.run(main)
