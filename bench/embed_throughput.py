"""Feature-extraction throughput of `elmo_jax.embed`, and how close it runs to the machine's matmul speed.

    python bench/embed_throughput.py                      # small and original, 32x20 and 64x40
    python bench/embed_throughput.py --sizes=original --shapes=64x40 --compute_dtype=bfloat16
    python bench/embed_throughput.py --encoders=allennlp,efml   # ELMoForManyLangs' token encoder beside

For each published size (random weights, same shapes as the published files) and batch shape B x T it
prints tokens/s of `embed` (compile excluded, best of --repeats), the compile time, the achieved model
FLOP/s (`elmo_jax.model.flops`, nominal architecture FLOPs) and that as a fraction of the float32 matmul
throughput measured in the same run, plus the ratio to AllenNLP's tokens/s on this machine class where
we have a reference. Memory: XLA's planned bytes for the call (arguments + temporaries + outputs) and the
peak RSS of a fresh process that loads the model and runs one call.

Inputs: sentences of random lowercase words of 1-10 letters (English-like lengths; the char CNN only
looks at the characters a batch really has), and a worst case of random bytes in all 48 slots of every
token ("random" rows), so neither figure hides the other.

`--encoders=allennlp,efml` runs each size twice, in one process, side by side: bilm-tf/AllenNLP's token
encoder (UTF-8 bytes, character embedding 16) and ELMoForManyLangs' (its released token encoder, EFML's
cnn_50_100_512_4096_sample.json: its own character vocabulary, here 10,000 characters, character
embedding 50, and a word embedding of 100 over 100,000 words concatenated before the projection), the
LSTMs, filters and highway layers the size's own. The efml rows' "random" tokens are 48 random characters
of its vocabulary; its "words" rows the same random words (their letters are in the vocabulary, the words
are not: every word id is the unknown word's). "vs allennlp" is the ratio of tokens/s to the first
encoder's: the encoders of a case are compiled, then timed in turns (one call of each per round, best
of --repeats), so a machine whose load changes slows both alike.
"""

from __future__ import annotations

import dataclasses
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
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.flops import embed_flops
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.model.vocabulary import TokenVocabulary

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["small", "original"], "Published model sizes to run.")
flags.DEFINE_list("shapes", ["32x20", "64x40"], "Batch shapes BxT.")
flags.DEFINE_list("encoders", ["allennlp"], "Token encoders to run per size: allennlp, efml (see the module doc).")
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


# ELMoForManyLangs' released token encoder (cnn_50_100_512_4096_sample.json): character embedding 50, word
# embedding 100; the vocabulary sizes are this bench's (a Chinese model's characters, EFML's --max_vocab_size).
EFML_CHARACTERS, EFML_WORDS, EFML_CHAR_DIM, EFML_WORD_DIM = 10_000, 100_000, 50, 100
EFML_SPECIALS = 5  # raw character ids 0..4: bos, eos, bow, eow, pad; 5 the unknown character
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def efml_shaped(config: BiLMConfig) -> tuple[BiLMConfig, TokenVocabulary]:
    """`config` with ELMoForManyLangs' token encoder instead of bilm-tf's, and a vocabulary for it: the 26
    letters and CJK ideographs up to EFML_CHARACTERS, EFML_WORDS words of which none is a random word."""
    shaped = dataclasses.replace(
        config,
        char_embed_dim=EFML_CHAR_DIM,
        char_vocab_size=EFML_SPECIALS + 1 + EFML_CHARACTERS,
        char_specials=tuple(range(EFML_SPECIALS)),
        word_vocab_size=EFML_WORDS,
        word_dim=EFML_WORD_DIM,
        word_specials=(2, 3),  # EFML's word.dic: <oov>, <pad>, <bos>, <eos>, words
    )
    ideographs = [chr(0x4E00 + i) for i in range(EFML_CHARACTERS - len(LETTERS))]
    characters = {c: EFML_SPECIALS + 1 + i for i, c in enumerate([*LETTERS, *ideographs])}
    words = {f"w{i}": 4 + i for i in range(EFML_WORDS - 4)}
    return shaped, TokenVocabulary(shaped, characters, EFML_SPECIALS, words, 0)


def efml_random_batch(vocabulary: TokenVocabulary, batch_size: int, n_tokens: int, seed: int = 0) -> np.ndarray:
    """Every token 48 random characters of the vocabulary: all character positions in use."""
    rng = np.random.default_rng(seed)
    pool = np.array(list(vocabulary.characters))
    width = vocabulary.C - 2
    sentences = [["".join(rng.choice(pool, width)) for _ in range(n_tokens)] for _ in range(batch_size)]
    return vocabulary.batch_ids(sentences)


def efml_word_batch(vocabulary: TokenVocabulary, batch_size: int, n_tokens: int, seed: int = 0) -> np.ndarray:
    """`word_batch`'s sentences (the same random words) as the vocabulary's ids."""
    rng = np.random.default_rng(seed)
    letters = np.array(list(LETTERS))
    sentences = [
        ["".join(rng.choice(letters, size=rng.integers(1, 11))) for _ in range(n_tokens)] for _ in range(batch_size)
    ]
    return vocabulary.batch_ids(sentences)


def encoder_cases(size: str, encoder: str):
    """(params, [(input label, ids builder (B, T) -> ids)]) of one size with one token encoder."""
    config = BiLMConfig.preset(size)
    if encoder == "allennlp":
        params = elmo_jax.init_params(config, jax.random.key(0))
        return params, [("words", word_batch), ("random", random_batch)]
    if encoder != "efml":
        raise ValueError(f"--encoders: {encoder!r} is not allennlp or efml")
    shaped, vocabulary = efml_shaped(config)
    params = elmo_jax.init_params(shaped, jax.random.key(0)).replace(vocabulary=vocabulary)
    cases = [("words", lambda B, T: efml_word_batch(vocabulary, B, T))]
    return params, cases + [("random", lambda B, T: efml_random_batch(vocabulary, B, T))]


def planned_bytes(params, ids: np.ndarray) -> int:
    """XLA's memory plan for one embed call: arguments + temporaries + outputs."""
    config = params.config
    compute = ComputeOptions(dtype=FLAGS.compute_dtype, content_positions=_content_bucket(ids, config))
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


def time_side_by_side(calls: list, repeats: int) -> list[tuple[float, float]]:
    """(compile seconds, best call seconds) of each (params, ids), compiled first, then timed in turns
    (one call of each per round), so a machine whose load changes slows every one of them alike."""
    compile_s, best = [], [float("inf")] * len(calls)
    for params, ids in calls:
        start = time.perf_counter()
        jax.block_until_ready(elmo_jax.embed(params, ids, compute_dtype=FLAGS.compute_dtype))
        compile_s.append(time.perf_counter() - start)
    for _ in range(repeats):
        for i, (params, ids) in enumerate(calls):
            start = time.perf_counter()
            jax.block_until_ready(elmo_jax.embed(params, ids, compute_dtype=FLAGS.compute_dtype))
            best[i] = min(best[i], time.perf_counter() - start)
    return [(c - b, b) for c, b in zip(compile_s, best)]


def print_row(size, encoder, label, shape, params, ids, timing, peak, first_tokens_per_s) -> float:
    """One row of the table; returns its tokens/s."""
    B, T = (int(v) for v in shape.split("x"))
    compile_s, best = timing
    tokens_per_s = B * T / best
    model_flops = embed_flops(params.config, B, T) / best
    ref = ALLENNLP_TOKENS_PER_S.get((size, B, T)) if encoder == "allennlp" else None
    vs = f"{tokens_per_s / ref:.2f}x" if ref and FLAGS.compute_dtype == "float32" else "-"
    ratio = f"{tokens_per_s / first_tokens_per_s:.2f}x" if first_tokens_per_s else "-"
    print(
        f"{size:9}{encoder:9}{label:8}{shape:>7}{_content_bucket(ids, params.config):>4}{tokens_per_s:>10.0f}"
        f"{compile_s:>10.1f}{model_flops / 1e9:>9.1f}{model_flops / peak:>10.1%}{vs:>12}{ratio:>14}"
    )
    return tokens_per_s


def main(argv):
    del argv
    if FLAGS.child:
        memory_probe(FLAGS.child)
        return
    print(f"{platform_line()}, compute_dtype={FLAGS.compute_dtype}")
    peak = matmul_throughput()
    print(f"measured float32 matmul throughput (4096^3, HIGHEST): {peak / 1e9:.1f} GFLOP/s\n")
    header = (
        f"{'size':9}{'encoder':9}{'input':8}{'BxT':>7}{'S':>4}{'tokens/s':>10}{'compile s':>10}{'GFLOP/s':>9}"
        f"{'of matmul':>10}{'vs AllenNLP':>12}{'vs ' + FLAGS.encoders[0]:>14}"
    )
    print(header)
    print("-" * len(header))
    for size in FLAGS.sizes:
        encoders = [(encoder, *encoder_cases(size, encoder)) for encoder in FLAGS.encoders]
        for shape in FLAGS.shapes:
            B, T = (int(v) for v in shape.split("x"))
            for i, label in enumerate(["words", "random"][: 2 if FLAGS.worst_case else 1]):
                calls = [(params, cases[i][1](B, T)) for _, params, cases in encoders]
                first = None
                for (encoder, params, _), (_, ids), timing in zip(
                    encoders, calls, time_side_by_side(calls, FLAGS.repeats)
                ):
                    tokens_per_s = print_row(size, encoder, label, shape, params, ids, timing, peak, first)
                    first = first or tokens_per_s
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
