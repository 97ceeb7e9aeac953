"""Character ids of streamed tokens, each distinct token converted once.

Text repeats its words (Zipf: in 1B-Word-like text the 2,000 most frequent types are two thirds of the
tokens), so `CharIdTable` keeps one row of shifted ids per type it has seen and builds a sentence's
(n, C) ids with one NumPy gather, instead of converting every token in Python (`chars.token_to_raw_ids`;
its cost per token: bench/RESULTS.md, "Design figures"). The table also keeps each type's content width,
from which a sentence's char-CNN width bucket follows without looking at its ids again, and whether the
type is cut (`chars.is_truncated`: over C-2 UTF-8 bytes), so that `truncated` counts the cut tokens of
every sentence it converts with one NumPy gather too (docs/ELMO.md, "Long tokens"). Memory is bounded:
past `max_types` types the table starts over.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elmo_jax.model.chars import PAD_CHAR, is_truncated, token_to_raw_ids

DEFAULT_MAX_TYPES = 1 << 18  # 262,144 types x C=50 int32: 52 MB at most


class CharIdTable:
    """Shifted character ids (`batch_to_ids`'s values) of tokens, memoized per type.

    Args:
      max_characters_per_token: C.
      max_types: types kept before the table is cleared (it then fills again).

    Attributes:
      truncated: tokens given to `ids` so far that were cut to C-2 UTF-8 bytes.
    """

    def __init__(self, max_characters_per_token: int, max_types: int = DEFAULT_MAX_TYPES):
        self.C, self.max_types = max_characters_per_token, max_types
        self._index: dict[str, int] = {}
        self._ids = np.zeros((1024, self.C), np.int32)
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
        """(shifted ids int32 (n, C), content width: 1 + the last non-PAD position of any of them)."""
        rows = self.rows(tokens)
        self.truncated += int(np.count_nonzero(self._cut[rows]))
        return self._ids[rows], int(self._widths[rows].max(initial=1))

    def _add(self, token: str, row: int) -> int:
        if row == len(self._ids):
            self._ids = np.concatenate([self._ids, np.zeros_like(self._ids)])
            self._widths = np.concatenate([self._widths, np.zeros_like(self._widths)])
            self._cut = np.concatenate([self._cut, np.zeros_like(self._cut)])
        ids = token_to_raw_ids(token, self.C) + 1
        self._ids[row] = ids
        content = np.nonzero(ids != PAD_CHAR + 1)[0]
        self._widths[row] = int(content[-1]) + 1 if content.size else 1
        self._cut[row] = is_truncated(token, self.C)
        return row


def width_bucket(width: int, max_characters_per_token: int) -> int:
    """`char_cnn.content_bucket` from a content width: a multiple of 8, at least 3 wide, at most C."""
    return min(-(-max(width, 3) // 8) * 8, max_characters_per_token)
