"""What ELMo adds, shown on a few sentences (`python -m elmo_jax.embed_text` prints it).

For each word that occurs more than once among the sentences, how similar its vectors are across its
occurrences, layer by layer. The token layer (layer 0, the char CNN) sees each word alone, so the same
word has the same vector wherever it occurs (similarity 1); the LSTM layers see the word in its sentence,
so their vectors differ with the context: that difference is what a task model gets from ELMo beyond a
word vector. Words are matched exactly (case and all), as the char CNN reads them.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RepeatedWord:
    """A word that occurs more than once, and how alike its vectors are.

    Attributes:
      word: the token.
      places: (sentence, token) index of each occurrence.
      similarity: per layer, the mean cosine similarity of its vectors over every pair of occurrences.
    """

    word: str
    places: tuple[tuple[int, int], ...]
    similarity: tuple[float, ...]


def repeated_words(sentences: list[list[str]], layers: np.ndarray) -> list[RepeatedWord]:
    """The words occurring more than once in `sentences`, in order of first occurrence.

    Args:
      sentences: the tokenized sentences.
      layers: float (B, L+1, T, 2P), `embed`'s layers of those sentences.
    """
    places: dict[str, list[tuple[int, int]]] = {}
    for b, sentence in enumerate(sentences):
        for t, token in enumerate(sentence):
            places.setdefault(token, []).append((b, t))
    found = []
    for word, where in places.items():
        if len(where) < 2:
            continue
        vectors = np.stack([layers[b, :, t] for b, t in where]).astype(np.float64)  # (n, L+1, 2P)
        norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
        unit = vectors / np.maximum(norms, 1e-30)
        cosine = np.einsum("ild,jld->lij", unit, unit)  # (L+1, n, n)
        pairs = np.triu_indices(len(where), k=1)
        similarity = tuple(float(c[pairs].mean()) for c in cosine)
        found.append(RepeatedWord(word, tuple(where), similarity))
    return found


def describe(sentences: list[list[str]], layers: np.ndarray, mask: np.ndarray) -> str:
    """The lines `embed_text` prints: the shapes, then each repeated word's similarity per layer (or how
    to see one).

    Args:
      sentences: the tokenized sentences.
      layers: float (B, L+1, T, 2P); mask: bool (B, T).
    """
    n_layers = layers.shape[1]
    lines = [
        f"{len(sentences)} sentence(s) -> layers {layers.dtype} {tuple(layers.shape)} (sentences, layers, tokens, "
        f"2 x projection), mask {mask.dtype} {tuple(mask.shape)}",
        f"layer 0 is the token layer (the char CNN: each word alone); layers 1-{n_layers - 1} are the LSTM layers "
        "(each word in its sentence, both directions)",
    ]
    words = repeated_words(sentences, layers)
    if not words:
        lines.append(
            'no word occurs twice in these sentences; give two that share a word (e.g. "The bank of the river ." '
            '"The bank raised its rates .") to see its vectors change with the context'
        )
    for word in words:
        where = ", ".join(f"{b}:{t}" for b, t in word.places)
        values = "   ".join(f"layer {j}: {s:.3f}" for j, s in enumerate(word.similarity))
        lines.append(f"{word.word!r} at {where} (sentence:token); cosine similarity of its vectors:  {values}")
    if words:
        lines.append(
            "the token layer gives a word one vector wherever it occurs; the LSTM layers give it one per context"
        )
    return "\n".join(lines)
