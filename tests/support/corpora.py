"""Tiny corpora written by the tests themselves (nothing is downloaded).

The agreement language: one or two clauses "the|a NOUN VERB [ADVERB]" joined by "and", where each noun
has its own two verbs. A biLM can learn the agreement and the clause structure, a unigram model cannot,
so training on it must beat the unigram perplexity by far.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

NOUNS = {"cat": ("meows", "purrs"), "dog": ("barks", "growls"), "cow": ("moos", "grazes"), "bird": ("sings", "flies")}
ADVERBS = ("loudly", "softly", "today")


def agreement_sentence(rng: np.random.Generator) -> str:
    words = []
    for clause in range(int(rng.integers(1, 3))):
        if clause:
            words.append("and")
        noun = str(rng.choice(list(NOUNS)))
        words += [str(rng.choice(["the", "a"])), noun, str(rng.choice(NOUNS[noun]))]
        if rng.random() < 0.5:
            words.append(str(rng.choice(ADVERBS)))
    return " ".join(words)


def write_agreement_corpus(root: Path, n_train: int = 300, n_heldout: int = 60, seed: int = 0) -> dict:
    """train.txt and heldout.txt under `root`.

    Returns:
      {"train", "heldout": file paths (str), "train_sentences", "heldout_sentences": the lines,
       "cache_dir": where training prepares them (shared by every run, so they are prepared once)}.
    """
    rng = np.random.default_rng(seed)
    sentences = {
        "train": [agreement_sentence(rng) for _ in range(n_train)],
        "heldout": [agreement_sentence(rng) for _ in range(n_heldout)],
    }
    return _write_splits(root, sentences)


def _write_splits(root: Path, sentences: dict[str, list[str]]) -> dict:
    """Each split's sentences as `root/SPLIT.txt`; returns what `write_agreement_corpus` returns."""
    out = {"cache_dir": str(root / "prepared")}
    for split, lines in sentences.items():
        path = root / f"{split}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        out[split], out[f"{split}_sentences"] = str(path), lines
    return out


# The lexicon of `write_zipf_corpus`: made-up words, so no real text is needed.
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "pe", "du", "za", "fo")


def _made_up_words(rng: np.random.Generator, n: int, syllables: int) -> list[str]:
    if n > len(_SYLLABLES) ** syllables:
        raise ValueError(f"{n} words of {syllables} syllables: there are only {len(_SYLLABLES) ** syllables}")
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(_SYLLABLES, size=syllables)))
    return sorted(words)


def zipf_sentence(rng: np.random.Generator, lexicon: dict) -> str:
    """One sentence of the Zipfian agreement language (`write_zipf_corpus`)."""
    nouns, ranks = lexicon["nouns"], lexicon["noun_ranks"]
    words = []
    for clause in range(int(rng.integers(1, 4))):
        if clause:
            words.append(str(rng.choice(["and", "but", "while"])))
        noun = int(rng.choice(len(nouns), p=ranks))
        words += [str(rng.choice(["the", "a", "every"])), nouns[noun]]
        if rng.random() < 0.3:
            words.append(str(rng.choice(lexicon["adjectives"])))
        words.append(lexicon["verbs"][noun][int(rng.integers(2))])
        if rng.random() < 0.5:
            words.append(str(rng.choice(lexicon["adverbs"], p=lexicon["adverb_ranks"])))
    return " ".join(words) + " ."


def write_zipf_corpus(root: Path, n_train: int = 6000, n_heldout: int = 400, n_nouns: int = 300, seed: int = 0) -> dict:
    """train.txt and heldout.txt of a language with a Zipfian lexicon, under `root`: clauses "the|a|every
    NOUN [ADJECTIVE] VERB [ADVERB]" joined by "and", "but" or "while", ending in "."; each of `n_nouns`
    made-up nouns (drawn by Zipf's law) has its own two verbs, so the rare words are many and rarely drawn
    as sampled-softmax candidates, as in real text, while agreement gives a biLM much to learn that a
    unigram model cannot. Returns what `write_agreement_corpus` returns."""
    rng = np.random.default_rng(seed)
    nouns = _made_up_words(rng, n_nouns, 3)
    verbs = _made_up_words(rng, 2 * n_nouns + 40, 4)
    lexicon = {
        "nouns": nouns,
        "noun_ranks": _zipf(n_nouns),
        "verbs": [verbs[2 * i : 2 * i + 2] for i in range(n_nouns)],
        "adjectives": [w + "y" for w in verbs[2 * n_nouns : 2 * n_nouns + 20]],
        "adverbs": [w + "ly" for w in verbs[2 * n_nouns + 20 :]],
        "adverb_ranks": _zipf(20),
    }
    sentences = {
        "train": [zipf_sentence(rng, lexicon) for _ in range(n_train)],
        "heldout": [zipf_sentence(rng, lexicon) for _ in range(n_heldout)],
    }
    return _write_splits(root, sentences)


def _zipf(n: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1)
    return p / p.sum()
