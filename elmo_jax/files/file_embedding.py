"""Embedding a whole text file into the HDF5 layout of AllenNLP's `elmo` command (`formats.vectors_hdf5`):
the library half of `python -m elmo_jax.embed_file`.

1. The output path is checked, then the input (every line; errors name the line: `sentence_input.scan`).
2. The run gets its staging directory next to the output (`formats.vector_spool`): a killed run's, taken
   over when it embedded the same input with the same arguments and model (the run continues from the
   sentences already done, and says so), or a new one (saying why an old one was not taken).
3. This process's lines (all of them; with several processes every count-th, `owns`) that
   the spool does not hold yet are streamed into length x width buckets (`length_buckets`), each batch
   is run on all local devices (`batch_runner`) while the host prepares the next, and each finished
   batch is appended to the spool. With a vocabulary (a model directory's vocab.txt), its words that
   occur in the input skip the char CNN (`token_cache`, the same vectors to 1e-6).
4. Process 0 writes the output from every process's spool in line order (`file_output`) and renames it
   into place; the staging directories are removed.

A token over the model's C-2 UTF-8 bytes (48) is cut to them, as everywhere (docs/ELMO.md, "Long
tokens"); the run counts them over the whole input (resumed lines and every process's share included):
`truncated_tokens` in the counts, and a warning in the summary when there are any.

Two runs never write one output at once: a run refuses, naming the other, when a live process of this
host holds a staging directory of its output (`atomic.live_staging`).

`embed_model_file` is the command's entry: it takes the model as the command names it
(`formats.model_source.ModelSource`), checks what is cheap to check before loading it, and decides the
token cache (a model directory's vocab.txt, with --token_cache=auto).

A stop leaves the run finished (the output complete under its name, nothing staged) or resumable (the
output untouched, the staging directory kept, and the same command continues), never neither.
SIGTERM and Ctrl-C are taken at the next stop point (`runtime.signals`: between batches and lines), so no
library code they land in can lose them or turn them into an error; they keep the staging directory
(its spool synced to disk), as do `kill -9` and the death of another process of the run
(`processes.ProcessLost`). Once the finished file is being renamed into place, a signal waits until
the staging directory is removed too: the run finishes. An error removes the staging directory (a full
disk gets its space back), unless a signal came first (the error may be what became of it).
HDF5 and the spool need a file system: a gs://
input is read from a local copy and a gs:// output written to a local working copy of this machine
(where a stopped run resumes), uploaded in one piece when complete (`storage.working_copy`); it takes one
process. Each sentence starts from a zero LSTM state, so
its vectors do not depend on the file's order, the batch it lands in, or how the run was split or
interrupted (up to float32 rounding in other batch shapes, ~1e-7).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from absl import logging

from elmo_jax import storage
from elmo_jax.features.batch_runner import BatchRunner
from elmo_jax.features.length_buckets import BucketBatcher, InputOrderBatcher, Piece
from elmo_jax.features.output_modes import OutputMode, output_mode
from elmo_jax.features.token_ids import CharIdTable, width_bucket
from elmo_jax.files import file_staging, sentence_input
from elmo_jax.files.file_options import IDENTITY_OPTIONS, Options
from elmo_jax.files.file_output import write_output
from elmo_jax.formats import output_paths
from elmo_jax.formats.model_source import ModelSource
from elmo_jax.formats.vectors_hdf5 import VECTORS_FILE
from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.model.params import iter_flat
from elmo_jax.runtime import processes
from elmo_jax.runtime.progress import Progress
from elmo_jax.runtime.signals import StopSignals
from elmo_jax.storage import atomic

IN_FLIGHT = 2  # batches on the devices while the host writes the one before


def owns(line: int, index: int, count: int) -> bool:
    """Whether process `index` of `count` embeds `line` (0-based): lines are dealt round-robin, which
    spreads every length and width bucket evenly over the processes."""
    return line % count == index


def embed_model_file(
    model: ModelSource,
    input_path: str | None,
    output_path: str | None,
    options: Options = Options(),
    *,
    cluster: processes.Cluster | None = None,
) -> dict:
    """`embed_file` with the biLM a command names, as `python -m elmo_jax.embed_file` runs it.

    Everything that can be checked cheaply is, before the model is loaded: the options, the output path
    (which may not be one of the model's files either) and the input, every line (a gs:// input once
    downloaded, `storage.local_copy`). With --token_cache=auto and a model directory that holds a
    vocab.txt (`ModelSource.vocabulary_file`), the vocabulary's words that occur in the input skip the
    char CNN.

    Args:
      model: --model, or --options and --weights.
      input_path, output_path: --input and --output (both required).
      options: see `Options`.
      cluster: the command's --distributed flags: `jax.distributed` is started as they ask once the
        checks have passed, before the model is loaded or a device used (None: one process).

    Returns:
      `embed_file`'s counts.
    """
    for name, flag, path in (("input_path", "input", input_path), ("output_path", "output", output_path)):
        if not path:
            raise ValueError(f"{name} is required (the command's --{flag})")
    options.check()
    target = check_output_path(output_path, options.overwrite, inputs=[input_path, *model.paths], remove_stale=False)
    # Before the input is read or the model loaded: another run writing this output refuses this one.
    file_staging.refuse_another_writer(target, f"--output={output_path}")
    vocab_file = model.vocabulary_file() if options.token_cache == "auto" else None
    with storage.local_copy(input_path) as local_input:  # a gs:// input: downloaded once, here
        try:
            summary = sentence_input.scan(
                local_input,
                blank_lines=options.blank_lines,
                max_tokens=options.max_sentence_tokens,
                long_sentences=options.long_sentences,
                collect_types=vocab_file is not None,
            )
        except (OSError, ValueError) as e:  # name the input as given, not its local copy
            raise type(e)(str(e).replace(local_input, input_path)) from None
        if cluster is not None:
            cluster.start()
        params = model.load()
        vocabulary = None if vocab_file is None else Vocab.load(vocab_file).words
        return embed_file(params, local_input, output_path, options, summary=summary, vocabulary=vocabulary)


def embed_file(
    params,
    input_path: str,
    output_path: str,
    options: Options = Options(),
    *,
    summary: sentence_input.InputSummary | None = None,
    vocabulary=None,
) -> dict:
    """Embeds every line of `input_path` into a new HDF5 file at `output_path` (see the module doc).

    Args:
      params: the biLM (`load`, `load_hdf5`).
      input_path, output_path: the text file and the HDF5 file to write.
      options: see `Options` (the command-line flags).
      summary: `sentence_input.scan` of the input with the same options, if already done.
      vocabulary: the model's words (a model directory's vocab.txt), for the token cache.

    Returns:
      counts: lines, sentences (datasets written; this process's lines on processes > 0), tokens,
      blank_lines, split_lines, batches, compiled_shapes (distinct (rows, T, S) programs), padded_tokens,
      resumed_lines (taken from a killed run), truncated_tokens (cut to C-2 UTF-8 bytes, over the whole
      input), cached_types, processes, devices, seconds.

    Raises:
      ValueError / OSError: bad options, input or output path, another run writing the same output
        (`file_staging.OutputInUse`), a full disk, with the flag, file or line named; nothing is left under
        `output_path` (an existing file there is untouched).
      processes.ProcessLost: another process of the run died; this one's progress is kept (the message
        says where).
      KeyboardInterrupt, or what the SIGTERM handler raises: stopped; its note says where the progress is
        kept for the same call to continue.
    """
    with storage.working_copy(output_path) as local_output:
        if storage.is_working_copy(local_output, output_path):  # the output is written here, then uploaded
            check_output_path(output_path, options.overwrite, inputs=[input_path], remove_stale=False)
            if processes.share()[1] > 1:
                raise ValueError(
                    f"--output={output_path}: with several processes the output must be on a file system every "
                    "process sees (process 0 reads every process's spool, which a bucket cannot hold; "
                    "docs/CLOUD_STORAGE.md); write it there, then upload it, or run one process"
                )
            options = dataclasses.replace(options, overwrite=True)  # the local copy is this command's own
        with storage.local_copy(input_path) as local_input:
            if local_input != input_path:
                summary = None  # scanned again from the local copy (the same bytes: the same identity)
            return _embed_local_file(params, local_input, local_output, options, summary=summary, vocabulary=vocabulary)


def _embed_local_file(
    params, input_path: str, output_path: str, options: Options, *, summary=None, vocabulary=None
) -> dict:
    """`embed_file` of a local input into a local output."""
    start = time.perf_counter()
    run = _prepare(params, input_path, output_path, options, summary, vocabulary)
    counts = _embed_and_write(run, options)
    index, count = processes.share()
    counts.update(
        lines=run.summary.lines,
        tokens=run.summary.tokens,
        blank_lines=run.summary.blank,
        split_lines=run.summary.long,
        cached_types=0 if run.runner.cache is None else len(run.runner.cache),
        process=index,
        processes=count,
        devices=len(run.runner.devices),
        seconds=time.perf_counter() - start,
    )
    _log_summary(run.summary, counts, options, run.runner.vocabulary)
    return counts


class _Prepared(NamedTuple):
    """What a run has settled before it touches any staging directory."""

    target: str  # the output's absolute path
    shown: str  # how errors name it: --output=...
    output: OutputMode
    summary: sentence_input.InputSummary
    runner: BatchRunner
    identity: dict  # what a spool must have been made from to be continued (`_identity`)


def _prepare(params, input_path: str, output_path: str, options: Options, summary, vocabulary) -> _Prepared:
    """The checks, the output mode, the input's scan, the token cache and the batch runner: everything
    that can fail before a staging directory is touched (a mistake such as --devices must not cost a
    stopped run its progress)."""
    target = check_output_path(output_path, options.overwrite, inputs=[input_path], remove_stale=False)
    config = params.config
    output = output_mode(
        options.layers, config.n_output_layers, config.output_dim, options.mix_scalars, options.gamma, options.float16
    )
    options.check()
    use_vocabulary = vocabulary is not None and options.token_cache == "auto"
    summary = summary or sentence_input.scan(
        input_path,
        blank_lines=options.blank_lines,
        max_tokens=options.max_sentence_tokens,
        long_sentences=options.long_sentences,
        collect_types=use_vocabulary,
    )
    cache = _token_cache(params, vocabulary, summary) if use_vocabulary else None
    runner = BatchRunner(params, output, devices=options.devices, compute_dtype=options.compute_dtype, cache=cache)
    identity = _identity(summary, options, params, cache is not None)
    return _Prepared(target, f"--output={output_path}", output, summary, runner, identity)


def _embed_and_write(run: _Prepared, options: Options) -> dict:
    """This process's share embedded into its spool, and (process 0) the output written from every
    spool and put in place, signals taken at the stop points (`runtime.signals`). Returns the counts."""
    index, count = processes.share()
    # Again (the other run may have started since), before any process of this run takes a staging
    # directory: none does before every process has met in check_same.
    file_staging.refuse_another_writer(run.target, run.shown)
    processes.check_same("inputs or arguments", json.dumps(run.identity, sort_keys=True))
    staging, spool = file_staging.open_spool(
        run.target, {**run.identity, "share": [index, count]}, options.resume, run.shown
    )
    with StopSignals(second_signal="at_once") as stops:
        try:
            staging_dirs = processes.gather_text(staging)  # every process has taken its staging directory
            file_staging.refuse_another_writer(run.target, run.shown, ours=staging_dirs)  # one that started meanwhile
            atomic.remove_stale_staging(run.target, log=logging.warning)  # none is what another process takes over
            counts = _embed_share(run.runner, spool, run.summary, options, index, count, stops.check)
            spool.sync()
            spool.close()
            processes.barrier("embed_file: embedded")
            counts["truncated_tokens"] = sum(map(int, processes.gather_text(str(counts["truncated_tokens"]))))
            staged = None
            if index == 0:
                staged, counts["sentences"] = write_output(
                    run.shown,
                    staging_dirs,
                    run.summary,
                    run.output,
                    skip_blank=options.blank_lines == "skip",
                    sentence_index=options.sentence_index,
                    stop_point=stops.check,
                )
            stops.check()  # the last stop point: from here the output goes into place
        except BaseException as failure:
            # `failure` itself, or an exception chained to it: a stop, a lost process, an error.
            raise file_staging.ended_early(failure, stops, spool, staging, run.shown)  # noqa: B904
        file_staging.put_in_place(staged, run.target, staging, spool, stops, run.shown)
    return counts


def check_output_path(path: str, overwrite: bool = False, *, inputs=(), remove_stale: bool = True) -> str:
    """Raises (naming --output) unless the vectors file may be written at `path` (`output_paths`: not an
    existing file unless `overwrite` and it is an elmo-command HDF5 file, not one of `inputs`, not
    inside a model directory or workdir); returns the absolute path."""
    return output_paths.check_output(path, VECTORS_FILE, overwrite=overwrite, inputs=inputs, remove_stale=remove_stale)


def _identity(summary: sentence_input.InputSummary, options: Options, params, cached: bool) -> dict:
    """What a spool must have been made from to be continued (JSON-normalised, see `vector_spool`)."""
    chosen = {name: getattr(options, name) for name in IDENTITY_OPTIONS}
    chosen["token_cache"] = "vocabulary" if cached else "off"
    identity = {
        "input": {"size": summary.size, "sha256": summary.sha256},
        "options": chosen,
        "model": weights_digest(params),
    }
    return json.loads(json.dumps(identity))


def weights_digest(params) -> str:
    """SHA-256 of the biLM's architecture and every weight."""
    digest = hashlib.sha256(repr(params.config).encode())
    for path, value in sorted(iter_flat(params.weights)):
        array = np.ascontiguousarray(np.asarray(value, np.float32))
        digest.update(f"{path}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _token_cache(params, vocabulary, summary: sentence_input.InputSummary):
    """A token cache of the vocabulary's words that occur in the input (all of them when the input has
    too many types to collect), or None when none occurs."""
    from elmo_jax.features.token_cache import build_token_cache

    types = summary.types
    words = [w for w in dict.fromkeys(vocabulary) if types is None or w in types]
    if not words:
        return None
    cache = build_token_cache(params, words)
    logging.info(
        "token cache: %d of the vocabulary's words occur in the input; their char CNN is computed once", len(words)
    )
    return cache


def _embed_share(
    runner: BatchRunner, spool, summary, options: Options, index: int, count: int, stop_point: Callable[[], object]
) -> dict:
    """Embeds this process's lines that the spool does not hold, appending each batch to the spool;
    `stop_point` is called before each line and after each appended batch (where the spool is whole)."""
    C, max_tokens = runner.config.max_characters_per_token, options.max_sentence_tokens
    vocabulary = runner.vocabulary  # the model's text -> ids
    batcher_type = BucketBatcher if options.bucketing else InputOrderBatcher  # --bucketing=false: input order
    batcher = batcher_type(options.batch_tokens, vocabulary.width, row_multiple=runner.row_multiple)
    done = _DonePieces(spool.pieces.sorted())
    resumed = len(spool.pieces.lines())
    total_lines = -(-(summary.lines - summary.blank) // count)
    totals = {"sentences": total_lines - resumed, "tokens": -(-summary.tokens // count)}
    progress = Progress(totals, by="tokens", enabled=options.progress)
    ids, keep_tokens = CharIdTable(vocabulary), runner.cache is not None
    pending: collections.deque = collections.deque()
    counts = {"batches": 0, "lines_read": 0, "resumed_truncated": 0}

    def run(batches) -> None:
        for batch in batches:
            pending.append((batch, runner.dispatch(batch)))
            counts["batches"] += 1
            while len(pending) > IN_FLIGHT:
                _finish(runner, spool, progress, *pending.popleft())
                stop_point()

    for line, tokens in sentence_input.lines(summary.path):
        stop_point()
        counts["lines_read"] += 1
        if not tokens or not owns(line, index, count):
            continue
        for offset in range(0, len(tokens), max_tokens):
            part = tokens[offset : offset + max_tokens]
            if done.has(line, offset):  # embedded by the stopped run: its cut tokens still count
                counts["resumed_truncated"] += vocabulary.count_truncated([part])
                continue
            chars, width = ids.ids(part)
            run(batcher.add(Piece(line, offset, chars, width_bucket(width, C), part if keep_tokens else None)))
    run(batcher.flush())
    while pending:
        _finish(runner, spool, progress, *pending.popleft())
        stop_point()
    progress.close()
    if counts.pop("lines_read") != summary.lines:
        raise ValueError(f"--input={summary.path}: the file changed while it was read; embed it again")
    counts.update(
        sentences=len(spool.pieces.lines()),
        compiled_shapes=len(runner.shapes),
        padded_tokens=runner.padded_tokens,
        resumed_lines=resumed,
        truncated_tokens=ids.truncated + counts.pop("resumed_truncated"),  # this process's lines
    )
    return counts


def _finish(runner: BatchRunner, spool, progress, batch, result) -> None:
    """Fetches a batch's result (waiting for the devices) and appends its pieces to the spool."""
    result = np.asarray(result)
    pieces = batch.pieces
    spool.append(
        [(p.line, p.offset, p.n_tokens) for p in pieces],
        [runner.output.piece(result, row, p.n_tokens) for row, p in enumerate(pieces)],
    )
    progress.update(sentences=sum(p.offset == 0 for p in pieces), tokens=sum(p.n_tokens for p in pieces))


class _DonePieces:
    """Which (line, offset) pieces a resumed spool holds; asked in increasing order."""

    def __init__(self, table: np.ndarray):
        self.lines, self.offsets = table[:, 0], table[:, 1]  # sorted by (line, offset)
        self.cursor = 0

    def has(self, line: int, offset: int) -> bool:
        lines, offsets, n = self.lines, self.offsets, len(self.lines)
        while self.cursor < n and (lines[self.cursor].item(), offsets[self.cursor].item()) < (line, offset):
            self.cursor += 1
        return self.cursor < n and (lines[self.cursor].item(), offsets[self.cursor].item()) == (line, offset)


def _log_summary(summary: sentence_input.InputSummary, counts: dict, options: Options, vocabulary) -> None:
    logging.info(
        "embedded %d sentences (%d tokens) in %.1f s: %d batches, %d compiled shapes, %d lines resumed",
        counts["sentences"],
        counts["tokens"],
        counts["seconds"],
        counts["batches"],
        counts["compiled_shapes"],
        counts["resumed_lines"],
    )
    if summary.blank:
        how = {"empty": "written as empty (0-token) entries", "skip": "skipped (no entry)"}[options.blank_lines]
        logging.warning(
            "%d blank lines %s, first at line %s", summary.blank, how, ", ".join(map(str, summary.first_blank))
        )
    if summary.long:
        logging.warning(
            "%d sentences over %d tokens embedded in pieces (each piece without the others' context), first at line %s",
            summary.long,
            options.max_sentence_tokens,
            ", ".join(map(str, summary.first_long)),
        )
    vocabulary.warn_truncated(counts["truncated_tokens"], counts["tokens"])
