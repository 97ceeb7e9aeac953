"""Several sentences per batch row: batches of a few fixed shapes with almost no padding.

`length_buckets` gives each sentence a row of its own, padded to its length bucket; a bucket's last
batch is padded with empty rows. On 1,000 sentences of 1-60 tokens (4,096-token batches) that ran
1.7 padded token positions per real token, and a hand loop over length-sorted batches of 64 (each padded
to its own longest sentence) was faster. Here the sentences are laid one after another in rows of
T2 time steps, each with its own `<S>` and `</S>`:

    row 0:  <S> a1 a2 .. a14 </S> <S> b1 .. b9 </S> <S> c1 c2 </S> ...   (T2 = 32, 64, 128, ...)

and `model.bilm.packed_layers` reads every sentence from a zero state in both directions (LSTM resets at
its `<S>`, and at its `</S>` for the backward direction), so its vectors are those it gets alone in a
row, up to the order of float32 sums. A row's length is a power of two, at least `MIN_ROW`, that holds
its longest sentence; the rest of the row is filled with the longest sentences that still fit
(best fit, longest first). A batch of rows of length T2 has rows(T2) = batch_tokens // T2 rows (a
multiple of the devices), so a width group needs a handful of programs whatever the input: one per row
length that occurs, and one for a last, partly filled batch, whose rows are rounded up to a power of two
or an eighth of a full batch and shortened to the power of two its fullest row needs (a single sentence
of 10 tokens runs as one row of 16 steps): a bounded set of shapes over any number of calls.

`RowPacker` is a drop-in for `length_buckets.BucketBatcher` (`add`, `flush_oldest`, `flush`): it waits
until it holds `CHUNK_BATCHES` batches' worth of time steps (so that best fit has many sentences to choose
from), hands out the full batches and keeps the sentences of the last, partly filled ones for the next
round; `flush` packs everything, folding a short row length's leftover rows into rows of the next length
(two rows of 32 steps make one of 64) before padding the last batch. Sentences are grouped by the char
CNN's width bucket S (`length_buckets.Piece.S`); a group of fewer than `GROUP_MIN_BATCHES` batches' worth
joins the next wider one (a wider S computes the same vectors, and fewer groups are fewer programs).

Packing needs rows of at least `MIN_ROW` steps on every device; with fewer than `MIN_ROW` x devices
tokens per batch (`can_pack`), callers use `length_buckets` instead.

The packer names its shapes (`RowPacker.shapes`): every (rows, T2) it can hand out for sentences of a
bounded length, each with sentences that make it, so that a caller that must have every program
compiled before it starts (the service's warm-up) asks here instead of re-deriving this policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from elmo_jax.features.length_buckets import Piece, round_up
from elmo_jax.model.vocabulary import byte_boundary_ids

MIN_ROW = 32  # time steps of the shortest row
MIN_TAIL_ROW = 8  # ... and of the rows of a last, partly filled batch (`tail_length`)
CHUNK_BATCHES = 16  # batches' worth of time steps collected before packing
GROUP_MIN_BATCHES = 2  # a width group smaller than this joins the next wider one
TAIL_STEPS = 8  # a last, partly filled batch has a multiple of 1/TAIL_STEPS of a full batch's rows
BOUNDARY_STEPS = 2  # <S> and </S>


def can_pack(batch_tokens: int, row_multiple: int) -> bool:
    """Whether a batch of `batch_tokens` time steps holds a row of `MIN_ROW` steps for each of the
    `row_multiple` devices."""
    return batch_tokens >= MIN_ROW * row_multiple


def row_length(steps: int) -> int:
    """The row length for a sentence of `steps` time steps (tokens + 2): a power of two >= MIN_ROW."""
    length = MIN_ROW
    while length < steps:
        length *= 2
    return length


def tail_length(content: int, T2: int) -> int:
    """The row length of a last batch whose rows of `T2` steps hold at most `content` steps: the power
    of two >= content, at least `MIN_TAIL_ROW` (a sentence or two alone are not padded to `MIN_ROW`)."""
    length = MIN_TAIL_ROW
    while length < content:
        length *= 2
    return min(length, T2)


@dataclasses.dataclass
class PackedBatch:
    """A batch of packed rows (see the module doc).

    Attributes:
      chars: int32 (rows, T2, C) shifted ids, each sentence between its `<S>` and `</S>`; padding after.
      starts: bool (rows, T2), true at each sentence's `<S>`.
      segments: int32 (rows, T2): k at the tokens of its row's k-th sentence, -1 elsewhere.
      pieces: the sentences (or pieces of split ones) it holds.
      places: per piece, (row, position of its first token, k).
      S: the char-CNN width bucket of the batch.
    """

    chars: np.ndarray
    starts: np.ndarray
    segments: np.ndarray
    pieces: list[Piece]
    places: list[tuple[int, int, int]]
    S: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """(rows, T2, S): what decides the compiled program."""
        return self.chars.shape[0], self.chars.shape[1], self.S

    @property
    def token_slots(self) -> int:
        """Time steps the batch runs less its sentences' boundaries: what `padded_tokens` counts (a
        bucket batch of one sentence per row counts rows x T, its boundaries excluded too)."""
        rows, T2, _ = self.shape
        return rows * T2 - BOUNDARY_STEPS * len(self.pieces)


def _filling(length: int, most: int) -> list[int]:
    """Token counts of sentences of at most `most` steps that fill one row beyond half of `length` steps,
    all of them in that row (equal sentences: best fit puts length // steps in a row), so a batch of such
    rows has rows of `length` steps (`row_length` of one of them, or `tail_length` of their sum)."""
    steps = min(most, length)
    return [steps - BOUNDARY_STEPS] * (length // steps)


def fill_rows(steps: list[int]) -> list[list[int]]:
    """Best fit, longest first: item indices per row, each row's items summing to at most
    `row_length` of its first (longest) item. `steps` are the items' time steps (tokens + 2, >= 3)."""
    by_steps: list[list[int]] = [[] for _ in range(max(steps, default=0) + 1)]
    for i in sorted(range(len(steps)), key=steps.__getitem__, reverse=True):
        by_steps[steps[i]].append(i)
    for stack in by_steps:
        stack.reverse()  # pop() takes the earliest-added item of each size first
    rows, longest, left = [], len(by_steps) - 1, len(steps)
    while left:
        while not by_steps[longest]:
            longest -= 1
        row = [by_steps[longest].pop()]
        left -= 1
        room = row_length(longest) - longest
        size = min(room, longest)
        while left and size >= BOUNDARY_STEPS + 1:
            while size > BOUNDARY_STEPS and not by_steps[size]:
                size -= 1
            if size <= BOUNDARY_STEPS:
                break
            row.append(by_steps[size].pop())
            left -= 1
            room -= size
            size = min(size, room)
        rows.append(row)
    return rows


class RowPacker:
    """Collects pieces and hands out packed batches of fixed shapes (see the module doc).

    Args:
      batch_tokens: time steps per batch: rows of T2 steps come rows(T2) = batch_tokens // T2 to a batch.
      max_characters_per_token: C.
      row_multiple: rows per batch are a multiple of this (the devices the rows are split over).
      boundaries: the model's `<S>` and `</S>` ids, each (W,) (`vocabulary.boundary_ids`); None: a bytes
        model's, W = C.
      chunk_batches: batches' worth of time steps collected before packing.
      tail_steps: a last, partly filled batch's rows are a multiple of 1/tail_steps of a full batch's
        (`tail_rows`): more steps, less padding in small batches and more programs.
    """

    def __init__(
        self,
        batch_tokens: int,
        max_characters_per_token: int,
        *,
        row_multiple: int = 1,
        boundaries: tuple[np.ndarray, np.ndarray] | None = None,
        chunk_batches: int = CHUNK_BATCHES,
        tail_steps: int = TAIL_STEPS,
    ):
        if not can_pack(batch_tokens, row_multiple):
            raise ValueError(
                f"batch_tokens={batch_tokens} cannot hold a row of {MIN_ROW} steps for each of {row_multiple} devices"
            )
        self.batch_tokens, self.C, self.row_multiple = batch_tokens, max_characters_per_token, row_multiple
        self.chunk_steps = chunk_batches * batch_tokens
        self.tail_steps = tail_steps
        self._waiting: list[Piece] = []
        self._steps = 0
        if boundaries is None:
            boundaries = (byte_boundary_ids("bos", self.C), byte_boundary_ids("eos", self.C))
        self._bos, self._eos = boundaries
        self.width = len(self._bos)  # ids per token

    @property
    def waiting(self) -> int:
        """Pieces not yet in a batch."""
        return len(self._waiting)

    def rows(self, T2: int) -> int:
        """Rows per full batch of rows of `T2` steps."""
        return round_up(max(1, self.batch_tokens // T2), self.row_multiple)

    def tail_rows(self, n_rows: int, T2: int) -> int:
        """Rows of a last, partly filled batch holding `n_rows` rows of `T2` steps: rounded up to a
        power of two or to a multiple of 1/`tail_steps` of a full batch (an eighth by default), whichever
        is fewer (and to the devices), so a single sentence runs in one row and there are about
        `tail_steps` + log2(tail_steps) such shapes at most per row length."""
        full = self.rows(T2)
        steps = round_up(n_rows, max(1, full // self.tail_steps))
        return min(round_up(min(1 << (n_rows - 1).bit_length(), steps), self.row_multiple), full)

    def shapes(self, max_tokens: int, longest_row: int | None = None) -> dict[tuple[int, int], list[int]]:
        """Every (rows, T2) of a batch this packer can hand out when no sentence has more than `max_tokens`
        tokens (with `longest_row`: the shapes of rows of at most that many steps), each with the token
        counts of sentences that are packed into one batch of that shape when they are all the packer
        holds (what a warm-up embeds to compile it). A batch's S is its width group's: each shape occurs
        with every S of the pieces.

        The shapes: for each row length T2 = MIN_ROW, 2 MIN_ROW, ... up to that of `max_tokens` + 2
        steps, a full batch (`rows`) and a last, partly filled one of k rows (`tail_rows`); and a last
        batch of one row shortened to 8 or 16 steps (`tail_length`). Only a single row is shortened:
        best fit fills a row that another follows in its width group beyond half its length (what is
        left over did not fit in it), a row of T2 > MIN_ROW holds a first sentence of more than T2/2
        steps, and leftover rows folded into the next length come f at a time.
        """
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, found {max_tokens!r}")
        top = row_length(max_tokens + BOUNDARY_STEPS)
        if longest_row is not None:
            if longest_row < MIN_ROW:
                raise ValueError(f"longest_row={longest_row}: rows have at least {MIN_ROW} steps")
            top = min(top, longest_row)
        most = min(max_tokens + BOUNDARY_STEPS, top)  # the steps of the longest sentence
        shapes: dict[tuple[int, int], list[int]] = {}
        T2 = MIN_ROW
        while T2 <= top:
            row = _filling(T2, most)
            for k in range(1, self.rows(T2) + 1):  # the fewest rows that give each shape
                shapes.setdefault((self.tail_rows(k, T2), T2), row * k)
            T2 *= 2
        length = MIN_TAIL_ROW
        while length < MIN_ROW:
            shapes.setdefault((self.tail_rows(1, MIN_ROW), length), _filling(length, most))
            length *= 2
        return shapes

    def add(self, piece: Piece) -> Iterator[PackedBatch]:
        """Files `piece` (at least one token); yields full batches once a chunk's worth is waiting."""
        self._waiting.append(piece)
        self._steps += piece.n_tokens + BOUNDARY_STEPS
        if self._steps >= self.chunk_steps:
            yield from self._pack(final=False)

    def flush_oldest(self) -> Iterator[PackedBatch]:
        """Everything waiting, the last batches partly filled (a caller that must hand out its oldest
        sentence now)."""
        yield from self.flush()

    def flush(self) -> Iterator[PackedBatch]:
        """Everything waiting, the last batches partly filled; the packer is empty after."""
        yield from self._pack(final=True)

    def _pack(self, final: bool) -> Iterator[PackedBatch]:
        pieces, self._waiting, self._steps = self._waiting, [], 0
        for S, group in self._width_groups(pieces):
            rows = [[group[i] for i in row] for row in fill_rows([p.n_tokens + BOUNDARY_STEPS for p in group])]
            by_length: dict[int, list[list[Piece]]] = {}
            for row in rows:
                by_length.setdefault(row_length(row[0].n_tokens + BOUNDARY_STEPS), []).append(row)
            lengths = sorted(by_length)
            for i, T2 in enumerate(lengths):
                same, per_batch = by_length[T2], self.rows(T2)
                full = len(same) - len(same) % per_batch
                for start in range(0, full, per_batch):
                    yield self._batch(same[start : start + per_batch], per_batch, T2, S)
                leftover = same[full:]
                if not leftover:
                    continue
                if not final:
                    for row in leftover:
                        for piece in row:
                            self._waiting.append(piece)
                            self._steps += piece.n_tokens + BOUNDARY_STEPS
                elif i + 1 < len(lengths):  # fold into rows of the next length: f rows of T2 make one
                    f = lengths[i + 1] // T2
                    by_length[lengths[i + 1]] += [sum(leftover[j : j + f], []) for j in range(0, len(leftover), f)]
                else:
                    content = max(sum(p.n_tokens + BOUNDARY_STEPS for p in row) for row in leftover)
                    yield self._batch(leftover, self.tail_rows(len(leftover), T2), tail_length(content, T2), S)

    def _width_groups(self, pieces: list[Piece]) -> list[tuple[int, list[Piece]]]:
        """(S, pieces) per width bucket, narrowest first; a group of fewer than `GROUP_MIN_BATCHES`
        batches' worth of steps joins the next wider one."""
        groups: dict[int, list[Piece]] = {}
        for piece in pieces:
            groups.setdefault(piece.S, []).append(piece)
        merged, carried = [], []
        widths = sorted(groups)
        for i, S in enumerate(widths):
            group = carried + groups[S]
            steps = sum(p.n_tokens + BOUNDARY_STEPS for p in group)
            if i + 1 < len(widths) and steps < GROUP_MIN_BATCHES * self.batch_tokens:
                carried = group
            else:
                merged.append((S, group))
                carried = []
        return merged

    def _batch(self, rows: list[list[Piece]], n_rows: int, T2: int, S: int) -> PackedBatch:
        chars = np.zeros((n_rows, T2, self.width), np.int32)
        starts = np.zeros((n_rows, T2), bool)
        segments = np.full((n_rows, T2), -1, np.int32)
        pieces, places = [], []
        for r, row in enumerate(rows):
            position = 0
            for k, piece in enumerate(row):
                n = piece.n_tokens
                chars[r, position] = self._bos
                chars[r, position + 1 : position + 1 + n] = piece.chars
                chars[r, position + 1 + n] = self._eos
                starts[r, position] = True
                segments[r, position + 1 : position + 1 + n] = k
                pieces.append(piece)
                places.append((r, position + 1, k))
                position += n + BOUNDARY_STEPS
        return PackedBatch(chars, starts, segments, pieces, places, S)
