"""Tokens/s of ELMo feature extraction with and without the token-embedding cache, and their ratio.

    python bench/token_cache_throughput.py                       # the small size, 32x20 batches
    python bench/token_cache_throughput.py --sizes=small,original --batch_size=64

Text: the heldout sentences of the embedded default corpus (`elmo_jax.default_corpus`); the cache
holds the training vocabulary, so heldout words missing from it go through the char CNN, as they
would for a user's text. Both paths start from tokenized sentences (the char path includes
`batch_to_ids`, the cached one its lookups) and end with the layers on the host; random weights of
the published shapes. Each figure is the best of --repeats passes over the same batches, compile
excluded; the cache's one-off build time is printed too. The largest difference between the two
paths' layers is printed as a check.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root, for bench.common

import jax
import numpy as np
from absl import app, flags

import elmo_jax
from bench.common import platform_line
from elmo_jax.data import default_corpus, vocab_builder

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["small"], "Published model sizes (random weights): small, medium, original.")
flags.DEFINE_integer("batch_size", 32, "Sentences per call.")
flags.DEFINE_integer("max_tokens", 20, "Sentences are cut to this many tokens (the batch's T).")
flags.DEFINE_integer("batches", 8, "Batches per pass.")
flags.DEFINE_integer("repeats", 3, "Timed passes; the best is reported.")


def read_text(tmp: str) -> tuple[list[str], list[list[str]]]:
    """(training vocabulary, heldout sentences) of the default corpus."""
    train_path, heldout_path = default_corpus.build_default_corpus(tmp)
    counts, _ = vocab_builder.count_tokens([train_path])
    words = vocab_builder.build_vocab(counts).words
    with open(heldout_path, encoding="utf-8") as f:
        sentences = [line.split()[: FLAGS.max_tokens] for line in f if line.strip()]
    return words, sentences


def best_pass(embed_batch, batches) -> tuple[float, list]:
    """(best seconds of one pass over batches, the last pass's outputs); the first call compiles."""
    for batch in batches:
        jax.block_until_ready(embed_batch(batch))
    best, outputs = float("inf"), []
    for _ in range(FLAGS.repeats):
        start = time.perf_counter()
        outputs = [np.asarray(embed_batch(batch)[0]) for batch in batches]
        best = min(best, time.perf_counter() - start)
    return best, outputs


def run_size(size: str, words: list[str], sentences: list[list[str]]) -> None:
    params = elmo_jax.init_params(elmo_jax.BiLMConfig.preset(size), jax.random.key(0))
    start = time.perf_counter()
    cache = elmo_jax.build_token_cache(params, words)
    build_s = time.perf_counter() - start
    B = FLAGS.batch_size
    batches = [sentences[i * B : (i + 1) * B] for i in range(FLAGS.batches)]
    batches = [b for b in batches if len(b) == B]
    if not batches:
        raise ValueError(f"not enough heldout sentences for one batch of {B}")
    n_tokens = sum(len(s) for b in batches for s in b)
    oov = sum(w not in cache.index for b in batches for s in b for w in s)
    char_s, char_out = best_pass(lambda b: elmo_jax.embed(params, elmo_jax.batch_to_ids(b)), batches)
    cache_s, cache_out = best_pass(lambda b: elmo_jax.embed_tokens(params, cache, b), batches)
    diff = max(float(np.max(np.abs(a - c))) for a, c in zip(char_out, cache_out))
    print(
        f"{size}: cache of {len(cache)} tokens built in {build_s:.1f} s; {len(batches)} batches of {B} "
        f"sentences, {n_tokens} tokens, {oov / n_tokens:.1%} not in the cache"
    )
    print(f"  char CNN path   {n_tokens / char_s:10,.0f} tokens/s")
    print(f"  token cache     {n_tokens / cache_s:10,.0f} tokens/s")
    print(f"  speed-up        {char_s / cache_s:10.2f}x   (max |difference| of the layers {diff:.2e})")


def main(argv):
    del argv
    print(platform_line())
    with tempfile.TemporaryDirectory() as tmp:
        words, sentences = read_text(tmp)
    for size in FLAGS.sizes:
        run_size(size, words, sentences)


if __name__ == "__main__":
    app.run(main)
