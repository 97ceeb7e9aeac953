"""Embed a text file into an HDF5 file of ELMo vectors, in the layout of AllenNLP's `elmo` command.

    python -m elmo_jax.embed_file --model=MODEL_DIR --input=sentences.txt --output=vectors.hdf5
    python -m elmo_jax.embed_file --options=OPTIONS.json --weights=WEIGHTS.hdf5 --input=... --output=... \\
        [--layers=all|top|average|mix] [--batch_tokens=4096] [--float16]

Input: one whitespace-tokenized sentence per line, UTF-8. Output: one dataset per line, named by its
0-based line index: (L+1, n, 2P) with --layers=all, (n, 2P) for top (the last LSTM layer), average (the
mean of the L+1 layers) and mix (gamma * sum_j softmax(s)_j * layer_j with --mix_scalars/--gamma);
plus "sentence_to_index", a JSON object from each sentence (its tokens joined by one space) to its
dataset name, as AllenNLP writes it. --float16 stores half-size vectors (relative error ~5e-4).

How it runs: the file is checked first (every line; errors name the line). Sentences are then streamed
and grouped by length and character-width bucket (`length_buckets`), so memory stays bounded by the
buckets, whatever the file's size, and XLA compiles one program per bucket that occurs (the count is
logged). The output is written to a temporary file next to --output and renamed when complete: a
crash or kill never leaves a truncated file under the target name, and an existing file there is
only ever replaced by a complete one. Each sentence starts from a zero LSTM state, so its vectors do
not depend on the file's order or the batch it lands in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags, logging

from elmo_jax.formats import atomic_write, model_dir
from elmo_jax.features import sentence_input
from elmo_jax.model.char_cnn import content_bucket

LAYER_MODES = ("all", "top", "average", "mix")
FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("model", None, "A model directory from python -m elmo_jax.export.")
    flags.DEFINE_string("options", None, "Instead of --model: a published-format options JSON (with --weights).")
    flags.DEFINE_string("weights", None, "Instead of --model: a published-format HDF5 weight file.")
    flags.DEFINE_string("input", None, "Text file: one tokenized sentence per line.")
    flags.DEFINE_string("output", None, "The HDF5 file to write.")
    flags.DEFINE_enum("layers", "all", LAYER_MODES, "all: (L+1, n, 2P) per sentence; top, average, mix: (n, 2P).")
    flags.DEFINE_list("mix_scalars", None, "--layers=mix: the L+1 mix scalars s_j (softmax-normalised), "
                      "e.g. a trained ScalarMix's; default all 0 (the average).")
    flags.DEFINE_float("gamma", 1.0, "--layers=mix: the scale gamma.")
    flags.DEFINE_integer("batch_tokens", 4096, "Padded tokens per batch (rows x length bucket); bounds memory.")
    flags.DEFINE_bool("float16", False, "Store float16 vectors (half the size).")
    flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "Matmul precision.")
    flags.DEFINE_enum("blank_lines", "empty", sentence_input.BLANK_LINE_POLICIES,
                      "Blank lines: an empty (0-token) entry, no entry, or an error.")
    flags.DEFINE_integer("max_sentence_tokens", 1024, "Longest sentence embedded whole.")
    flags.DEFINE_enum("long_sentences", "error", sentence_input.LONG_SENTENCE_POLICIES,
                      "A longer sentence: an error, or embedded in pieces of --max_sentence_tokens.")
    flags.DEFINE_bool("bucketing", True, "Group sentences by length (false: batches in input order).")
    flags.DEFINE_bool("sentence_index", True, "Write the sentence_to_index dataset (holds every sentence).")
    flags.DEFINE_bool("progress", True, "Show a progress line on standard error.")


@dataclasses.dataclass
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


def embed_file(params, input_path: str, output_path: str, options: Options = Options(), *,
               summary: sentence_input.InputSummary | None = None) -> dict:
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

    check_output_path(output_path)
    if os.path.exists(output_path) and os.path.exists(input_path) and os.path.samefile(input_path, output_path):
        raise ValueError(f"--output={output_path} is the --input file; writing there would destroy the input")
    mix = _mix_weights(options, params.config.n_output_layers)
    summary = summary or sentence_input.scan(input_path, blank_lines=options.blank_lines,
                                             max_tokens=options.max_sentence_tokens,
                                             long_sentences=options.long_sentences)
    C = params.config.max_characters_per_token
    batcher = (length_buckets.BucketBatcher(options.batch_tokens, C) if options.bucketing
               else length_buckets.InputOrderBatcher(options.batch_tokens, C))
    progress = _Progress(summary.lines - summary.blank, summary.tokens, enabled=options.progress)
    start, shapes, batches = time.perf_counter(), set(), 0
    with _OutputFile(output_path, params.config, options) as output:
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
            raise ValueError(f"--input={input_path}: {output.lines_read:,} lines now, {summary.lines:,} when it was "
                             "checked; the file changed while it was read")
        output.commit()
    progress.close()
    counts = {"lines": summary.lines, "sentences": output.datasets, "tokens": summary.tokens,
              "blank_lines": summary.blank, "split_lines": summary.long, "batches": batches,
              "compiled_shapes": len(shapes), "seconds": time.perf_counter() - start}
    _log_summary(summary, counts, options)
    return counts


def check_output_path(path: str) -> None:
    """Raises (naming --output) unless a new file can be created at `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(f"--output={path}: is a directory, expected an .hdf5 file name")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"--output={path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"--output={path}: directory {directory} is not writable")


def _batches(input_path, batcher, output, max_tokens: int, blank_lines: str, C: int):
    """Streams the file into the batcher; creates each line's dataset as it goes."""
    from elmo_jax.model.chars import tokens_to_raw_ids
    from elmo_jax.features.length_buckets import Piece

    for line, tokens in sentence_input.lines(input_path):
        output.lines_read += 1
        if not tokens and blank_lines == "skip":
            continue
        output.create(line, tokens)
        if not tokens:
            continue  # an empty entry needs no compute
        for offset in range(0, len(tokens), max_tokens):
            piece = tokens[offset:offset + max_tokens]
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


class _OutputFile:
    """The HDF5 output, written under a temporary name and renamed by `commit`."""

    def __init__(self, path: str, config, options: Options):
        self.path, self.options = path, options
        self.layers, self.dim = config.n_output_layers, config.output_dim
        self.dtype = np.float16 if options.float16 else np.float32
        self.index: dict[str, str] = {}
        self.datasets = self.lines_read = 0
        self._remaining: dict[int, int] = {}  # line -> tokens still to write
        self.tmp = None

    def __enter__(self):
        import h5py

        fd, self.tmp = atomic_write.temporary_file(self.path)
        os.close(fd)
        try:
            with self._writing():
                self.h5 = h5py.File(self.tmp, "w")
        except BaseException:
            os.unlink(self.tmp)
            raise
        return self

    def __exit__(self, kind, value, traceback):
        if self.tmp is not None:  # not committed: remove what was written, whatever closing says
            try:
                self.h5.close()
            except Exception:  # a full disk fails the close too; the file goes anyway
                pass
            finally:
                os.unlink(self.tmp)

    @contextlib.contextmanager
    def _writing(self):
        """h5py reports a full disk or a locked file as RuntimeError/OSError naming the temporary file."""
        try:
            yield
        except (RuntimeError, OSError) as e:
            raise OSError(f"--output={self.path}: writing the HDF5 file failed ({e}); nothing was left under "
                          "that name") from None

    def create(self, line: int, tokens: list[str]) -> None:
        n = len(tokens)
        shape = (self.layers, n, self.dim) if self.options.layers == "all" else (n, self.dim)
        with self._writing():
            self.h5.create_dataset(str(line), shape=shape, dtype=self.dtype)
        self.datasets += 1
        if n:
            self._remaining[line] = n
        if self.options.sentence_index:
            self.index[" ".join(tokens)] = str(line)

    def write_batch(self, batch, result) -> tuple[int, int]:
        """Writes each row's vectors into its line's dataset; returns (lines completed, tokens written)."""
        vectors = np.asarray(result)  # waits for the device
        done = tokens = 0
        for row, piece in enumerate(batch.pieces):
            n = piece.n_tokens
            with self._writing():
                dataset = self.h5[str(piece.line)]
                if self.options.layers == "all":
                    dataset[:, piece.offset:piece.offset + n] = vectors[row, :, :n]
                else:
                    dataset[piece.offset:piece.offset + n] = vectors[row, :n]
            self._remaining[piece.line] -= n
            if self._remaining[piece.line] == 0:
                del self._remaining[piece.line]
                done += 1
            tokens += n
        return done, tokens

    def commit(self) -> None:
        import h5py

        if self._remaining:  # cannot happen unless the batching loses a piece: never commit such a file
            raise RuntimeError(f"internal error: lines never embedded: {sorted(self._remaining)[:5]}")
        with self._writing():
            if self.options.sentence_index:
                index = self.h5.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())
                index[0] = json.dumps(self.index)
            self.h5.close()
            with open(self.tmp, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(self.tmp, atomic_write.new_file_mode())
        os.replace(self.tmp, self.path)
        self.tmp = None


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
        print(f"{self.lines:,}/{self.total_lines:,} sentences  {self.lines / elapsed:,.1f} sentences/s  {rate:,.0f} tokens/s  "
              f"{100 * self.tokens / self.total_tokens:5.1f}%  ETA {_clock(eta)}", end=end, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _log_summary(summary: sentence_input.InputSummary, counts: dict, options: Options) -> None:
    logging.info("embedded %d sentences (%d tokens) in %.1f s: %d batches, %d compiled shapes",
                 counts["sentences"], counts["tokens"], counts["seconds"], counts["batches"], counts["compiled_shapes"])
    if summary.blank:
        how = {"empty": "written as empty (0-token) entries", "skip": "skipped (no entry)"}[options.blank_lines]
        logging.warning("%d blank lines %s, first at line %s", summary.blank, how,
                        ", ".join(map(str, summary.first_blank)))
    if summary.long:
        logging.warning("%d sentences over %d tokens embedded in pieces (each piece without the others' "
                        "context), first at line %s", summary.long, options.max_sentence_tokens,
                        ", ".join(map(str, summary.first_long)))


def run() -> dict:
    for name in ("input", "output"):
        if not getattr(FLAGS, name):
            raise ValueError(f"--{name} is required")
    try:
        scalars = None if FLAGS.mix_scalars is None else tuple(float(x) for x in FLAGS.mix_scalars)
    except ValueError:
        raise ValueError(f"--mix_scalars: expected comma-separated numbers, found {','.join(FLAGS.mix_scalars)}") \
            from None
    options = Options(layers=FLAGS.layers, mix_scalars=scalars, gamma=FLAGS.gamma, batch_tokens=FLAGS.batch_tokens,
                      float16=FLAGS.float16, compute_dtype=FLAGS.compute_dtype, blank_lines=FLAGS.blank_lines,
                      max_sentence_tokens=FLAGS.max_sentence_tokens, long_sentences=FLAGS.long_sentences,
                      bucketing=FLAGS.bucketing, sentence_index=FLAGS.sentence_index, progress=FLAGS.progress)
    if options.batch_tokens < 1:
        raise ValueError(f"--batch_tokens must be positive, found {options.batch_tokens}")
    # Everything that can be checked cheaply is, before the model is loaded.
    check_output_path(FLAGS.output)
    summary = sentence_input.scan(FLAGS.input, blank_lines=options.blank_lines,
                                  max_tokens=options.max_sentence_tokens, long_sentences=options.long_sentences)
    params = model_dir.load_model(FLAGS.model, FLAGS.options, FLAGS.weights)
    counts = embed_file(params, FLAGS.input, FLAGS.output, options, summary=summary)
    print(f"wrote {FLAGS.output}: {counts['sentences']:,} sentences, {counts['tokens']:,} tokens in "
          f"{counts['seconds']:.1f} s ({counts['batches']} batches, {counts['compiled_shapes']} compiled shapes)")
    return counts


def main(argv) -> None:
    from elmo_jax import cli

    cli.run_main(run, argv)


if __name__ == "__main__":
    define_flags()
    app.run(main)
