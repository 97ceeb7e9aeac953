"""Character ids of streamed tokens, each distinct token converted once.

Text repeats its words (Zipf: in 1B-Word-like text the 2,000 most frequent types are two thirds of the
tokens), so `CharIdTable` keeps one row of shifted ids per type it has seen and builds a sentence's
(n, C) ids with one NumPy gather, instead of converting every token in Python (`chars.token_to_raw_ids`;
its cost per token: bench/RESULTS.md, "Design figures"). The table also keeps each type's content width,
from which a sentence's char-CNN width bucket follows without looking at its ids again, and whether the
type is cut (over C-2 UTF-8 bytes, or characters), so that `truncated` counts the cut tokens of
every sentence it converts with one NumPy gather too (docs/ELMO.md, "Long tokens"). The ids are the
model's (`vocabulary.TokenVocabulary`: bytes, or its own characters and words). Memory is bounded:
past `max_types` types the table starts over.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elmo_jax.model.vocabulary import TokenVocabulary, pad_id

DEFAULT_MAX_TYPES = 1 << 18  # 262,144 types x C=50 int32: 52 MB at most


class CharIdTable:
    """A model's shifted ids (`TokenVocabulary.batch_ids`'s values) of tokens, memoized per type.

    Args:
      vocabulary: the model's (`vocabulary.token_vocabulary(params)`).
      max_types: types kept before the table is cleared (it then fills again).

    Attributes:
      truncated: tokens given to `ids` so far that were cut to C-2 UTF-8 bytes.
    """

    def __init__(self, vocabulary: TokenVocabulary, max_types: int = DEFAULT_MAX_TYPES):
        self.vocabulary, self.C, self.max_types = vocabulary, vocabulary.C, max_types
        self._pad = pad_id(vocabulary.config)
        self._index: dict[str, int] = {}
        self._ids = np.zeros((1024, vocabulary.width), np.int32)
        self._widths = np.zeros(1024, np.int32)
        self._cut = np.zeros(1024, bool)
        self.truncated = 0

    def __len__(self) -> int:
        return len(self._index)

    def rows(self, tokens: Sequence[str]) -> np.ndarray:
        """int64 (n,) rows of `tokens` in the table, adding the new types."""
        index = self._index
        if len(index) + len(tokens) > self.max_types:
            self._index = index = {}
        rows = np.empty(len(tokens), np.int64)
        for i, token in enumerate(tokens):
            row = index.get(token)
            if row is None:
                row = index[token] = self._add(token, len(index))
            rows[i] = row
        return rows

    def ids(self, tokens: Sequence[str]) -> tuple[np.ndarray, int]:
        """(shifted ids int32 (n, W), content width: 1 + the last non-PAD position of any of them)."""
        rows = self.rows(tokens)
        self.truncated += int(np.count_nonzero(self._cut[rows]))
        return self._ids[rows], int(self._widths[rows].max(initial=1))

    def _add(self, token: str, row: int) -> int:
        if row == len(self._ids):
            self._ids = np.concatenate([self._ids, np.zeros_like(self._ids)])
            self._widths = np.concatenate([self._widths, np.zeros_like(self._widths)])
            self._cut = np.concatenate([self._cut, np.zeros_like(self._cut)])
        ids = self.vocabulary.token_ids(token)
        self._ids[row] = ids
        content = np.nonzero(ids[: self.C] != self._pad)[0]
        self._widths[row] = int(content[-1]) + 1 if content.size else 1
        self._cut[row] = self.vocabulary.is_truncated(token)
        return row


def width_bucket(width: int, max_characters_per_token: int) -> int:
    """`char_cnn.content_bucket` from a content width: a multiple of 8, at least 3 wide, at most C."""
    return min(-(-max(width, 3) // 8) * 8, max_characters_per_token)
