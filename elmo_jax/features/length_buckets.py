"""Grouping sentences into batches of a few fixed shapes, so XLA compiles a bounded number of programs.

A sentence goes to the bucket (T, S): T the smallest length bucket that holds its tokens, S the
char-CNN width bucket of its longest token (`char_cnn.content_bucket`, which `embed` derives from the
ids). Every batch of bucket (T, S) has the same shape (rows(T), T, C), rows(T) = batch_tokens // T
(rounded up to a multiple of the devices the rows are split over), so XLA compiles once per bucket
that occurs: at most len(LENGTHS) x 7 programs, in practice a handful (most text has tokens of < 14
bytes: S = 16). Sentences wait in their bucket until it holds a full batch, so memory is bounded by
the buckets, never by the input. At the end, `flush` pads the last batches with empty rows to the same
shapes; a bucket's few leftover sentences ride in the last batch of a longer, wider bucket when there
is room, instead of filling a batch of their own with padding (fewer batches and no new shape;
measured: bench/RESULTS.md, "Design figures"). `flush_oldest` lets a caller that must return results in
input order release the bucket that holds the oldest sentence.

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
    """A sentence, or a piece of a split long one: `chars` (n, C) are tokens offset..offset+n of `line`.

    `S` is its char-CNN width bucket (`char_cnn.content_bucket` of `chars`); `tokens`, when kept, the
    tokens themselves (the token-cache path looks them up).
    """

    line: int
    offset: int
    chars: np.ndarray
    S: int = 0
    tokens: list[str] | None = None

    def __post_init__(self):
        if not self.S:
            self.S = content_bucket(self.chars, self.chars.shape[-1])

    @property
    def n_tokens(self) -> int:
        return self.chars.shape[0]


@dataclasses.dataclass
class Batch:
    """`chars` int32 (rows, T, C); row i holds `pieces[i]`, rows past len(pieces) are empty padding.

    `S` is the char-CNN width bucket of the whole batch (the largest of its pieces').
    """

    chars: np.ndarray
    pieces: list[Piece]
    S: int = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        """(rows, T, S): what decides the compiled program."""
        return self.chars.shape[0], self.chars.shape[1], self.S


def stack(pieces: list[Piece], rows: int, T: int, C: int) -> Batch:
    """A (rows, T, C) batch holding `pieces` in its first rows; the other rows and positions are padding."""
    chars = np.zeros((rows, T, C), np.int32)
    for row, piece in enumerate(pieces):
        chars[row, : piece.n_tokens] = piece.chars
    return Batch(chars, pieces, max((piece.S for piece in pieces), default=min(8, C)))


def length_bucket(n_tokens: int, lengths: tuple[int, ...] = LENGTHS) -> int:
    """The smallest length bucket >= n_tokens; past the largest, the next multiple of the largest."""
    if n_tokens > lengths[-1]:
        return -(-n_tokens // lengths[-1]) * lengths[-1]
    return lengths[bisect.bisect_left(lengths, max(n_tokens, 1))]


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class BucketBatcher:
    """Collects pieces per (T, S) bucket and hands out full batches of fixed shapes.

    Args:
      batch_tokens: padded tokens per batch: a bucket of length T holds rows(T) = batch_tokens // T rows.
      max_characters_per_token: ids per token, C (W for a model with word ids, `vocabulary.TokenVocabulary`).
      lengths: the length buckets.
      row_multiple: rows(T) is rounded up to a multiple of this (the number of devices the rows are
        split over).
    """

    def __init__(
        self,
        batch_tokens: int,
        max_characters_per_token: int,
        lengths: tuple[int, ...] = LENGTHS,
        *,
        row_multiple: int = 1,
    ):
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens must be positive, found {batch_tokens}")
        self.batch_tokens, self.C, self.lengths = batch_tokens, max_characters_per_token, lengths
        self.row_multiple = row_multiple
        self._waiting: dict[tuple[int, int], list[Piece]] = {}
        self._first: dict[tuple[int, int], int] = {}  # bucket -> sequence number of its oldest piece
        self._added = 0

    def rows(self, T: int) -> int:
        return round_up(max(1, self.batch_tokens // T), self.row_multiple)

    @property
    def waiting(self) -> int:
        """Pieces waiting in partly filled buckets."""
        return sum(len(pieces) for pieces in self._waiting.values())

    def add(self, piece: Piece) -> Iterator[Batch]:
        """Files `piece`; yields its bucket's batch when that is full."""
        T = length_bucket(piece.n_tokens, self.lengths)
        key = (T, piece.S)
        waiting = self._waiting.setdefault(key, [])
        if not waiting:
            self._first[key] = self._added
        self._added += 1
        waiting.append(piece)
        if len(waiting) == self.rows(T):
            del self._waiting[key], self._first[key]
            yield self._batch(T, waiting)

    def flush_oldest(self) -> Iterator[Batch]:
        """The partly filled batch of the bucket that has waited longest, padded to its shape."""
        if self._first:
            key = min(self._first, key=self._first.get)
            del self._first[key]
            yield self._batch(key[0], self._waiting.pop(key))

    def flush(self) -> Iterator[Batch]:
        """The partly filled batches, padded to bucket shapes; the batcher is empty after.

        A bucket's leftover pieces join the leftover of a later bucket at least as long and as wide when
        they fit in its last batch (so a few short sentences do not pay for a batch of their own), and
        no shape is made that the buckets do not already have.
        """
        waiting, self._waiting, self._first = self._waiting, {}, {}
        keys = sorted(waiting)
        for i, key in enumerate(keys):
            T, pieces = key[0], waiting[key]
            rows = self.rows(T)
            while len(pieces) >= rows:
                yield self._batch(T, pieces[:rows])
                pieces = pieces[rows:]
            if not pieces:
                continue
            later = next(
                (
                    other
                    for other in keys[i + 1 :]
                    if other[0] >= T
                    and other[1] >= key[1]
                    and len(waiting[other]) % self.rows(other[0]) > 0
                    and len(waiting[other]) % self.rows(other[0]) + len(pieces) <= self.rows(other[0])
                ),
                None,
            )
            if later is None:
                yield self._batch(T, pieces)
            else:
                waiting[later] = waiting[later] + pieces

    def _batch(self, T: int, pieces: list[Piece]) -> Batch:
        return stack(pieces, self.rows(T), T, self.C)


class InputOrderBatcher:
    """Batches in input order, each padded to its own longest sentence (no bucketing)."""

    def __init__(self, batch_tokens: int, max_characters_per_token: int, *, row_multiple: int = 1):
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens must be positive, found {batch_tokens}")
        self.batch_tokens, self.C, self.row_multiple = batch_tokens, max_characters_per_token, row_multiple
        self._pieces: list[Piece] = []
        self._longest = 1

    @property
    def waiting(self) -> int:
        return len(self._pieces)

    def flush_oldest(self) -> Iterator[Batch]:
        yield from self.flush()

    def add(self, piece: Piece) -> Iterator[Batch]:
        if self._pieces and max(self._longest, piece.n_tokens) * (len(self._pieces) + 1) > self.batch_tokens:
            yield from self.flush()
        self._pieces.append(piece)
        self._longest = max(self._longest, piece.n_tokens)

    def flush(self) -> Iterator[Batch]:
        if self._pieces:
            pieces, self._pieces, longest, self._longest = self._pieces, [], self._longest, 1
            yield stack(pieces, round_up(len(pieces), self.row_multiple), longest, self.C)
