"""Grouping sentences into batches of a few fixed shapes, so XLA compiles a bounded number of programs.

A sentence goes to the bucket (T, S): T the smallest length bucket that holds its tokens, S the
char-CNN width bucket of its longest token (`char_cnn.content_bucket`, which `embed` derives from the
ids). Every batch of bucket (T, S) has the same shape (rows(T), T, C), rows(T) = batch_tokens // T, so
`embed` compiles once per bucket that occurs: at most len(LENGTHS) x 7 programs, in practice a handful
(most text has tokens of < 14 bytes: S = 16). Sentences wait in their bucket until it holds a full
batch, so memory is bounded by the buckets, never by the input; `flush` pads the last batches with
empty rows to the same shape.

Without bucketing (`InputOrderBatcher`), batches follow the input and take each batch's own longest
sentence as T: the way AllenNLP's `elmo` command batches, and the baseline of
`bench/embed_file_throughput.py`.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator

import numpy as np

from elmo_jax.model.char_cnn import content_bucket

# Sentence lengths (tokens, without <S> </S>): fine steps where most sentences are, then ~1.5x apart,
# so padding wastes at most a third of a batch.
LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


@dataclasses.dataclass
class Piece:
    """A sentence, or a piece of a split long one: `chars` (n, C) are tokens offset..offset+n of `line`."""

    line: int
    offset: int
    chars: np.ndarray

    @property
    def n_tokens(self) -> int:
        return self.chars.shape[0]


@dataclasses.dataclass
class Batch:
    """`chars` int32 (rows, T, C); row i holds `pieces[i]`, rows past len(pieces) are empty padding."""

    chars: np.ndarray
    pieces: list[Piece]


def stack(pieces: list[Piece], rows: int, T: int, C: int) -> Batch:
    """A (rows, T, C) batch holding `pieces` in its first rows; the other rows and positions are padding."""
    chars = np.zeros((rows, T, C), np.int32)
    for row, piece in enumerate(pieces):
        chars[row, : piece.n_tokens] = piece.chars
    return Batch(chars, pieces)


def length_bucket(n_tokens: int, lengths: tuple[int, ...] = LENGTHS) -> int:
    """The smallest length bucket >= n_tokens; past the largest, the next multiple of the largest."""
    if n_tokens > lengths[-1]:
        return -(-n_tokens // lengths[-1]) * lengths[-1]
    return lengths[bisect.bisect_left(lengths, max(n_tokens, 1))]


class BucketBatcher:
    """Collects pieces per (T, S) bucket and hands out full batches of fixed shapes."""

    def __init__(self, batch_tokens: int, max_characters_per_token: int, lengths: tuple[int, ...] = LENGTHS):
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens must be positive, found {batch_tokens}")
        self.batch_tokens, self.C, self.lengths = batch_tokens, max_characters_per_token, lengths
        self._waiting: dict[tuple[int, int], list[Piece]] = {}

    def rows(self, T: int) -> int:
        return max(1, self.batch_tokens // T)

    def add(self, piece: Piece) -> Iterator[Batch]:
        """Files `piece`; yields its bucket's batch when that is full."""
        T = length_bucket(piece.n_tokens, self.lengths)
        key = (T, content_bucket(piece.chars, self.C))
        waiting = self._waiting.setdefault(key, [])
        waiting.append(piece)
        if len(waiting) == self.rows(T):
            del self._waiting[key]
            yield self._batch(T, waiting)

    def flush(self) -> Iterator[Batch]:
        """The partly filled batches, padded to their bucket's shape; the batcher is empty after."""
        waiting, self._waiting = self._waiting, {}
        for (T, _), pieces in sorted(waiting.items()):
            yield self._batch(T, pieces)

    def _batch(self, T: int, pieces: list[Piece]) -> Batch:
        return stack(pieces, self.rows(T), T, self.C)


class InputOrderBatcher:
    """Batches in input order, each padded to its own longest sentence (no bucketing)."""

    def __init__(self, batch_tokens: int, max_characters_per_token: int):
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens must be positive, found {batch_tokens}")
        self.batch_tokens, self.C = batch_tokens, max_characters_per_token
        self._pieces: list[Piece] = []
        self._longest = 1

    def add(self, piece: Piece) -> Iterator[Batch]:
        if self._pieces and max(self._longest, piece.n_tokens) * (len(self._pieces) + 1) > self.batch_tokens:
            yield from self.flush()
        self._pieces.append(piece)
        self._longest = max(self._longest, piece.n_tokens)

    def flush(self) -> Iterator[Batch]:
        if self._pieces:
            pieces, self._pieces, longest, self._longest = self._pieces, [], self._longest, 1
            yield stack(pieces, len(pieces), longest, self.C)
