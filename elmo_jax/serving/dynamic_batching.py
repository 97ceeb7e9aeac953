"""Dynamic batching: sentences of requests that arrive at random, from many connections, merged into the
batches of one `SentenceEmbedder` and the answers split back (what `python -m elmo_jax.serve` runs).

    batcher = DynamicBatcher([SentenceEmbedder(params, layers="all") for _ in range(2)], max_wait_s=0.005)
    batcher.start()                                   # warm-up compiles, then serving
    future = batcher.submit([["The", "bank", "."]])   # from any thread; QueueFull when over the bound
    vectors = future.result()                         # [float32 (L+1, 3, 2P)], as `embed_sentences` gives
    batcher.close()                                   # what was accepted is answered first

A worker thread takes the oldest waiting request, then whatever else is waiting, until the batch holds
`max_batch_tokens` tokens or `max_wait_s` has passed since that oldest request arrived (so a lone request
waits at most that long, and under load, while the devices run one batch, the next one fills up), and
embeds it with the embedder's packed rows on every local device. With two workers (each its own
embedder, the programs shared), one forms and dispatches a batch while the other waits for its results.
Every sentence starts from a zero LSTM state, so its vectors do not depend on the requests it was
batched with.

What waits is bounded in tokens (`max_queue_tokens`): `submit` refuses more at once (the service answers
503), so memory stays bounded under any overload. Counts for the service's metrics are kept in `stats`.

Every accepted request gets an answer or an error, never silence: a batch that fails anywhere in a worker
(the embedding, splitting the answers, the metrics' callback) gives its requests the error, is logged
once with its traceback, and the worker goes on; a fault of the worker's own loop, or a failed warm-up,
stops the batcher serving (`ready` cleared, `status` says why, what waits and what comes refused with
`NotServing`). `stop` (the service calls it on SIGTERM) ends a warm-up at its next batch; after the
warm-up, what was accepted is still embedded.

The warm-up (`warmup`: one batch per program shape) runs before `ready` is set: minutes of XLA compiles
on a CPU, seconds when the persistent compilation cache holds them. It logs its progress (a line at the
start, then one per 10% of its programs and 15 s at most often, with the time left estimated from its
batches so far: `warmup_progress`), and a request submitted meanwhile is refused at once (`WarmingUp`:
the service answers 503 with `Retry-After`, the time left) rather than left waiting for it. Why not
serve the requests whose shape is compiled already: a request's batch shape depends on the requests it
is merged with, known only once the batch is formed, and a batch that met a shape still to compile
would wait for it (a warm-up's minutes) with no word to its client.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import threading
import time
import weakref
from collections.abc import Sequence

import jax
from absl import logging

from elmo_jax.features.packing import RowPacker
from elmo_jax.features.sentences import SentenceEmbedder
from elmo_jax.runtime.progress import Progress, duration

# The open batchers that count XLA compiles. jax.monitoring holds its listeners for the life of the
# process (and jax 0.6, the dependency floor, has no public way to remove one), so one listener, registered
# once, counts for the batchers in this weak set: a closed batcher stops counting, and the listener does
# not keep it (its embedders, their compiled programs) alive.
_COUNTING: weakref.WeakSet = weakref.WeakSet()
_COUNTING_LOCK = threading.Lock()
_listening = False
# The longest batching window: what `Condition.wait` takes (beyond, it raises OverflowError).
WAIT_MAX = threading.TIMEOUT_MAX
# The warm-up's progress lines: one once both another tenth of its programs and 15 s have passed (a
# warm-up read from the compilation cache takes seconds: one line at its start and one at its end).
WARMUP_LINE_SHARE, WARMUP_LINE_EVERY_S = 0.1, 15.0
# The warm-up's sets of shapes (`warmup_set`): every shape, or those of batches of up to COMMON_ROWS
# rows of up to COMMON_ROW steps (sentences of up to 62 tokens).
WARMUP_SHAPES = ("all", "common")
COMMON_ROWS, COMMON_ROW = 8, 64
# The fraction of the warm-up list between one batch and the next (`warmup_sentences`' order).
GOLDEN_STEP = (5**0.5 - 1) / 2
# A request refused during the warm-up before its first batch is done (no rate to estimate from yet)
# is told to retry after this many seconds.
WARMUP_RETRY_UNKNOWN_S = 10


def _on_duration(name: str, seconds: float, **kwargs) -> None:
    if name.endswith("backend_compile_duration"):  # a program compiled, or read from the persistent cache
        for batcher in _counting():
            batcher._count_compile()


def _on_event(name: str, **kwargs) -> None:
    if name == "/jax/compilation_cache/cache_hits":
        for batcher in _counting():
            batcher._count_compile(cache_hit=True)


def _counting() -> list[DynamicBatcher]:
    with _COUNTING_LOCK:
        return list(_COUNTING)


def _watch_compiles(batcher: DynamicBatcher) -> None:
    global _listening
    with _COUNTING_LOCK:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _listening = True
        _COUNTING.add(batcher)


class QueueFull(Exception):
    """The batcher takes no request now: it holds `max_queue_tokens` already (or it stops, `NotServing`).
    The service answers 503 with Retry-After."""


class WarmingUp(QueueFull):
    """The batcher runs its warm-up: a request is refused at once rather than left waiting for it (the
    service answers 503, `Retry-After: retry_after_s`, the warm-up's estimated seconds left, at least 1)."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotServing(QueueFull):
    """The batcher stops (`stop`, `close`) or cannot serve (a worker stopped, the warm-up failed): a
    request is refused, also one accepted before that could not run. The message says which."""


@dataclasses.dataclass
class _Request:
    sentences: Sequence[Sequence[str]]
    tokens: int
    arrived: float
    future: concurrent.futures.Future


@dataclasses.dataclass
class BatchStats:
    """What the batcher has done (read by the service's /metrics).

    Attributes:
      batches: merged batches run; sentences, tokens: in them.
      padded_tokens: token positions the devices ran (padding included).
      compiles: XLA programs compiled in the process while the batcher was open (warm-up included),
        or read from the persistent compilation cache; cache_hits: those read from it.
      failures: batches that failed (their requests got the error).
      warmup_batches: warm-up batches run.
      refused: accepted requests refused before they ran (the batcher stopped, or could not serve).
      warmup_refused: requests refused because the warm-up was running (`WarmingUp`).
    """

    batches: int = 0
    sentences: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    compiles: int = 0
    cache_hits: int = 0
    failures: int = 0
    warmup_batches: int = 0
    refused: int = 0
    warmup_refused: int = 0


class DynamicBatcher:
    """Merges concurrent requests into batches of one embedder (see the module doc).

    Args:
      embedder: the `SentenceEmbedder` batches run on (its `layers` is what each sentence gets), or a list
        of them, one per worker thread: while one worker waits for its batch's results, the next one
        forms and dispatches the next batch, so host work (forming batches, splitting answers) overlaps
        the devices' (their programs are shared: more workers compile nothing more).
      max_batch_tokens: a batch closes once it holds this many tokens (it may hold more: requests are
        never split).
      max_wait_s: ... or once its oldest request has waited this long (finite, 0 to
        `threading.TIMEOUT_MAX`, what a wait can take).
      max_queue_tokens: tokens waiting (not yet in a batch) at most; `submit` refuses beyond.
      warmup: lists of sentences embedded by `start` before serving, so that the common shapes are
        compiled before the first request (the service is ready after them; requests are refused with
        `WarmingUp` until then).
      on_batch: called after each batch with (requests, sentences, tokens) in it (the service's histograms).
    """

    def __init__(
        self,
        embedder: SentenceEmbedder | Sequence[SentenceEmbedder],
        *,
        max_batch_tokens: int = 4096,
        max_wait_s: float = 0.005,
        max_queue_tokens: int = 262144,
        warmup: Sequence[Sequence[Sequence[str]]] = (),
        on_batch=None,
    ):
        for name, value in (("max_batch_tokens", max_batch_tokens), ("max_queue_tokens", max_queue_tokens)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, found {value!r}")
        if isinstance(max_wait_s, bool) or not isinstance(max_wait_s, (int, float)) or not 0 <= max_wait_s <= WAIT_MAX:
            raise ValueError(f"max_wait_s must be a finite number of seconds, 0 to {WAIT_MAX:g}, found {max_wait_s!r}")
        self.embedders = list(embedder) if isinstance(embedder, Sequence) else [embedder]
        if not self.embedders:
            raise ValueError("at least one embedder is needed")
        self.max_batch_tokens, self.max_wait_s, self.max_queue_tokens = max_batch_tokens, max_wait_s, max_queue_tokens
        self._warmup, self.on_batch = list(warmup), on_batch
        self.stats = BatchStats()
        self.ready = threading.Event()  # set once the warm-up batches have run; cleared if it cannot serve
        self._waiting: collections.deque[_Request] = collections.deque()
        self._queued_tokens = 0
        self._closing = False
        self._failure: str | None = None  # why the batcher cannot serve (a worker stopped, the warm-up failed)
        self._warming = len(self.embedders)  # workers still warming up
        self._progress: Progress | None = None  # the warm-up's, from `start`
        self._cond = threading.Condition()
        self._stats_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"elmo_jax-batcher-{i}", daemon=True)
            for i in range(len(self.embedders))
        ]
        _watch_compiles(self)

    def _count_compile(self, cache_hit: bool = False) -> None:
        """Counts a program compiled or read from the persistent cache (`compiles`), or that it was read
        (`cache_hits`: JAX reports both for one read)."""
        with self._stats_lock:  # the workers compile side by side during the warm-up
            if cache_hit:
                self.stats.cache_hits += 1
            else:
                self.stats.compiles += 1

    @property
    def queued_tokens(self) -> int:
        """Tokens of the requests waiting for a batch."""
        return self._queued_tokens

    @property
    def queued_requests(self) -> int:
        return len(self._waiting)

    @property
    def status(self) -> str:
        """Whether it serves, as /readyz says it: "ready", or "warming up (compiling)", "shutting down",
        "not serving: <why>" (a worker stopped, the warm-up failed)."""
        if self._failure is not None:
            return f"not serving: {self._failure}"
        if self._closing:
            return "shutting down"
        return "ready" if self.ready.is_set() else "warming up (compiling)"

    @property
    def warmup_total(self) -> int:
        """Warm-up batches (one per program shape; 0: no warm-up)."""
        return len(self._warmup)

    def warmup_progress(self) -> dict | None:
        """The warm-up as /readyz says it: {"done": programs run, "total": of them, "seconds_left": the
        estimate from the batches run so far (None before the first is done, 0 once ready)}; None without
        a warm-up."""
        if not self._warmup:
            return None
        with self._stats_lock:
            done, left = self.stats.warmup_batches, self._seconds_left()
        return {"done": done, "total": len(self._warmup), "seconds_left": None if left is None else round(left)}

    def _seconds_left(self) -> float | None:
        """The warm-up's estimated seconds left (the caller holds `_stats_lock`); None when not known."""
        if self.ready.is_set():
            return 0.0
        eta = math.nan if self._progress is None or not self.stats.warmup_batches else self._progress.eta()
        return eta if math.isfinite(eta) else None

    def outcome(self) -> str:
        """What became of the accepted requests, for the service's last line once the batcher is closed."""
        refused, run, total = self.stats.refused, self.stats.warmup_batches, len(self._warmup)
        counted = {0: "no accepted request was", 1: "1 accepted request was"}
        requests = counted.get(refused, f"{refused} accepted requests were") + " refused"
        if self._failure is not None:
            return f"stopped after the service stopped serving ({self._failure}): {requests}" + " (503)" * bool(refused)
        if not self.ready.is_set() and total:
            happened = f"stopped during the warm-up ({run} of {total} warm-up batches run)"
            if refused:
                return f"{happened}: {requests} (503, shutting down)"
            turned = self.stats.warmup_refused
            return f"{happened}: no request was accepted" + f" ({turned} refused while it ran: 503)" * bool(turned)
        return "stopped: every accepted request was answered"

    def start(self) -> None:
        """Starts the worker threads: they share the warm-up batches (`ready` is set after them all), then
        every worker takes requests."""
        if self._warmup:
            total, workers = len(self._warmup), len(self.embedders)
            self._progress = Progress(
                {"programs": total},
                every=max(1, math.ceil(total * WARMUP_LINE_SHARE)),
                every_s=WARMUP_LINE_EVERY_S,
                log=True,
            )
            logging.info(
                "warm-up: %d programs to compile (or read from the compilation cache) on %d worker%s before "
                "ready; requests meanwhile get 503 with Retry-After; --nowarmup skips it (a shape then compiles "
                "when a batch first meets it)",
                total,
                workers,
                "s" * (workers > 1),
            )
        for thread in self._threads:
            thread.start()

    def submit(self, sentences: Sequence[Sequence[str]]) -> concurrent.futures.Future:
        """Queues one request's sentences (lists of str tokens, already checked); returns a future of their
        vectors in order. Raises QueueFull when `max_queue_tokens` would be exceeded, NotServing when the
        batcher stops or cannot serve."""
        tokens = sum(len(s) for s in sentences)
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._failure is not None:
                raise NotServing(f"the service cannot serve: {self._failure}")
            if self._closing:
                raise NotServing("the service is shutting down")
            if self._warmup and not self.ready.is_set():
                raise self._warming_up()
            # One request larger than the whole bound is still taken when nothing waits (the request caps
            # bound it), so it cannot be refused forever.
            if self._waiting and self._queued_tokens + tokens > self.max_queue_tokens:
                raise QueueFull(f"{self._queued_tokens} tokens are waiting already (at most {self.max_queue_tokens})")
            self._waiting.append(_Request(sentences, tokens, time.monotonic(), future))
            self._queued_tokens += tokens
            self._cond.notify_all()
        return future

    def _warming_up(self) -> WarmingUp:
        """The refusal of a request submitted during the warm-up (counted), saying how far it is."""
        with self._stats_lock:
            self.stats.warmup_refused += 1
            done, left = self.stats.warmup_batches, self._seconds_left()
        estimate = "the time left is not known yet" if left is None else f"about {duration(left)} left"
        return WarmingUp(
            f"the service is warming up (compiling): {done}/{len(self._warmup)} programs done, {estimate}; "
            "retry after Retry-After seconds (/readyz says when it is ready; --nowarmup starts a service at once, "
            "each new shape compiling when first met)",
            WARMUP_RETRY_UNKNOWN_S if left is None else max(1, math.ceil(left)),
        )

    def stop(self) -> None:
        """Stops taking requests, at once (what the service does on SIGTERM; it does not wait). After the
        warm-up, the workers still embed every request already accepted; during it, the warm-up ends at
        its next batch (nothing waits for it: `submit` refuses requests until it is done; what a batcher
        that was never started holds is refused, NotServing: "shutting down")."""
        with self._cond:
            self._closing = True
            refused = [] if self.ready.is_set() else self._take_waiting()
            self._cond.notify_all()
        self._refuse(refused, "the service is shutting down: it stopped during its warm-up, before this request ran")

    def close(self, timeout: float | None = None) -> None:
        """`stop`, then waits for the workers (those that still run a batch finish it: an XLA compile
        cannot be cut short) and stops counting compiles."""
        self.stop()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)
        with _COUNTING_LOCK:
            _COUNTING.discard(self)

    def _take_waiting(self) -> list[_Request]:
        """Empties the queue (the caller holds `_cond`); returns what waited."""
        waiting = list(self._waiting)
        self._waiting.clear()
        self._queued_tokens = 0
        return waiting

    def _refuse(self, requests: list[_Request], why: str) -> None:
        """Gives accepted requests that will not run a NotServing error (`why`) and counts them."""
        for r in requests:
            if r.future.set_running_or_notify_cancel():
                r.future.set_exception(NotServing(why))
        with self._stats_lock:
            self.stats.refused += len(requests)

    def _fail(self, why: str) -> None:
        """The batcher cannot serve (`why` names the cause): not ready, what waits is refused, the other
        workers stop, and `submit` refuses from now on."""
        with self._cond:
            self._failure = self._failure or why
            self.ready.clear()
            refused = self._take_waiting()
            self._cond.notify_all()
        self._refuse(refused, f"the service cannot serve: {self._failure}")

    def _work(self, worker: int) -> None:
        """A worker thread: its share of the warm-up, then batches until the batcher stops. A fault of this
        loop itself (a batch's own errors go to its requests, `_run`) stops the batcher serving: no request
        is left waiting for a worker that is gone."""
        embedder = self.embedders[worker]
        try:
            if not self._warm_up(worker, embedder):
                return
            while (batch := self._next_batch(worker)) is not None:
                self._run(embedder, batch)
        except Exception as e:
            logging.exception("worker %d stopped; the service stops serving (not ready)", worker)
            self._fail(f"worker {worker} stopped: {type(e).__name__}: {e}")

    def _warm_up(self, worker: int, embedder: SentenceEmbedder) -> bool:
        """Runs this worker's share of the warm-up batches (every n-th of n workers: their shapes differ,
        so the workers compile side by side on the host's cores), then waits for the others' (`ready`
        is set once all are done). Stops between batches once the batcher stops. False: a warm-up failed
        or the batcher stopped first."""
        for sentences in self._warmup[worker :: len(self.embedders)]:
            if self._closing or self._failure is not None:
                return False
            try:
                self._embed(embedder, sentences)
            except Exception as e:  # the service stays up, not ready, and says why
                logging.exception("warm-up failed")
                self._fail(f"the warm-up failed: {type(e).__name__}: {e}")
                return False
            self._warmed_up_one()
        with self._cond:
            self._warming -= 1
            if self._warming == 0 and self._failure is None and not self._closing:
                if self._progress is not None:
                    self._progress.write(self._done_line(), final=True)
                self.ready.set()
        while not self.ready.wait(0.5):
            if self._closing or self._failure is not None:
                return False
        return True

    def _warmed_up_one(self) -> None:
        """Counts a warm-up batch done, and writes the progress line when one is due: the programs done and
        the time left at the rate so far (the workers' batches side by side), e.g. `warm-up: 80/168
        programs, ~2.0 min left`."""
        with self._stats_lock:
            self.stats.warmup_batches += 1
            progress = self._progress
            progress.add(programs=1)
            done, total = self.stats.warmup_batches, len(self._warmup)
            if done < total and progress.due():
                progress.write(f"warm-up: {done}/{total} programs, ~{duration(progress.eta())} left")

    def _done_line(self) -> str:
        """The warm-up's last line: its time and what XLA did (compiled, or read from the persistent cache)."""
        with self._stats_lock:
            compiles, read = self.stats.compiles, self.stats.cache_hits
        cached = f"{read} read from the compilation cache, " if read else ""
        return (
            f"warm-up done: {len(self._warmup)} programs in {duration(self._progress.seconds())} "
            f"({cached}{compiles - read} compiled); ready"
        )

    def _next_batch(self, worker: int) -> list[_Request] | None:
        """The oldest request and those after it, once full or its wait is over; None once closed and empty
        (or the batcher cannot serve). Workers after the first take a batch only while half a batch or
        more waits: under a light load one worker runs one batch at a time and the requests that arrive
        meanwhile form the next (small batches run on the devices side by side cost nearly as much as one
        each: an LSTM step's time hardly depends on its rows), under a heavy load they overlap."""
        with self._cond:
            while True:
                busy = worker == 0 or self._closing or self._queued_tokens >= self.max_batch_tokens // 2
                if self._waiting and busy:
                    break
                if self._closing or self._failure is not None:
                    return None
                self._cond.wait()
            deadline = self._waiting[0].arrived + self.max_wait_s
            while (
                self._queued_tokens < self.max_batch_tokens
                and not self._closing
                and (remaining := deadline - time.monotonic()) > 0
            ):
                self._cond.wait(remaining)
            batch, tokens = [], 0
            while self._waiting and (not batch or tokens + self._waiting[0].tokens <= self.max_batch_tokens):
                request = self._waiting.popleft()
                batch.append(request)
                tokens += request.tokens
            self._queued_tokens -= tokens
            return batch

    @staticmethod
    def _embed(embedder: SentenceEmbedder, sentences: list) -> list:
        """`embedder.embed` without its log line (one per batch would flood a service's log)."""
        return list(embedder.stream(sentences, window=max(len(sentences), 1)))

    def _run(self, embedder: SentenceEmbedder, batch: list[_Request]) -> None:
        """Embeds a batch and hands each request its own vectors; whatever fails on the way (the embedding,
        e.g. device memory; the split; the metrics' callback) is logged once, with its traceback, and each
        request of the batch gets the error (the service answers 500)."""
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        sentences = [s for r in live for s in r.sentences]
        try:
            answers = self._embed_batch(embedder, live, sentences)
        except Exception as e:
            with self._stats_lock:
                self.stats.failures += 1
            logging.exception("a batch of %d requests (%d sentences) failed", len(live), len(sentences))
            for r in live:
                r.future.set_exception(e)
            return
        for r, vectors in zip(live, answers):
            r.future.set_result(vectors)

    def _embed_batch(self, embedder: SentenceEmbedder, live: list[_Request], sentences: list) -> list[list]:
        """The batch's vectors split per request (float32 (L+1, n, 2P) per sentence), its counts in `stats`."""
        before = embedder.stats["padded_tokens"]
        vectors = self._embed(embedder, sentences)
        if len(vectors) != len(sentences):
            raise RuntimeError(f"the embedder gave {len(vectors)} arrays for {len(sentences)} sentences")
        tokens = sum(r.tokens for r in live)
        with self._stats_lock:
            stats = self.stats
            stats.batches += 1
            stats.sentences += len(sentences)
            stats.tokens += tokens
            stats.padded_tokens += embedder.stats["padded_tokens"] - before
            if self.on_batch is not None:
                self.on_batch(len(live), len(sentences), tokens)
        answers, start = [], 0
        for r in live:
            answers.append(vectors[start : start + len(r.sentences)])
            start += len(r.sentences)
        return answers


def warmup_sentences(
    embedder: SentenceEmbedder, max_tokens: int, widths=(8, 16, 24), max_row: int = 128, most_rows: int | None = None
) -> list[list[list[str]]]:
    """Warm-up batches for a service: one per program shape that requests of text merge into, so that
    they are compiled before the service says it is ready.

    A merged batch is packed (`packing`); the packer names the (rows, T2) its batches can have for
    sentences of up to `max_tokens` tokens (`RowPacker.shapes`, rows of at most `max_row` steps: 128,
    sentences of up to 126 tokens; with `most_rows`, batches of at most that many rows), each with
    sentences that make it. A batch's char CNN width is that of its widest word: each shape is embedded
    for each width bucket in `widths` (8, 16, 24: words of up to 6, 14 and 22 bytes, most text). Shapes
    outside these (wider words, longer sentences) compile when first met (the service's metrics count
    them). The batches come in an order that spreads their costs (see the comment at its end).
    """
    C = embedder.C
    packer = RowPacker(
        embedder.batch_tokens,
        C,
        row_multiple=embedder.runner.row_multiple,
        boundaries=embedder.boundaries,
        tail_steps=embedder.tail_steps,
    )
    shapes = packer.shapes(min(max_tokens, embedder.batch_tokens), longest_row=max_row)
    shapes = {shape: lengths for shape, lengths in shapes.items() if most_rows is None or shape[0] <= most_rows}
    batches = []
    for S in sorted({min(w, C) for w in widths}):
        word = "w" * (S - 2)  # with its begin and end marks, S wide: the batch's width bucket is S
        batches += [[[word] * n for n in lengths] for lengths in shapes.values()]
    # A program's cost grows with its width and rows along this list. In the golden-ratio order (each
    # next batch about 0.618 of the list further on) every stretch of it holds cheap and costly ones
    # alike, so the time per program so far predicts the rest: the progress line's estimate (within 10%
    # on the 2-core CPU, where the list's own order said a third of the time left).
    return [batches[i] for i in sorted(range(len(batches)), key=lambda i: (i * GOLDEN_STEP) % 1)]


def warmup_set(embedder: SentenceEmbedder, max_tokens: int, shapes: str) -> list[list[list[str]]]:
    """The warm-up batches of a service (`--warmup_shapes`): "all" the shapes `warmup_sentences` names
    (168 programs for the small model's 4,096-token batches, 16 tail steps, one device), or "common" those
    of batches of up to `COMMON_ROWS` rows of up to `COMMON_ROW` steps (30 there): what one request, or a
    few small ones merged, runs into. On a 2-core CPU the rest cost 2-3 CPU-s each to compile when first
    met, once, against every start's warm-up (docs/SERVING.md, "Warm-up", has the measured trade-off)."""
    if shapes not in WARMUP_SHAPES:
        raise ValueError(f"--warmup_shapes={shapes}: expected one of {', '.join(WARMUP_SHAPES)}")
    if shapes == "common":
        return warmup_sentences(embedder, max_tokens, max_row=COMMON_ROW, most_rows=COMMON_ROWS)
    return warmup_sentences(embedder, max_tokens)
