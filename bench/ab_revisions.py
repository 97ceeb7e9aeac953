"""Before/after ratio of a train-step change: two versions timed in alternating processes.

    python bench/ab_revisions.py --before=HEAD                      # committed vs working tree, small at 32x20
    python bench/ab_revisions.py --before=abc123 --after=def456 --model=large --rounds=3

Both sides are copies of the working tree (elmo_jax/, configs/, bench/, untracked files included, so
other work in progress is the same on both), in which the files named by --files are replaced by their
version at --before, respectively --after (WORKTREE: as they are). `bench/train_throughput.py` then
runs in each copy in turn: before, after, before, after, ... --rounds times; every process also
measures the float32 matmul. The machine's load moves both sides of one round alike, so the figure to
trust is the median over rounds of (before step time / after step time), printed with each side's best
step time and best fraction of matmul speed. The process CPU time of a step (all threads) is printed
too: on a machine shared with other work it moves far less than the wall time. Nothing in the
checkout is touched.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]

FLAGS = flags.FLAGS
flags.DEFINE_string("before", "HEAD", "Git revision of --files before the change (or WORKTREE).")
flags.DEFINE_string("after", "WORKTREE", "Git revision of --files after the change (WORKTREE: as they are now).")
flags.DEFINE_list(
    "files",
    [
        "elmo_jax/model/char_cnn.py",
        "elmo_jax/model/lstm.py",
        "elmo_jax/training/train_step.py",
        "elmo_jax/training/softmax.py",
        "elmo_jax/training/lm.py",
        "elmo_jax/model/precision.py",
    ],
    "Files that differ between the sides; everything else is the working tree's.",
)
flags.DEFINE_string("model", "small", "Training config (bench/train_throughput.py --models).")
flags.DEFINE_string("shape", "32x20", "Window BxT.")
flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "train_step's matmul dtype.")
flags.DEFINE_integer("rounds", 3, "Alternating before/after pairs.")
flags.DEFINE_integer("repeats", 3, "Timed steps per process; the best counts.")

_CPU = re.compile(r"process CPU time ([\d.]+) ms per step")
_ROW = re.compile(
    r"^(\w+)\s+(\d+x\d+)\s+[\d,]+\s+\S+\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d,]+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)%"
)


def export(revision: str, into: pathlib.Path) -> pathlib.Path:
    """A copy of the working tree's code with --files at `revision`."""
    for sub in ("elmo_jax", "bench", "configs"):
        shutil.copytree(REPO / sub, into / sub, ignore=shutil.ignore_patterns("__pycache__"))
    if revision != "WORKTREE":
        for path in FLAGS.files:
            try:
                text = subprocess.run(
                    ["git", "-C", str(REPO), "show", f"{revision}:{path}"], check=True, capture_output=True
                ).stdout
            except subprocess.CalledProcessError as e:
                raise app.UsageError(f"git show {revision}:{path}: {e.stderr.decode().strip()}") from None
            (into / path).write_bytes(text)
    return into


def run_once(code: pathlib.Path) -> tuple[float, float, float]:
    """(best step ms, fraction of matmul, best step CPU ms) of one train_throughput process on `code`.

    train_throughput puts its own repository root (`code`) first on sys.path.
    """
    command = [
        sys.executable,
        str(code / "bench" / "train_throughput.py"),
        f"--models={FLAGS.model}",
        f"--shape={FLAGS.shape}",
        f"--compute_dtype={FLAGS.compute_dtype}",
        f"--repeats={FLAGS.repeats}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=code)
    cpu = _CPU.search(result.stdout)
    for line in result.stdout.splitlines():
        match = _ROW.match(line)
        if match and cpu:
            return float(match.group(4)), float(match.group(6)) / 100.0, float(cpu.group(1))
    raise RuntimeError(f"train_throughput on {code} printed no result row:\n{result.stdout}\n{result.stderr[-3000:]}")


def main(argv):
    del argv
    with tempfile.TemporaryDirectory(prefix="elmo_ab_") as tmp:
        tmp = pathlib.Path(tmp)
        sides = {
            name: export(revision, tmp / name) for name, revision in (("before", FLAGS.before), ("after", FLAGS.after))
        }
        results = {"before": [], "after": []}
        for r in range(FLAGS.rounds):
            for name in ("before", "after"):
                results[name].append(run_once(sides[name]))
            b, a = results["before"][-1], results["after"][-1]
            print(
                f"round {r + 1}: before {b[0]:.1f} ms ({b[1]:.1%} of matmul, CPU {b[2]:.1f} ms), after "
                f"{a[0]:.1f} ms ({a[1]:.1%}, CPU {a[2]:.1f} ms), speed-up {b[0] / a[0]:.3f}x wall, "
                f"{b[2] / a[2]:.3f}x CPU time",
                flush=True,
            )
        ratios = [b[0] / a[0] for b, a in zip(results["before"], results["after"])]
        cpu_ratios = [b[2] / a[2] for b, a in zip(results["before"], results["after"])]
        print(
            f"\n{FLAGS.model} {FLAGS.shape} {FLAGS.compute_dtype}: {FLAGS.before} -> {FLAGS.after}: median speed-up "
            f"{statistics.median(ratios):.3f}x wall, {statistics.median(cpu_ratios):.3f}x process CPU time, "
            f"over {FLAGS.rounds} alternating rounds "
            f"(best step {min(x[0] for x in results['before']):.1f} -> {min(x[0] for x in results['after']):.1f} ms; "
            f"of matmul {max(x[1] for x in results['before']):.1%} -> {max(x[1] for x in results['after']):.1%})"
        )


if __name__ == "__main__":
    app.run(main)
