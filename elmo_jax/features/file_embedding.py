"""Embedding a whole text file into the HDF5 layout of AllenNLP's `elmo` command (`formats.vectors_hdf5`):
the library half of `python -m elmo_jax.embed_file`.

The file is checked first (every line; errors name the line). Sentences are then streamed and grouped
by length and character-width bucket (`length_buckets`), so memory stays bounded by the buckets,
whatever the file's size, and XLA compiles one program per bucket that occurs (the count is logged).
Each sentence starts from a zero LSTM state, so its vectors do not depend on the file's order or the
batch it lands in.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time

import jax
import numpy as np
from absl import logging

from elmo_jax.features import sentence_input
from elmo_jax.formats import output_paths
from elmo_jax.formats.vectors_hdf5 import VECTORS_FILE, VectorsFile
from elmo_jax.model.char_cnn import content_bucket

LAYER_MODES = ("all", "top", "average", "mix")


@dataclasses.dataclass(frozen=True)
class Options:
    """How to embed a file; the fields mirror the command-line flags."""

    layers: str = "all"
    mix_scalars: tuple[float, ...] | None = None
    gamma: float = 1.0
    batch_tokens: int = 4096
    float16: bool = False
    compute_dtype: str = "float32"
    blank_lines: str = "empty"
    max_sentence_tokens: int = 1024
    long_sentences: str = "error"
    bucketing: bool = True
    sentence_index: bool = True
    progress: bool = False
    overwrite: bool = False  # replace an existing output, if it is an elmo-command HDF5 file


def embed_file(
    params,
    input_path: str,
    output_path: str,
    options: Options = Options(),
    *,
    summary: sentence_input.InputSummary | None = None,
) -> dict:
    """Embeds every line of `input_path` into a new HDF5 file at `output_path` (see the module doc).

    Args:
      params: the biLM (`load`, `load_hdf5`).
      input_path, output_path: the text file and the HDF5 file to write.
      options: see `Options` (the command-line flags).
      summary: `sentence_input.scan` of the input with the same options, if already done.

    Returns:
      counts: lines, sentences (datasets written), tokens, blank_lines, split_lines, batches,
      compiled_shapes (distinct (rows, T, chars) batch shapes), seconds.

    Raises:
      ValueError / OSError: bad options, input or output path, with the flag, file or line named;
        nothing is left under `output_path` (an existing file there is untouched).
    """
    from elmo_jax.features import length_buckets

    check_output_path(output_path, options.overwrite, inputs=[input_path])
    mix = _mix_weights(options, params.config.n_output_layers)
    summary = summary or sentence_input.scan(
        input_path,
        blank_lines=options.blank_lines,
        max_tokens=options.max_sentence_tokens,
        long_sentences=options.long_sentences,
    )
    C = params.config.max_characters_per_token
    batcher = (
        length_buckets.BucketBatcher(options.batch_tokens, C)
        if options.bucketing
        else length_buckets.InputOrderBatcher(options.batch_tokens, C)
    )
    progress = _Progress(summary.lines - summary.blank, summary.tokens, enabled=options.progress)
    start, shapes, batches = time.perf_counter(), set(), 0
    with VectorsFile(
        output_path,
        params.config,
        layers=options.layers,
        float16=options.float16,
        sentence_index=options.sentence_index,
    ) as output:
        pending = None  # the previous batch: written while the device computes the next one
        for batch in _batches(input_path, batcher, output, options.max_sentence_tokens, options.blank_lines, C):
            shapes.add(batch.chars.shape + (content_bucket(batch.chars, C),))
            result = _embed_batch(params, batch.chars, options, mix)
            if pending is not None:
                progress.update(*output.write_batch(*pending))
            pending, batches = (batch, result), batches + 1
        if pending is not None:
            progress.update(*output.write_batch(*pending))
        if output.lines_read != summary.lines:
            raise ValueError(
                f"--input={input_path}: {output.lines_read:,} lines now, {summary.lines:,} when it was "
                "checked; the file changed while it was read"
            )
        output.commit()
    progress.close()
    counts = {
        "lines": summary.lines,
        "sentences": output.datasets,
        "tokens": summary.tokens,
        "blank_lines": summary.blank,
        "split_lines": summary.long,
        "batches": batches,
        "compiled_shapes": len(shapes),
        "seconds": time.perf_counter() - start,
    }
    _log_summary(summary, counts, options)
    return counts


def check_output_path(path: str, overwrite: bool = False, *, inputs=()) -> None:
    """Raises (naming --output) unless the vectors file may be written at `path` (`output_paths`: not an
    existing file unless `overwrite` and it is an elmo-command HDF5 file, not one of `inputs`, not
    inside a model directory or workdir)."""
    output_paths.check_output(path, VECTORS_FILE, overwrite=overwrite, inputs=inputs)


def _batches(input_path, batcher, output, max_tokens: int, blank_lines: str, C: int):
    """Streams the file into the batcher; creates each line's dataset as it goes."""
    from elmo_jax.features.length_buckets import Piece
    from elmo_jax.model.chars import tokens_to_raw_ids

    for line, tokens in sentence_input.lines(input_path):
        output.lines_read += 1
        if not tokens and blank_lines == "skip":
            continue
        output.create(line, tokens)
        if not tokens:
            continue  # an empty entry needs no compute
        for offset in range(0, len(tokens), max_tokens):
            piece = tokens[offset : offset + max_tokens]
            yield from batcher.add(Piece(line, offset, tokens_to_raw_ids(piece, C) + 1))
    yield from batcher.flush()


def _embed_batch(params, chars: np.ndarray, options: Options, mix):
    """Dispatches one batch (asynchronously); the layers are reduced and cast on the device."""
    from elmo_jax.features.embed import embed

    layers, _ = embed(params, chars, compute_dtype=options.compute_dtype)
    return _reduce(layers, options.layers, mix, "float16" if options.float16 else "float32")


@functools.partial(jax.jit, static_argnames=("mode", "dtype"))
def _reduce(layers, mode: str, mix, dtype: str):
    """(B, L+1, T, D) -> (B, L+1, T, D) for "all", else (B, T, D); cast to `dtype`."""
    import jax.numpy as jnp

    if mode == "top":
        layers = layers[:, -1]
    elif mode == "average":
        layers = jnp.mean(layers, axis=1)
    elif mode == "mix":
        layers = jnp.einsum("l,bltd->btd", mix, layers, precision="highest")
    return layers.astype(dtype)


def _mix_weights(options: Options, n_layers: int) -> np.ndarray:
    """gamma * softmax(s): the --layers=mix weights (ones/n_layers placeholder for other modes)."""
    if options.layers not in LAYER_MODES:
        raise ValueError(f"--layers must be one of {LAYER_MODES}, found {options.layers!r}")
    scalars = options.mix_scalars
    if scalars is not None and options.layers != "mix":
        raise ValueError("--mix_scalars goes with --layers=mix")
    if scalars is None:
        scalars = (0.0,) * n_layers
    if len(scalars) != n_layers:
        raise ValueError(f"--mix_scalars: expected {n_layers} values (one per layer), found {len(scalars)}")
    s = np.asarray(scalars, np.float64)
    if not np.all(np.isfinite(s)) or not np.isfinite(options.gamma):
        raise ValueError("--mix_scalars and --gamma must be finite numbers")
    weights = np.exp(s - s.max())
    return (options.gamma * weights / weights.sum()).astype(np.float32)


class _Progress:
    """A progress line on standard error: sentences, sentences/s, tokens/s, ETA (blank lines not counted)."""

    def __init__(self, total_lines: int, total_tokens: int, enabled: bool):
        self.total_lines, self.total_tokens, self.enabled = total_lines, max(total_tokens, 1), enabled
        self.lines = self.tokens = 0
        self.start = self.last = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def update(self, lines: int, tokens: int) -> None:
        self.lines, self.tokens = self.lines + lines, self.tokens + tokens
        now = time.perf_counter()
        if self.enabled and now - self.last >= (0.5 if self.tty else 30.0):
            self.last = now
            self._print(now, end="\r" if self.tty else "\n")

    def close(self) -> None:
        if self.enabled:
            self._print(time.perf_counter(), end="\n")

    def _print(self, now: float, end: str) -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = self.tokens / elapsed
        eta = (self.total_tokens - self.tokens) / rate if rate > 0 else float("nan")
        print(
            f"{self.lines:,}/{self.total_lines:,} sentences  {self.lines / elapsed:,.1f} sentences/s  "
            f"{rate:,.0f} tokens/s  "
            f"{100 * self.tokens / self.total_tokens:5.1f}%  ETA {_clock(eta)}",
            end=end,
            file=sys.stderr,
            flush=True,
        )


def _clock(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _log_summary(summary: sentence_input.InputSummary, counts: dict, options: Options) -> None:
    logging.info(
        "embedded %d sentences (%d tokens) in %.1f s: %d batches, %d compiled shapes",
        counts["sentences"],
        counts["tokens"],
        counts["seconds"],
        counts["batches"],
        counts["compiled_shapes"],
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
