"""Feature-extraction throughput of `elmo_jax.embed`, and how close it runs to the machine's matmul speed.

    python bench/embed_throughput.py                      # small and original, 32x20 and 64x40
    python bench/embed_throughput.py --sizes=original --shapes=64x40 --compute_dtype=bfloat16

For each published size (random weights, same shapes as the published files) and batch shape B x T it
prints tokens/s of `embed` (compile excluded, best of --repeats), the compile time, the achieved model
FLOP/s (`elmo_jax.model.flops`, nominal architecture FLOPs) and that as a fraction of the float32 matmul
throughput measured in the same run, plus the ratio to AllenNLP's tokens/s on this machine class where
we have a reference. Memory: XLA's planned bytes for the call (arguments + temporaries + outputs) and the
peak RSS of a fresh process that loads the model and runs one call.

Inputs: sentences of random lowercase words of 1-10 letters (English-like lengths; the char CNN only
looks at the characters a batch really has), and a worst case of random bytes in all 48 slots of every
token ("random" rows), so neither figure hides the other.
"""

from __future__ import annotations

import json
import pathlib
import resource
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root, for bench.common

import jax
import numpy as np
from absl import app, flags

import elmo_jax
from bench.common import matmul_throughput, platform_line
from bench.workloads import word_batch
from elmo_jax.features.embed import _content_bucket, _embed_jit  # embed's jitted core, for XLA's memory plan
from elmo_jax.model.flops import embed_flops
from elmo_jax.model.precision import ComputeOptions

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["small", "original"], "Published model sizes to run.")
flags.DEFINE_list("shapes", ["32x20", "64x40"], "Batch shapes BxT.")
flags.DEFINE_integer("repeats", 5, "Timed calls per case; the best is reported.")
flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "embed's compute dtype.")
flags.DEFINE_bool("worst_case", True, "Also time random-byte tokens that fill all character slots.")
flags.DEFINE_bool("memory", True, "Measure peak RSS of original at 64x40 in a fresh process.")
flags.DEFINE_string("child", None, "Internal: run one memory probe 'size:BxT' and print JSON.")

# AllenNLP 2.10 (PyTorch, CPU) tokens/s on this 2-core machine class, from the issue tracker (#2).
ALLENNLP_TOKENS_PER_S = {("original", 32, 20): 280.0, ("small", 32, 20): 1350.0}


def random_batch(batch_size: int, n_tokens: int, seed: int = 0) -> np.ndarray:
    """Every token: BOW, 48 random bytes, EOW (shifted ids), the CNN's worst case."""
    rng = np.random.default_rng(seed)
    ids = np.empty((batch_size, n_tokens, 50), np.int32)
    ids[..., 0] = elmo_jax.model.chars.BOW_CHAR + 1
    ids[..., 1:49] = rng.integers(0, 256, size=(batch_size, n_tokens, 48)) + 1
    ids[..., 49] = elmo_jax.model.chars.EOW_CHAR + 1
    return ids


def time_embed(params, ids: np.ndarray, repeats: int) -> tuple[float, float]:
    """(compile seconds, best call seconds) of embed on ids."""
    start = time.perf_counter()
    jax.block_until_ready(elmo_jax.embed(params, ids, compute_dtype=FLAGS.compute_dtype))
    compile_s = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(elmo_jax.embed(params, ids, compute_dtype=FLAGS.compute_dtype))
        best = min(best, time.perf_counter() - start)
    return compile_s - best, best


def planned_bytes(params, ids: np.ndarray) -> int:
    """XLA's memory plan for one embed call: arguments + temporaries + outputs."""
    config = params.config
    compute = ComputeOptions(dtype=FLAGS.compute_dtype, content_positions=_content_bucket(ids, 50))
    compiled = _embed_jit.lower(
        params,
        ids,
        elmo_jax.zero_state(config, ids.shape[0]),
        return_state=False,
        keep_boundaries=False,
        compute=compute,
    ).compile()
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes


def memory_probe(spec: str) -> None:
    """Child process: load random weights of `size`, run one embed, print peak RSS as JSON."""
    size, shape = spec.split(":")
    B, T = (int(v) for v in shape.split("x"))
    params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(size), jax.random.key(0))
    ids = word_batch(B, T)
    jax.block_until_ready(elmo_jax.embed(params, ids, compute_dtype=FLAGS.compute_dtype))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_rss_bytes": peak, "planned_bytes": planned_bytes(params, ids)}))


def main(argv):
    del argv
    if FLAGS.child:
        memory_probe(FLAGS.child)
        return
    print(f"{platform_line()}, compute_dtype={FLAGS.compute_dtype}")
    peak = matmul_throughput()
    print(f"measured float32 matmul throughput (4096^3, HIGHEST): {peak / 1e9:.1f} GFLOP/s\n")
    header = (
        f"{'size':9}{'input':8}{'BxT':>7}{'S':>4}{'tokens/s':>10}{'compile s':>10}{'GFLOP/s':>9}"
        f"{'of matmul':>10}{'vs AllenNLP':>12}"
    )
    print(header)
    print("-" * len(header))
    for size in FLAGS.sizes:
        params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(size), jax.random.key(0))
        for shape in FLAGS.shapes:
            B, T = (int(v) for v in shape.split("x"))
            inputs = [("words", word_batch(B, T))] + ([("random", random_batch(B, T))] if FLAGS.worst_case else [])
            for label, ids in inputs:
                compile_s, best = time_embed(params, ids, FLAGS.repeats)
                tokens_per_s = B * T / best
                model_flops = embed_flops(params.config, B, T) / best
                ref = ALLENNLP_TOKENS_PER_S.get((size, B, T))
                vs = f"{tokens_per_s / ref:.2f}x" if ref and FLAGS.compute_dtype == "float32" else "-"
                print(
                    f"{size:9}{label:8}{shape:>7}{_content_bucket(ids, 50):>4}{tokens_per_s:>10.0f}"
                    f"{compile_s:>10.1f}{model_flops / 1e9:>9.1f}{model_flops / peak:>10.1%}{vs:>12}"
                )
    if FLAGS.memory:
        spec = "original:64x40"
        out = subprocess.run(
            [sys.executable, __file__, f"--child={spec}", f"--compute_dtype={FLAGS.compute_dtype}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        mem = json.loads(out.strip().splitlines()[-1])
        print(
            f"\nmemory, {spec} (words): peak RSS of a fresh process {mem['peak_rss_bytes'] / 2**30:.2f} GiB "
            f"(jax runtime + random weights + one call); XLA plan for the call "
            f"{mem['planned_bytes'] / 2**30:.2f} GiB"
        )


if __name__ == "__main__":
    app.run(main)
