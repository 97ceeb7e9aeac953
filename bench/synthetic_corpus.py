"""A synthetic corpus with 1B-Word-like statistics, for the benchmarks that need realistic text.

Deterministic for given arguments; written in blocks (bounded memory) and reused when already on disk.
"""

from __future__ import annotations

import os

import numpy as np

SYNTHETIC_BLOCK = 250_000  # sentences generated and written at a time

# English letter frequencies (percent), a..z.
LETTER_PERCENT = (
    8.2,
    1.5,
    2.8,
    4.3,
    12.7,
    2.2,
    2.0,
    6.1,
    7.0,
    0.15,
    0.77,
    4.0,
    2.4,
    6.7,
    7.5,
    1.9,
    0.095,
    6.0,
    6.3,
    9.1,
    2.8,
    0.98,
    2.4,
    0.15,
    2.0,
    0.074,
)


def synthetic_words(n_types: int, rng: np.random.Generator) -> list[str]:
    """n_types distinct lowercase words in rank order; length ~ 1 + 0.45 log2(rank + 2) + N(0, 1.5), 1..20."""
    ranks = np.arange(n_types)
    lengths = np.clip(np.rint(1.0 + 0.45 * np.log2(ranks + 2) + rng.normal(0.0, 1.5, n_types)), 1, 20).astype(int)
    p = np.asarray(LETTER_PERCENT) / np.sum(LETTER_PERCENT)
    letters = (rng.choice(26, size=(n_types, 24), p=p) + ord("a")).astype(np.uint8)
    words, seen = [], set()
    for rank in range(n_types):
        length, word, tries = lengths[rank], letters[rank, : lengths[rank]].tobytes().decode("ascii"), 0
        while word in seen:  # short spellings run out: redraw, and lengthen after a few tries
            tries += 1
            length += tries % 4 == 0
            word = (rng.choice(26, size=length, p=p) + ord("a")).astype(np.uint8).tobytes().decode("ascii")
        seen.add(word)
        words.append(word)
    return words


def write_synthetic_corpus(
    path: str, n_sentences: int, n_types: int, mean_tokens: float, seed: int = 0
) -> dict[str, int]:
    """Writes (unless present) a one-sentence-per-line corpus with 1B-Word-like statistics; returns word counts.

    Sentence lengths 1 + NegativeBinomial(3, .) with mean `mean_tokens`; tokens Zipf-Mandelbrot,
    p(rank) ~ 1 / (rank + 2.7), which puts about 3.5% of the tokens on the commonest word with 100k types
    (1B Word: "the" 4.3%, "," 4.8%). Written in blocks of SYNTHETIC_BLOCK sentences (bounded memory);
    deterministic for given arguments, so an existing file (and its counts, saved beside it) is reused.
    """
    rng = np.random.default_rng(seed)
    words = synthetic_words(n_types, rng)
    counts_path = path + ".counts.npy"
    if not (os.path.exists(path) and os.path.exists(counts_path)):
        p = 1.0 / (np.arange(n_types) + 2.7)
        p /= p.sum()
        vocabulary = np.asarray(words, dtype=object)
        counts = np.zeros(n_types, np.int64)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for first in range(0, n_sentences, SYNTHETIC_BLOCK):
                lengths = 1 + rng.negative_binomial(
                    3, 3.0 / (3.0 + mean_tokens - 1.0), min(SYNTHETIC_BLOCK, n_sentences - first)
                )
                ids = rng.choice(n_types, size=int(lengths.sum()), p=p)
                counts += np.bincount(ids, minlength=n_types)
                tokens, ends = vocabulary[ids], np.cumsum(lengths)
                f.write("".join(" ".join(tokens[end - n : end]) + "\n" for n, end in zip(lengths, ends)))
        np.save(counts_path, counts)
        os.replace(path + ".tmp", path)
    counts = np.load(counts_path)
    n_tokens = int(counts.sum())
    word_chars = np.fromiter(map(len, words), int, n_types)
    print(
        f"  1b-like corpus: {n_sentences:,} sentences, {n_tokens:,} tokens ({n_tokens / n_sentences:.1f} per "
        f"sentence), {np.count_nonzero(counts):,} of {n_types:,} types used, {np.mean(word_chars):.1f} chars per "
        f"type, {np.sum(counts * word_chars) / n_tokens:.1f} per token; {os.path.getsize(path) / 2**20:,.0f} MiB"
    )
    return {words[r]: int(counts[r]) for r in np.flatnonzero(counts)}
