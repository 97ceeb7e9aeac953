"""The inputs the benchmarks feed: random English-like sentences as `embed` and `train_step` see them.

Shared by bench/embed_throughput.py, bench/train_throughput.py, bench/embed_sentences_vs_loop.py,
bench/serve_load.py and bench/run_all.py (which cannot import
those scripts: their absl flags would clash with its own).
"""

from __future__ import annotations

import collections

import numpy as np

import elmo_jax
from elmo_jax.data.batch_stream import BiLMBatchStream
from elmo_jax.data.vocab_builder import build_vocab


def word_batch(batch_size: int, n_tokens: int, seed: int = 0) -> np.ndarray:
    """Shifted char ids (B, T, C) of B sentences of T random lowercase words of 1-10 letters."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    sentences = [
        ["".join(rng.choice(letters, size=rng.integers(1, 11))) for _ in range(n_tokens)] for _ in range(batch_size)
    ]
    return elmo_jax.batch_to_ids(sentences)


def synthetic_window(
    batch_size: int, unroll_steps: int, max_chars: int, vocab_size: int, seed: int = 0
) -> dict[str, dict[str, np.ndarray]]:
    """One window of both directions from `BiLMBatchStream` over random sentences, as training feeds it.

    Words of 1-10 random lowercase letters (English-like lengths), drawn Zipf-like from min(V - 3, 5000)
    types, in sentences of about 27 tokens; the vocabulary holds them all, so ids stay below V.
    """
    rng = np.random.default_rng(seed)
    n_types = max(1, min(vocab_size - 3, 5000))
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    types = list({rng.choice(letters, rng.integers(1, 11)).tobytes().decode(): None for _ in range(n_types)})
    p = 1.0 / (np.arange(len(types)) + 2.7)
    lengths = 1 + rng.negative_binomial(3, 3.0 / (3.0 + 26.0), 4 * batch_size)
    ids = rng.choice(len(types), size=int(lengths.sum()), p=p / p.sum())
    words = [types[i] for i in ids]
    ends = np.cumsum(lengths)
    sentences = [" ".join(words[end - n : end]) for n, end in zip(lengths, ends)]
    vocab = build_vocab(collections.Counter(words))
    stream = BiLMBatchStream(
        sentences,
        vocab,
        batch_size=batch_size,
        unroll_steps=unroll_steps,
        seed=seed,
        max_characters_per_token=max_chars,
    )
    return next(stream)


def make_sentences(n: int, seed: int) -> list[list[str]]:
    """n sentences: lognormal lengths clipped to 1-60 tokens; words Zipf-like from 20,000 types whose
    lengths (1 + Poisson(6), at most 20 letters) are sorted so that the frequent types are the short ones."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    n_types = 20_000
    type_lengths = np.sort(np.minimum(1 + rng.poisson(6.0, n_types), 20))
    types = [rng.choice(letters, k).tobytes().decode() for k in type_lengths]
    p = 1.0 / (np.arange(n_types) + 2.7)
    lengths = np.clip(rng.lognormal(2.7, 0.6, n).astype(int), 1, 60)
    ids = rng.choice(n_types, size=int(lengths.sum()), p=p / p.sum())
    ends = np.cumsum(lengths)
    return [[types[i] for i in ids[end - k : end]] for k, end in zip(lengths, ends)]
