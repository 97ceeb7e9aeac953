"""Tokenized sentences in memory to vectors: AllenNLP's `ElmoEmbedder.embed_sentences`, batched for XLA.

    vectors = elmo_jax.embed_sentences(params, [["The", "bank", "."], ["Hello", "!"]], layers="top")
    # [float32 (3, 2P), float32 (2, 2P)], in input order

    embedder = elmo_jax.SentenceEmbedder(params, layers="sentence_mean")
    for vector in embedder.stream(sentences_from_a_generator):   # input order, bounded memory
        ...
    embedder.stats   # sentences, tokens, truncated_tokens, batches, padded_tokens, compiled_shapes,
                     # forced_flushes

A loop of `embed` calls compiles a program for every new (length, character-width) shape it meets (about
a second each for the original model), and pads each batch to its longest sentence. Here sentences are
laid one after another in rows of a few fixed lengths (`packing`: 32, 64, 128... time steps, each
sentence read from a zero LSTM state, so its vectors do not depend on its neighbours), so the padding is
a few percent and the programs are a handful whatever the number of sentences; every batch is split
over all local devices (`batch_runner`). Programs live at module level: a second call, or a new
`SentenceEmbedder` of the same model, compiles nothing for shapes already run; a later process reads
them from the persistent compilation cache (`storage.compile_cache`, turned on by every `SentenceEmbedder`:
~/.cache/elmo_jax/compilation_cache, moved or turned off with $ELMO_JAX_COMPILATION_CACHE). With the token cache, or
batches too small for a row of 32 steps per device, sentences go one per row into the length x width
buckets of `embed_file` (`length_buckets`) instead. `stats["padded_tokens"]` counts the token
positions run (rows x length, the sentences' `<S>`/`</S>` excluded): divided by `stats["tokens"]`, the
padding.

A token over the model's C-2 UTF-8 bytes (48) is cut to them, as bilm-tf trained and AllenNLP reads
(docs/ELMO.md, "Long tokens"): `stats["truncated_tokens"]` counts them, and `embed`, `embed_sentences`,
`stream_sentences` (at the end of the stream) log one warning per call that says how many.

`layers` modes (`output_modes`): "all" (L+1, n, 2P); "top", "average", "mix", a layer index j in
0..L (layer j itself) (n, 2P); "sentence_mean" (2P,): the mean over the sentence's tokens of the mix
gamma * sum_j softmax(s)_j h_j (with no `mix_scalars`, s = 0 and gamma = 1: the average of the layers),
padding excluded; an empty sentence gets zeros. `stream` returns vectors in input order while holding
at most `window` sentences (waiting for a batch or done but not yet returned): when the oldest sentence
would fall out of the window, everything waiting is run, the last batches partly filled.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from absl import logging

from elmo_jax.features.batch_runner import BatchRunner
from elmo_jax.features.length_buckets import BucketBatcher, Piece
from elmo_jax.features.output_modes import output_mode
from elmo_jax.features.packing import TAIL_STEPS, PackedBatch, RowPacker, can_pack
from elmo_jax.features.token_ids import CharIdTable, width_bucket
from elmo_jax.model.chars import check_sentence
from elmo_jax.model.params import BiLMParams
from elmo_jax.model.vocabulary import boundary_ids
from elmo_jax.storage import compile_cache

DEFAULT_WINDOW = 1024  # sentences `stream` holds at most
IN_FLIGHT = 2  # batches dispatched and not yet fetched: the devices always have the next one queued


class SentenceEmbedder:
    """Embeds tokenized sentences with one biLM on the local devices; keeps its programs and counts.

    Args:
      params: the biLM (`load`, `load_hdf5`, `init_params`).
      layers: "all", "top", "average", "mix", "sentence_mean" or a layer index 0..L (an int; see the
        module doc).
      mix_scalars: the L+1 scalars s of "mix" / "sentence_mean" (default all 0: the plain average).
      gamma: the mix's scale.
      float16: return float16 vectors.
      batch_tokens: time steps per batch (rows x row length): bounds the device memory.
      devices: local devices to split the rows over (`jax.Device`s or indices into
        `jax.local_devices()`); None: all of them.
      compute_dtype: "float32" or "bfloat16" matrix products.
      token_cache: a `TokenCache` of this biLM: cached tokens skip the char CNN (same vectors to 1e-6).
      tail_steps: a last, partly filled batch has a multiple of 1/tail_steps of a full batch's rows
        (`packing.RowPacker`): a service whose batches are often small pads less with 16 and compiles
        more shapes.
    """

    def __init__(
        self,
        params: BiLMParams,
        *,
        layers: str | int = "all",
        mix_scalars: Sequence[float] | None = None,
        gamma: float = 1.0,
        float16: bool = False,
        batch_tokens: int = 4096,
        devices=None,
        compute_dtype: str = "float32",
        token_cache=None,
        tail_steps: int = TAIL_STEPS,
    ):
        if not isinstance(params, BiLMParams):
            raise ValueError(
                f"params must be BiLMParams (from load, load_hdf5 or init_params), found {type(params).__name__}"
            )
        for name, value in (("batch_tokens", batch_tokens), ("tail_steps", tail_steps)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, found {value!r}")
        compile_cache.use()  # programs an earlier process compiled are read back (a user's own JAX cache kept)
        config = params.config
        output = output_mode(layers, config.n_output_layers, config.output_dim, mix_scalars, gamma, float16)
        self.runner = BatchRunner(params, output, devices=devices, compute_dtype=compute_dtype, cache=token_cache)
        self.batch_tokens, self.tail_steps = batch_tokens, tail_steps
        self.C = params.config.max_characters_per_token
        self.vocabulary = self.runner.vocabulary  # the model's text -> ids
        self._ids = CharIdTable(self.vocabulary)
        self.stats = {
            "sentences": 0,
            "tokens": 0,
            "truncated_tokens": 0,
            "batches": 0,
            "padded_tokens": 0,
            "compiled_shapes": 0,
            "forced_flushes": 0,
        }

    def embed(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One array per sentence, in input order (see the module doc for the shapes)."""
        if isinstance(sentences, str) or not isinstance(sentences, Sequence):
            raise ValueError(
                f"sentences must be a list of tokenized sentences (lists of str), found {type(sentences).__name__}"
            )
        vectors = list(self.stream(sentences, window=max(len(sentences), 1), warn=True))
        logging.info(
            "embedded %d sentences (%d tokens): %d batches, %d compiled shapes",
            len(vectors),
            self.stats["tokens"],
            self.stats["batches"],
            self.stats["compiled_shapes"],
        )
        return vectors

    def stream(
        self, sentences: Iterable[Sequence[str]], *, window: int = DEFAULT_WINDOW, warn: bool = False
    ) -> Iterator[np.ndarray]:
        """Like `embed` for any iterable (a generator over a corpus): yields in input order, holding at
        most `window` sentences in memory. `warn`: log the tokens cut to C-2 bytes once the stream ends
        (`stream_sentences` does; the service's batcher streams each batch without it and tells each
        request its own count); `stats["truncated_tokens"]` counts them either way."""
        if isinstance(sentences, str) or not isinstance(sentences, Iterable):
            raise ValueError(
                f"sentences must be an iterable of tokenized sentences (lists of str), found {type(sentences).__name__}"
            )
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive integer, found {window!r}")
        return self._warned(self._stream(sentences, window)) if warn else self._stream(sentences, window)

    def _warned(self, vectors: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """`vectors`, then one warning for the tokens cut while they were made (`chars.warn_truncated`)."""
        truncated, tokens = self.stats["truncated_tokens"], self.stats["tokens"]
        yield from vectors
        truncated, tokens = self.stats["truncated_tokens"] - truncated, self.stats["tokens"] - tokens
        self.vocabulary.warn_truncated(truncated, tokens)

    def _batcher(self):
        """Packed rows (`packing`) where the batches hold them; else (small `batch_tokens`, the token
        cache) one sentence per row in length x width buckets."""
        multiple = self.runner.row_multiple
        if self.runner.cache is None and can_pack(self.batch_tokens, multiple):
            return RowPacker(
                self.batch_tokens,
                self.C,
                row_multiple=multiple,
                boundaries=self.boundaries,
                tail_steps=self.tail_steps,
            )
        return BucketBatcher(self.batch_tokens, self.vocabulary.width, row_multiple=multiple)

    @property
    def boundaries(self) -> tuple:
        """The model's `<S>` and `</S>` ids (`vocabulary.boundary_ids`), for a `RowPacker`."""
        return boundary_ids(self.runner.config, "bos"), boundary_ids(self.runner.config, "eos")

    def _stream(self, sentences: Iterable[Sequence[str]], window: int) -> Iterator[np.ndarray]:
        batcher = self._batcher()
        flight = _Flight(self.runner, self.stats)
        next_out = 0
        for i, sentence in enumerate(sentences):
            tokens = check_sentence(sentence, i)
            self.stats["sentences"] += 1
            self.stats["tokens"] += len(tokens)
            if not tokens:
                flight.done[i] = self.runner.output.empty()
            else:
                ids, width = self._ids.ids(tokens)
                self.stats["truncated_tokens"] = self._ids.truncated
                piece = Piece(i, 0, ids, width_bucket(width, self.C), tokens if self.runner.cache else None)
                flight.run(batcher.add(piece))
            while len(flight.pending) > IN_FLIGHT:
                flight.collect()
            while i + 1 - next_out > window:  # the oldest sentence must come out
                if flight.pending:
                    flight.collect()
                elif next_out not in flight.done:
                    self.stats["forced_flushes"] += 1
                    flight.run(batcher.flush_oldest())
                while next_out in flight.done:
                    yield flight.done.pop(next_out)
                    next_out += 1
            while next_out in flight.done:
                yield flight.done.pop(next_out)
                next_out += 1
        flight.run(batcher.flush())
        while flight.pending:
            flight.collect()
            while next_out in flight.done:
                yield flight.done.pop(next_out)
                next_out += 1
        while next_out in flight.done:
            yield flight.done.pop(next_out)
            next_out += 1


class _Flight:
    """Batches dispatched to the devices, and the finished sentences not yet handed out."""

    def __init__(self, runner: BatchRunner, stats: dict):
        self.runner, self.stats = runner, stats
        self.pending: collections.deque = collections.deque()
        self.done: dict[int, np.ndarray] = {}

    def run(self, batches) -> None:
        """Dispatches `batches` as they come (a packed chunk is many), collecting the oldest results so
        that at most IN_FLIGHT + 1 are on the devices."""
        for batch in batches:
            self.pending.append((batch, self.runner.dispatch(batch)))
            self.stats["batches"] += 1
            self.stats["padded_tokens"] = self.runner.padded_tokens
            self.stats["compiled_shapes"] = len(self.runner.shapes)
            while len(self.pending) > IN_FLIGHT + 1:
                self.collect()

    def collect(self) -> None:
        batch, result = self.pending.popleft()
        result = np.asarray(result)  # waits for the devices
        mode = self.runner.output
        if isinstance(batch, PackedBatch):
            for place, piece in zip(batch.places, batch.pieces):  # each sentence is one piece here
                vectors = mode.packed_piece(result, place, piece.n_tokens)
                self.done[piece.line] = mode.sentence([vectors], piece.n_tokens)
            return
        for row, piece in enumerate(batch.pieces):
            self.done[piece.line] = mode.sentence([mode.piece(result, row, piece.n_tokens)], piece.n_tokens)


def embed_sentences(params: BiLMParams, sentences: Sequence[Sequence[str]], **options) -> list[np.ndarray]:
    """Vectors of tokenized sentences, one array per sentence in input order, batched by length x width
    bucket over every local device (see the module doc).

    Args:
      params: the biLM.
      sentences: lists of str tokens (an empty list is an empty sentence).
      **options: `SentenceEmbedder`'s (layers, mix_scalars, gamma, float16, batch_tokens, devices,
        compute_dtype, token_cache).

    Returns:
      A list of float32 (or float16) arrays: (L+1, n, 2P) for layers="all", (n, 2P) for "top",
      "average", "mix" and a layer index, (2P,) for "sentence_mean".
    """
    return SentenceEmbedder(params, **options).embed(sentences)


def stream_sentences(
    params: BiLMParams, sentences: Iterable[Sequence[str]], *, window: int = DEFAULT_WINDOW, **options
) -> Iterator[np.ndarray]:
    """`embed_sentences` for an iterable too large for memory: yields in input order, holding at most
    `window` sentences (see the module doc)."""
    return SentenceEmbedder(params, **options).stream(sentences, window=window, warn=True)
