"""The end of `embed_file`: every process's spool into one HDF5 file in the `elmo`-command layout.

Process 0 reads the input once more, in line order, and for each line takes its pieces from the spool of
the process that embedded it (`file_embedding.owns`), has the output mode join them (`OutputMode.sentence`:
the token axis of a split sentence; the sums of `sentence_mean`, divided by the line's token count) and
writes the line's dataset
(`vectors_hdf5.VectorsWriter`). The file is written inside process 0's staging directory, and
`file_embedding` renames it onto the output when complete, so the output is the same file whatever the
number of processes, the batch size, the devices or the interruptions on the way.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable

import numpy as np

from elmo_jax.features.output_modes import OutputMode
from elmo_jax.files import sentence_input
from elmo_jax.formats import vector_spool
from elmo_jax.formats.vectors_hdf5 import VectorsWriter, size_bound


def write_output(
    shown: str,
    staging_dirs: list[str],
    summary: sentence_input.InputSummary,
    output: OutputMode,
    *,
    skip_blank: bool,
    sentence_index: bool,
    stop_point: Callable[[], object] = lambda: None,
) -> tuple[str, int]:
    """Writes the output file from the spools in `staging_dirs` (one per process) inside the first.

    Args:
      shown: how to name the output in errors (--output=...).
      staging_dirs: by process index.
      summary: `sentence_input.scan` of the input (its lines, size and SHA-256 are checked again).
      output: what the vectors are (`output_modes`).
      skip_blank: blank lines get no dataset (--blank_lines=skip) instead of an empty one.
      sentence_index: write sentence_to_index.
      stop_point: called before each line (`runtime.signals.StopSignals.check`: a stop raises there, and
        the unfinished file is removed).

    Returns:
      (the complete file, synced, to be renamed onto the output; the datasets written).
    """
    readers = [_reader(directory) for directory in staging_dirs]
    count = len(readers)
    staged = os.path.join(staging_dirs[0], vector_spool.OUTPUT)
    digest = hashlib.sha256()
    lines = 0
    spooled = sum(int(reader.table[:, 4].sum()) for reader in readers)  # the vectors take no more in the file
    bound = size_bound(spooled, summary.lines, summary.size)
    with VectorsWriter(
        staged, shown, float16=output.float16, sentence_index=sentence_index, size_bound=bound
    ) as writer:
        for line, tokens in sentence_input.lines(summary.path, digest):
            stop_point()
            lines += 1
            if not tokens:
                if not skip_blank:
                    writer.add(line, tokens, output.empty())
                continue
            pieces = readers[line % count].pieces(line)
            writer.add(line, tokens, _join(output, line, pieces, len(tokens)))
        if lines != summary.lines or digest.hexdigest() != summary.sha256:
            raise ValueError(f"--input={summary.path}: the file changed while it was read; embed it again")
        writer.commit()
    return staged, writer.datasets


def _reader(directory: str) -> vector_spool.SpoolReader:
    """The pieces a process's spool holds (it has synced them before the barrier that precedes this)."""
    table = []
    with open(os.path.join(directory, vector_spool.JOURNAL), "rb") as journal:
        for raw in journal:
            record = json.loads(raw)
            at = record["at"]
            for (line, offset, n), size in zip(record["pieces"], record["sizes"]):
                table.append((line, offset, n, at, size))
                at += size
    table = np.asarray(table, np.int64).reshape(-1, 5)
    table = table[np.lexsort((table[:, 1], table[:, 0]))]
    return vector_spool.SpoolReader(os.path.join(directory, vector_spool.VECTORS), table)


def _join(output: OutputMode, line: int, pieces, n_tokens: int) -> np.ndarray:
    """A line's vectors from its pieces' bytes in the spool."""
    if sum(n for _, n, _ in pieces) != n_tokens:
        raise RuntimeError(
            f"internal error: line {line + 1} has {n_tokens} tokens but the spool holds "
            f"{sum(n for _, n, _ in pieces)} of them"
        )
    arrays = [np.frombuffer(raw, output.batch_dtype).reshape(output.shape(n)) for _, n, raw in pieces]
    return output.sentence(arrays, n_tokens)
