"""Embed a text file into an HDF5 file of ELMo vectors, in the layout of AllenNLP's `elmo` command.

    python -m elmo_jax.embed_file --model=MODEL_DIR --input=sentences.txt --output=vectors.hdf5
    python -m elmo_jax.embed_file --model=small --input=sentences.txt --output=vectors.hdf5   # published, by name
    python -m elmo_jax.embed_file --options=OPTIONS.json --weights=WEIGHTS.hdf5 --input=... --output=... \\
        [--layers=all|top|average|mix|sentence_mean] [--batch_tokens=4096] [--float16] [--devices=0,1]
    python -m elmo_jax.embed_file ... --coordinator_address=HOST0:1234 --num_processes=2 --process_id=0  # host 0

Input: one whitespace-tokenized sentence per line, UTF-8. Output: one dataset per line, named by its
0-based line index: (L+1, n, 2P) with --layers=all, (n, 2P) for top (the last LSTM layer), average (the
mean of the L+1 layers) and mix (gamma * sum_j softmax(s)_j * layer_j with --mix_scalars/--gamma),
(2P,) for sentence_mean (the mean over the line's tokens of that mix; without --mix_scalars the mix is
the average of the layers; zeros for a blank line); plus "sentence_to_index", a JSON object from each
sentence (its tokens joined by one space) to its dataset name, as AllenNLP writes it. --float16 stores
half-size vectors (relative error ~5e-4).

How it runs: the file is checked first (every line; errors name the line). Sentences are then streamed
and grouped by length and character-width bucket (`length_buckets`), so memory stays bounded by the
buckets, whatever the file's size, and XLA compiles one program per bucket that occurs (the count is
logged); every batch is split over all local devices (--devices to choose). With --model and a
vocab.txt in it, the vocabulary's words skip the char CNN (--token_cache=off to compute every token).
Finished vectors go to a staging directory next to --output, and the file is written from there and
renamed into place when complete: a crash or kill never leaves a truncated file under the target name,
and an existing file there is only ever replaced by a complete one. Stopped (SIGTERM, Ctrl-C,
`kill -9`), the same command continues from the sentences already done; a changed input or changed
arguments start over, saying why (--resume=false always starts over).

Several processes (hosts) each run the same command with the coordinator flags (or --distributed on a
TPU pod slice / SLURM, as train.py): each embeds every N-th line on its own devices, and process 0
writes the one output file, the same as a single process writes. --output must be on a file system
every process sees.

--model, --input and --output may be gs://BUCKET/PATH (the gcs extra, docs/CLOUD_STORAGE.md): a gs:// input is
downloaded first, a gs:// output is written on this machine (where a stopped run resumes) and uploaded
in one piece when complete; it takes one process (docs/CLOUD_STORAGE.md).
"""

from __future__ import annotations

from absl import flags

from elmo_jax import cli
from elmo_jax.features import output_modes
from elmo_jax.files import file_options, sentence_input

FLAGS = flags.FLAGS


def define_flags() -> None:
    cli.define_model_flags()
    flags.DEFINE_string("input", None, "Text file: one tokenized sentence per line.")
    flags.DEFINE_string("output", None, "The HDF5 file to write.")
    flags.DEFINE_enum("layers", "all", output_modes.NAMES, output_modes.LAYERS_HELP)
    flags.DEFINE_list("mix_scalars", None, output_modes.MIX_SCALARS_HELP)
    flags.DEFINE_float("gamma", 1.0, output_modes.GAMMA_HELP)
    flags.DEFINE_integer("batch_tokens", 4096, "Padded tokens per batch (rows x length bucket); bounds memory.")
    flags.DEFINE_bool("float16", False, "Store float16 vectors (half the size).")
    flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "Matmul precision.")
    flags.DEFINE_enum(
        "blank_lines",
        "empty",
        sentence_input.BLANK_LINE_POLICIES,
        "Blank lines: an empty (0-token) entry, no entry, or an error.",
    )
    flags.DEFINE_integer("max_sentence_tokens", 1024, "Longest sentence embedded whole.")
    flags.DEFINE_enum(
        "long_sentences",
        "error",
        sentence_input.LONG_SENTENCE_POLICIES,
        "A longer sentence: an error, or embedded in pieces of --max_sentence_tokens.",
    )
    flags.DEFINE_bool("bucketing", True, "Group sentences by length (false: batches in input order).")
    flags.DEFINE_bool("sentence_index", True, "Write the sentence_to_index dataset (holds every sentence).")
    flags.DEFINE_bool("progress", True, "Show a progress line on standard error.")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --output, if it is an elmo-command HDF5 file.")
    flags.DEFINE_list(
        "devices", None, "Local devices to split batches over (indices into jax.local_devices()); default all."
    )
    flags.DEFINE_enum(
        "token_cache",
        "auto",
        file_options.TOKEN_CACHE_MODES,
        "auto: with --model holding a vocab.txt, its words that occur in the input skip the char CNN; off: never.",
    )
    flags.DEFINE_bool("resume", True, "Continue a stopped run of the same command (false: start over).")
    cli.define_distributed_flags()


def check_flags() -> None:
    """The flags' mistakes that need no library: refused before anything is imported or read."""
    cli.require("input", "output")
    _options()


def run() -> dict:
    from elmo_jax.files.file_embedding import embed_model_file
    from elmo_jax.formats.model_source import ModelSource

    counts = embed_model_file(
        ModelSource(FLAGS.model, FLAGS.options, FLAGS.weights),
        FLAGS.input,
        FLAGS.output,
        _options(),
        cluster=cli.cluster(),
    )
    share = f" (process {counts['process']} of {counts['processes']})" if counts["processes"] > 1 else ""
    resumed = f", {counts['resumed_lines']:,} of them from the stopped run" if counts["resumed_lines"] else ""
    cut = counts["truncated_tokens"]
    cut = f" ({cut:,} of them cut to the model's byte limit: docs/ELMO.md, 'Long tokens')" if cut else ""
    print(
        f"wrote {FLAGS.output}{share}: {counts['sentences']:,} sentences{resumed}, {counts['tokens']:,} tokens{cut} in "
        f"{counts['seconds']:.1f} s ({counts['batches']} batches, {counts['compiled_shapes']} compiled shapes, "
        f"{counts['devices']} devices{', token cache' if counts['cached_types'] else ''})"
    )
    return counts


def _options():
    """The parsed flags as the pipeline's `file_options.Options`; a list flag that does not parse is named."""
    try:
        devices = None if not FLAGS.devices else tuple(int(d) for d in FLAGS.devices)
    except ValueError:
        raise ValueError(
            f"--devices: expected comma-separated device indices, found {','.join(FLAGS.devices)}"
        ) from None
    try:
        scalars = None if FLAGS.mix_scalars is None else tuple(float(x) for x in FLAGS.mix_scalars)
    except ValueError:
        raise ValueError(
            f"--mix_scalars: expected comma-separated numbers, found {','.join(FLAGS.mix_scalars)}"
        ) from None
    return file_options.Options(
        layers=FLAGS.layers,
        mix_scalars=scalars,
        gamma=FLAGS.gamma,
        batch_tokens=FLAGS.batch_tokens,
        float16=FLAGS.float16,
        compute_dtype=FLAGS.compute_dtype,
        blank_lines=FLAGS.blank_lines,
        max_sentence_tokens=FLAGS.max_sentence_tokens,
        long_sentences=FLAGS.long_sentences,
        bucketing=FLAGS.bucketing,
        sentence_index=FLAGS.sentence_index,
        progress=FLAGS.progress,
        overwrite=FLAGS.overwrite,
        devices=devices,
        token_cache=FLAGS.token_cache,
        resume=FLAGS.resume,
    )


def main(argv) -> None:
    # Another process of the run died: after the error line the process ends at once (JAX's shutdown
    # would wait 100 s for the dead process's heartbeat, then abort with a C++ stack trace).
    cli.run_main(run, argv, check=check_flags, fatal=_process_lost)


def _process_lost() -> tuple[type[BaseException], ...]:
    from elmo_jax.runtime.processes import ProcessLost  # imports JAX: only once the run has failed

    return (ProcessLost,)


def start() -> None:
    """The command: `elmo-embed-file` (pyproject.toml's [project.scripts]) and `python -m elmo_jax.embed_file`."""
    cli.start(main, define_flags)


if __name__ == "__main__":
    start()
