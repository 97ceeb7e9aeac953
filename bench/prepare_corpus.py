"""Preparing a local text corpus as ArrayRecord shards (`local_corpus.prepare_local_corpus`): peak memory
and speed as the corpus grows, on synthetic text written to disk.

    python bench/prepare_corpus.py --sizes_gb=0.25,1,4,10 --dir=/tmp/prep_bench    # deletes what it wrote

For each size: a corpus of that many GB of 1B-Word-like text (`bench/synthetic_corpus.py`: one block of
--block_sentences sentences, generated once, written again and again into 512 MB files), prepared in a
fresh process once per --writer_processes value (0: every shard written by the preparing process; N:
by N helper processes while it reads on); its peak RSS (VmHWM) and its largest helper's, wall and CPU
time (its own and its helpers'), and MB of text per second of each. Three baselines on the largest file
set, in fresh processes too, say what limits the rate: reading the bytes (the disk, or the page cache
when the files fit in it), decoding them as UTF-8 in bulk, and reading them into records the way the
preparation does (`text_files.iter_record_blocks`), without writing.
Everything written under --dir is deleted at the end (--keep to keep it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.synthetic_corpus import write_synthetic_corpus  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes_gb", ["0.25", "1", "4", "10"], "Corpus sizes to prepare, in GB (1e9 bytes).")
flags.DEFINE_string("dir", "/tmp/elmo_prepare_bench", "Scratch directory (created; deleted at the end).")
flags.DEFINE_integer("block_sentences", 2_000_000, "Sentences of the synthetic block the files repeat.")
flags.DEFINE_integer("file_mb", 512, "Size of each text file, MB.")
flags.DEFINE_bool("keep", False, "Keep the text and the prepared shards.")
flags.DEFINE_bool("baselines", True, "Also time the baselines on the largest corpus.")
flags.DEFINE_list("writer_processes", ["0", "2"], "Preparations per size, with these many shard-writing helpers.")

PREPARE = """
import json, os, resource, sys, time
from elmo_jax.data import local_corpus
start, cpu = time.perf_counter(), time.process_time()
corpus = local_corpus.prepare_local_corpus(sys.argv[1], None, sys.argv[2], name="bench",
                                           writer_processes=int(sys.argv[3]))
stats = local_corpus.read_stats(corpus)["train"]
helpers = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                  "helpers_cpu": helpers.ru_utime + helpers.ru_stime,
                  # the largest helper's peak; Linux counts the parent's resident set at the fork in it,
                  # so this is an upper bound
                  "helper_peak_rss_mb": helpers.ru_maxrss / 1024 if int(sys.argv[3]) else 0.0,
                  "sentences": stats.sentences, "shards": len(corpus.splits["train"]),
                  "bytes_written": sum(os.path.getsize(os.path.join(corpus.directory, s.file))
                                       for s in corpus.splits["train"])}))
"""

READ_BYTES = """
import glob, json, sys, time
start, cpu, n = time.perf_counter(), time.process_time(), 0
for path in sorted(glob.glob(sys.argv[1])):
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += len(chunk)
print(json.dumps({"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu, "bytes": n}))
"""

DECODE = """
import glob, json, sys, time
start, cpu, n = time.perf_counter(), time.process_time(), 0
for path in sorted(glob.glob(sys.argv[1])):
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += len(chunk.decode("utf-8", "replace"))
print(json.dumps({"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu, "chars": n}))
"""

READ_RECORDS = """
import json, sys, time
from elmo_jax.data import text_files
start, cpu, n = time.perf_counter(), time.process_time(), 0
for block in text_files.iter_record_blocks(sys.argv[1]):
    n += block.count(b"\\n")
print(json.dumps({"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu, "sentences": n}))
"""


# Appended to each child: its peak resident set, VmHWM of its own address space. (wait4's ru_maxrss is
# no good here: Linux carries the parent's high-water mark across fork and exec into the child's.)
PEAK_RSS = """
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(json.dumps({"peak_rss_mb": int(line.split()[1]) / 1024}))
"""


def run_child(code: str, *args: str) -> dict:
    """Runs `code` in a fresh Python; its JSON line, plus its peak RSS in MB."""
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", code + PEAK_RSS, *args], capture_output=True, env=env, text=True, check=False
    )
    if result.returncode:
        raise RuntimeError(f"child exited {result.returncode}: {result.stderr[-2000:]}")
    lines = result.stdout.strip().splitlines()
    return {**json.loads(lines[-2]), **json.loads(lines[-1])}


def write_text(directory: str, size: float, block: bytes) -> str:
    """Files of FLAGS.file_mb MB repeating `block`, `size` bytes in all; returns their glob."""
    os.makedirs(directory, exist_ok=True)
    file_bytes, written, index = FLAGS.file_mb * 10**6, 0, 0
    while written < size:
        target = min(file_bytes, size - written)
        with open(os.path.join(directory, f"part-{index:04d}.txt"), "wb") as f:
            done = 0
            while done < target:
                piece = block[: int(target - done)]
                piece = piece[: piece.rfind(b"\n") + 1] or block[: block.find(b"\n") + 1]
                f.write(piece)
                done += len(piece)
        written += done
        index += 1
    return os.path.join(directory, "part-*.txt")


def main(argv):
    del argv
    root = os.path.abspath(FLAGS.dir)
    os.makedirs(root, exist_ok=True)
    try:
        block_path = os.path.join(root, "block.txt")
        write_synthetic_corpus(block_path, FLAGS.block_sentences, 100_000, 27.0)
        with open(block_path, "rb") as f:
            block = f.read()
        rows = []
        for size_gb in map(float, FLAGS.sizes_gb):
            text = write_text(os.path.join(root, f"text_{size_gb:g}"), size_gb * 1e9, block)
            text_bytes = sum(
                os.path.getsize(os.path.join(os.path.dirname(text), p)) for p in os.listdir(os.path.dirname(text))
            )
            for processes in FLAGS.writer_processes:
                prepared = os.path.join(root, f"prepared_{size_gb:g}")
                result = run_child(PREPARE, text, prepared, processes)
                result.update(size_gb=size_gb, text_bytes=text_bytes, writer_processes=int(processes))
                rows.append(result)
                print(json.dumps(result), flush=True)
                shutil.rmtree(prepared)
            if not FLAGS.keep and size_gb != max(map(float, FLAGS.sizes_gb)):
                shutil.rmtree(os.path.dirname(text))
        largest = rows[-1]
        text = os.path.join(root, f"text_{largest['size_gb']:g}", "part-*.txt")
        baselines = {}
        if FLAGS.baselines:
            baselines = {
                "read the bytes": run_child(READ_BYTES, text),
                "read and decode UTF-8 in bulk": run_child(DECODE, text),
                "read as records (text_blocks), no writing": run_child(READ_RECORDS, text),
            }
            print(json.dumps(baselines), flush=True)

        print(f"\n{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end\n")
        print(
            "| text | sentences | shards | writer processes | peak RSS: main + largest helper | wall | CPU: main + "
            "helpers | MB/s (wall) | MB/s (CPU) | written / text |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            mb, cpu = r["text_bytes"] / 1e6, r["cpu"] + r["helpers_cpu"]
            print(
                f"| {mb / 1e3:.2f} GB | {r['sentences']:,} | {r['shards']} | {r['writer_processes']} "
                f"| {r['peak_rss_mb']:.0f} + {r['helper_peak_rss_mb']:.0f} MB | {r['wall']:.0f} s "
                f"| {r['cpu']:.0f} + {r['helpers_cpu']:.0f} s | {mb / r['wall']:.1f} | {mb / cpu:.1f} "
                f"| {r['bytes_written'] / r['text_bytes']:.2f} |"
            )
        mb = largest["text_bytes"] / 1e6
        for name, r in baselines.items():
            print(
                f"| baseline: {name} ({mb / 1e3:.2f} GB) | | | | {r['peak_rss_mb']:.0f} MB | {r['wall']:.0f} s | "
                f"{r['cpu']:.0f} s | {mb / r['wall']:.1f} | {mb / max(r['cpu'], 1e-9):.1f} | |"
            )
    finally:
        if not FLAGS.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
