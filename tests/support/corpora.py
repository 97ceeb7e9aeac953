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
    out = {"cache_dir": str(root / "prepared")}
    for split, lines in sentences.items():
        path = root / f"{split}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        out[split], out[f"{split}_sentences"] = str(path), lines
    return out
