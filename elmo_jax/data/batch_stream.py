"""The bidirectional LM batch stream bilm-tf trains on: deterministic, resumable and shardable over hosts.

Each of the B rows of a batch is its own continuous stream of sentences cut into windows of T =
`unroll_steps` tokens (bilm-tf's `_get_batch`): a sentence `<S> w1 .. wn </S>` contributes inputs
`<S> w1 .. wn` with targets `w1 .. wn </S>`, a window may end mid-sentence and the next window of the
same row continues it, so the row's LSTM state carries over. The backward direction is an independent
stream (its own shuffle) of reversed sentences, which bilm-tf encodes as `</S> wn .. w1 <S>`: the
backward model reads `</S> wn .. w1` and predicts `wn .. w1 <S>`, i.e. each target is the previous word.

Which sentence a row reads is a pure function of the seed: the corpus is shuffled per epoch by grain's
index shuffle (`grain.experimental.index_shuffle`: random access, no materialised permutation), and row
r of the global batch reads stream positions r, r + B, r + 2B, ... So a row's whole state is two numbers
(the stream position of its current sentence and how far into it it is), rows never depend on each
other, and a process that owns rows [p*B/N, (p+1)*B/N) reads only their sentences: N processes
together produce exactly the global stream of one process, for any N dividing B.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np

from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.model.chars import BOS_TOKEN, EOS_TOKEN, token_to_raw_ids
from elmo_jax.model.vocabulary import TokenVocabulary

DIRECTIONS = ("forward", "backward")
# Words whose character ids are cached; the cache stops growing past this (a 1B-Word vocabulary is
# 793k types; 1M cached words cost ~100 MB as int16).
CHAR_CACHE_LIMIT = 1_000_000
STATE_VERSION = 1


def sentence_text(record: Any) -> str:
    """The sentence text of a source record: a str, UTF-8 bytes, or a dict with a "text" feature (TFDS)."""
    if isinstance(record, dict):
        record = record["text"]
    if isinstance(record, np.ndarray):
        record = record.item()
    if isinstance(record, bytes):
        return record.decode("utf-8", errors="replace")
    if isinstance(record, str):
        return record
    raise ValueError(f"sentence source records must be str, bytes or {{'text': ...}}, found {type(record).__name__}")


@dataclasses.dataclass
class _Row:
    """One row's position: stream index of the sentence being read (-1: none yet) and tokens consumed."""

    position: int = -1
    offset: int = 0


class _Direction:
    """The rows of one direction (forward or backward) owned by this process, and their read-ahead.

    Stream position k is sentence `order(k % N)` of epoch k // N, where `order` is grain's index
    shuffle (a keyed permutation computed per index, nothing materialised) with a seed derived from
    (seed, direction, epoch), or the identity without a seed. Sentences are fetched per row in blocks
    of READ_AHEAD upcoming positions with one `__getitems__` call: ArrayRecord reads one record far
    slower than a batch of them (measured: bench/RESULTS.md, "Design figures").
    """

    # Sentences read ahead per row. One refill reads the upcoming positions of every local row that
    # runs low in a single `__getitems__` call: ArrayRecord's cost per call grows with the records of
    # each shard it touches (and TFDS starts a thread pool per call), so calls must be few and large.
    READ_AHEAD = 256

    def __init__(
        self, source: Sequence[Any], seed: int | None, direction: int, repeat: bool, rows: range, batch_size: int
    ):
        self.source, self.seed, self.direction = source, seed, direction
        self.n_sentences = len(source)
        self.repeat = repeat
        self.batch_size = batch_size
        self.rows = {r: _Row() for r in rows}
        self.current: dict[int, tuple[np.ndarray, np.ndarray] | None] = {r: None for r in rows}
        self._ahead: dict[int, collections.deque] = {r: collections.deque() for r in rows}
        self._epoch_seeds: dict[int, int] = {}
        # A row reads at most about an epoch ahead: on a small corpus 256 positions span dozens of
        # epochs, and grain's index_shuffle costs more per index the smaller the epoch (measured:
        # bench/RESULTS.md, "Design figures").
        self.read_ahead = max(2, min(self.READ_AHEAD, -(-self.n_sentences // batch_size)))

    def exhausted(self, position: int) -> bool:
        return not self.repeat and position >= self.n_sentences

    def source_index(self, position: int) -> int:
        epoch, index = divmod(position, self.n_sentences)
        if self.seed is None:
            return index
        seed = self._epoch_seeds.get(epoch)
        if seed is None:
            seed = int(np.random.SeedSequence([self.seed, self.direction, epoch]).generate_state(1)[0] >> 1)
            self._epoch_seeds = {epoch: seed}  # rows are at most an epoch apart; keep it small anyway
        return grain.experimental.index_shuffle(index, max_index=self.n_sentences - 1, seed=seed, rounds=4)

    def text(self, row: int, position: int) -> str:
        """The sentence at `position`: the row's next position (read ahead) or, after a restore, any."""
        ahead = self._ahead[row]
        if ahead and ahead[0][0] != position:
            ahead.clear()
        if not ahead:
            self._refill(row, position)
        return sentence_text(ahead.popleft()[1])

    def _refill(self, row: int, position: int) -> None:
        """Tops up `row` (from `position`) and every other row below half its read-ahead, in one read."""
        wanted: list[tuple[int, int]] = []  # (row, stream position)
        for r, ahead in self._ahead.items():
            if r != row and len(ahead) >= self.read_ahead // 2:
                continue
            start = position if r == row else (ahead[-1][0] + self.batch_size if ahead else None)
            if start is None:  # a row that has not started reads from its own first position later
                continue
            count = self.read_ahead - len(ahead)
            wanted.extend(
                (r, p) for p in range(start, start + count * self.batch_size, self.batch_size) if not self.exhausted(p)
            )
        indices = [self.source_index(p) for _, p in wanted]
        getitems = getattr(self.source, "__getitems__", None)
        records = getitems(indices) if getitems else [self.source[i] for i in indices]
        for (r, p), record in zip(wanted, records):
            self._ahead[r].append((p, record))


def _raw_char_ids(vocabulary: TokenVocabulary | None, max_chars: int) -> Callable[[str], np.ndarray]:
    """token -> its raw character ids (C,): the vocabulary's (its shifted ids less one), else UTF-8 bytes."""
    if vocabulary is None or vocabulary.is_bytes:
        return lambda token: token_to_raw_ids(token, max_chars)
    if vocabulary.width != max_chars:
        raise ValueError(
            f"training reads character ids only: the vocabulary gives {vocabulary.width} ids per token, "
            f"max_characters_per_token is {max_chars} (a word embedding is not trained here)"
        )
    return lambda token: vocabulary.token_ids(token) - 1


class BiLMBatchStream:
    """Windows of the forward and backward LM streams for this process's share of the global batch.

    Each `next(stream)` returns {"forward": w, "backward": w}, each w a dict of NumPy arrays for the
    b = batch_size / process_count local rows:
      char_ids  int32 (b, T, C): raw character ids (0..260, or the vocabulary's) of the input tokens, OOV
                words included;
      token_ids int32 (b, T): vocabulary ids of the inputs (OOV -> <UNK>);
      targets   int32 (b, T): the next token's id in the direction of reading (OOV -> <UNK>);
      mask      bool  (b, T): real positions; false only past the end of a finite (repeat=False) pass;
      carry     bool  (b,):  the row continues from its previous window, so its LSTM state carries over;
      reset     bool  (b, T): the row's state is zeroed right before this position, where a sentence
                chosen with probability `reset_probability` starts (see below).
    A finite pass raises StopIteration once every local row is exhausted.

    Args:
      sentences: random-access sequence (len, getitem) of sentence records (see `sentence_text`),
        e.g. `tfds.data_source(...)` or `corpus.open_sentences(...)`.
      vocab: targets and token ids.
      batch_size: global rows B.
      unroll_steps: T.
      seed: shuffle seed; None reads the corpus in order (evaluation).
      repeat: cycle over epochs forever (training) or make one pass (evaluation).
      process_index, process_count: this process's share of the rows.
      max_characters_per_token: C.
      vocabulary: a model's own character vocabulary (`model.vocabulary.TokenVocabulary`, characters only:
        ids_per_token == C), whose raw ids `char_ids` then holds; None: UTF-8 bytes (bilm-tf).
      reset_probability: chance that a sentence is read from a zero LSTM state instead of the state the
        row carries. bilm-tf never resets (0.0), and then a model never sees `<S>` from a zero state
        after the first window, which is exactly how `embed` and AllenNLP run it; small models trained
        that way can become useless from a zero state (one direction stuck in a state only the carried
        history reaches). The choice is a hash of (seed, direction, stream position): deterministic
        and independent of the process layout.
    """

    def __init__(
        self,
        sentences: Sequence[Any],
        vocab: Vocab,
        *,
        batch_size: int,
        unroll_steps: int,
        seed: int | None = 0,
        repeat: bool = True,
        process_index: int = 0,
        process_count: int = 1,
        max_characters_per_token: int = 50,
        reset_probability: float = 0.0,
        vocabulary: TokenVocabulary | None = None,
    ):
        if len(sentences) == 0:
            raise ValueError("the sentence source is empty")
        for name, value in (
            ("batch_size", batch_size),
            ("unroll_steps", unroll_steps),
            ("process_count", process_count),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, found {value!r}")
        if batch_size % process_count:
            raise ValueError(
                f"batch_size {batch_size} is not divisible by the process count {process_count}: "
                "every process must feed the same number of rows"
            )
        if not 0.0 <= reset_probability <= 1.0:
            raise ValueError(f"reset_probability must be in [0, 1], found {reset_probability}")
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index {process_index} is outside [0, {process_count})")
        self.vocab = vocab
        self.batch_size, self.unroll_steps = batch_size, unroll_steps
        self.seed, self.repeat = seed, repeat
        self.max_chars = max_characters_per_token
        self.reset_threshold = int(reset_probability * 2**64)  # compared with a 64-bit hash
        local = batch_size // process_count
        self.rows = range(process_index * local, (process_index + 1) * local)
        # Independent shuffles (the direction is part of each epoch's seed): the backward stream must
        # not mirror the forward one.
        self._directions = {
            d: _Direction(sentences, seed, i, repeat, self.rows, batch_size) for i, d in enumerate(DIRECTIONS)
        }
        self._raw_chars = _raw_char_ids(vocabulary, max_characters_per_token)
        # word -> (vocabulary id, row of its raw char ids in _char_table): one dict lookup per token.
        self._words: dict[str, tuple[int, int]] = {}
        wide = vocabulary is not None and vocabulary.config.n_raw_characters > np.iinfo(np.int16).max
        self._char_table = np.zeros((1024, max_characters_per_token), np.int32 if wide else np.int16)
        self.windows = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, dict[str, np.ndarray]]:
        out = {d: self._window(self._directions[d], reverse=(d == "backward")) for d in DIRECTIONS}
        if not any(w["mask"].any() for w in out.values()):
            raise StopIteration
        self.windows += 1
        return out

    @property
    def epoch(self) -> int:
        """Completed passes over the corpus of the slowest local row (forward direction)."""
        d = self._directions["forward"]
        return min(max(row.position, 0) // d.n_sentences for row in d.rows.values())

    def _encode(self, row: int, position: int, direction: _Direction, reverse: bool) -> tuple[np.ndarray, np.ndarray]:
        """(ids (n+2,), raw chars (n+2, C)) of the sentence at a stream position, bilm-tf's encoding."""
        words = direction.text(row, position).split()
        if reverse:
            words = [EOS_TOKEN] + words[::-1] + [BOS_TOKEN]
        else:
            words = [BOS_TOKEN] + words + [EOS_TOKEN]
        entries = [self._word_entry(w) for w in words]
        ids = np.fromiter((e[0] for e in entries), np.int32, len(entries))
        rows = np.fromiter((e[1] for e in entries), np.int64, len(entries))
        if rows.min() < 0:  # a word past the cache limit: its characters are computed on the spot
            return ids, np.stack(
                [self._char_table[r] if r >= 0 else self._raw_chars(w) for w, r in zip(words, rows)]
            ).astype(self._char_table.dtype)
        return ids, self._char_table[rows]

    def _word_entry(self, word: str) -> tuple[int, int]:
        """(vocabulary id, row of its characters in the char table, or -1 past the cache limit)."""
        entry = self._words.get(word)
        if entry is None:
            n = len(self._words)
            if n >= CHAR_CACHE_LIMIT:
                return self.vocab.word_to_id(word), -1
            if n == len(self._char_table):
                self._char_table = np.concatenate([self._char_table, np.zeros_like(self._char_table)])
            self._char_table[n] = self._raw_chars(word)
            entry = self._words[word] = (self.vocab.word_to_id(word), n)
        return entry

    def empty_window(self) -> dict[str, dict[str, np.ndarray]]:
        """A window of both directions with no token (all masked), shaped like `next(stream)`'s.

        After a finite pass, a process whose rows are exhausted feeds these while other processes
        still have windows: every process must take part in every step.
        """
        return {d: self._zeros() for d in DIRECTIONS}

    def _zeros(self) -> dict[str, np.ndarray]:
        b, T, C = len(self.rows), self.unroll_steps, self.max_chars
        return {
            "char_ids": np.zeros((b, T, C), np.int32),
            "token_ids": np.zeros((b, T), np.int32),
            "targets": np.zeros((b, T), np.int32),
            "mask": np.zeros((b, T), bool),
            "carry": np.zeros((b,), bool),
            "reset": np.zeros((b, T), bool),
        }

    def _window(self, direction: _Direction, reverse: bool) -> dict[str, np.ndarray]:
        T = self.unroll_steps
        out = self._zeros()
        for i, r in enumerate(self.rows):
            row = direction.rows[r]
            out["carry"][i] = row.position >= 0
            filled = 0
            while filled < T:
                sentence = direction.current[r]
                if sentence is None or len(sentence[0]) - row.offset <= 1:  # need the next sentence
                    position = r if row.position < 0 else row.position + self.batch_size
                    if direction.exhausted(position):
                        break
                    row.position, row.offset = position, 0
                    sentence = direction.current[r] = self._encode(r, position, direction, reverse)
                    if (
                        self.reset_threshold
                        and _hash64(self.seed or 0, direction.direction, position) < self.reset_threshold
                    ):
                        out["reset"][i, filled] = True
                ids, chars = sentence
                n = min(len(ids) - row.offset - 1, T - filled)
                span = slice(row.offset, row.offset + n)
                out["token_ids"][i, filled : filled + n] = ids[span]
                out["char_ids"][i, filled : filled + n] = chars[span]
                out["targets"][i, filled : filled + n] = ids[row.offset + 1 : row.offset + n + 1]
                out["mask"][i, filled : filled + n] = True
                filled += n
                row.offset += n
        return out

    # -- resumable state -------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The position of every local row, as plain ints (JSON- and orbax-friendly).

        Rows are keyed by their global index, so states from several processes can be merged
        (`merge_states`) and restored into any process layout.
        """
        return {
            "version": STATE_VERSION,
            "seed": -1 if self.seed is None else self.seed,
            "repeat": self.repeat,
            "batch_size": self.batch_size,
            "unroll_steps": self.unroll_steps,
            "n_sentences": self._directions["forward"].n_sentences,
            "windows": self.windows,
            "reset_threshold": self.reset_threshold,
            **{
                d: {str(r): [row.position, row.offset] for r, row in self._directions[d].rows.items()}
                for d in DIRECTIONS
            },
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues exactly where `get_state` was taken (the same windows, bit for bit)."""
        expected = {
            "version": STATE_VERSION,
            "seed": -1 if self.seed is None else self.seed,
            "repeat": self.repeat,
            "batch_size": self.batch_size,
            "unroll_steps": self.unroll_steps,
            "n_sentences": self._directions["forward"].n_sentences,
            "reset_threshold": self.reset_threshold,
        }  # the reset flags are part of the stream
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(
                    f"data stream state: {key} is {state.get(key)!r} in the saved state but "
                    f"{value!r} here; the checkpoint was made with a different corpus or config"
                )
        for d in DIRECTIONS:
            direction = self._directions[d]
            for r in self.rows:
                try:
                    position, offset = state[d][str(r)]
                except (KeyError, TypeError, ValueError):
                    raise ValueError(f"data stream state: no position for {d} row {r}") from None
                direction.rows[r] = _Row(int(position), int(offset))
                direction.current[r] = (
                    None if position < 0 else self._encode(r, int(position), direction, reverse=(d == "backward"))
                )
        self.windows = int(state["windows"])


def _hash64(*values: int) -> int:
    """splitmix64 over a few integers: a cheap, well-mixed, stable 64-bit hash."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state holding every row, from the states of all processes (same stream settings)."""
    if not states:
        raise ValueError("merge_states needs at least one state")
    merged = {k: v for k, v in states[0].items() if k not in DIRECTIONS}
    for d in DIRECTIONS:
        merged[d] = {}
        for s in states:
            merged[d].update(s[d])
    return merged
