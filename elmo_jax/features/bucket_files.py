"""`embed_file` with its input or output in Cloud Storage (`gs://...`).

HDF5 (h5py) writes only local files, and the spool of finished vectors is many small appends, which an
object store cannot take; so the work happens on local disk and only whole files cross the network:

- a gs:// input is downloaded to a local temporary file first (the spool's identity is the input's size
  and SHA-256, not its name, so a resumed run still matches);
- a gs:// output is written to a local file of this machine, `local_output(url)`, with the usual staging
  and spool next to it (so a stopped run resumes on the same machine), and uploaded when complete: one
  upload, which Cloud Storage makes visible complete or not at all; the local file is then removed.

The output rules (`output_paths.check_output`) are checked on the URL itself. With several processes the
spools must be on a file system every process sees (process 0 reads them all to write the file), which a
bucket is not and each host's temporary directory is not, so a gs:// output takes one process
(docs/CLOUD_STORAGE.md says what supporting more would take).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile

from absl import logging

from elmo_jax.formats import storage


def local_output(url: str) -> str:
    """Where this machine writes (and a stopped run keeps) the local copy of the output `url`."""
    key = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "elmo_jax_outputs", key, storage.basename(url))


def embed_file_in_bucket(params, input_path: str, output_path: str, options, *, summary=None, vocabulary=None) -> dict:
    """`file_embedding.embed_file` for a gs:// input or output (see the module docstring)."""
    from elmo_jax.features import processes
    from elmo_jax.features.file_embedding import check_output_path, embed_file

    if storage.is_remote(output_path):
        if processes.share()[1] > 1:
            raise ValueError(
                f"--output={output_path}: with several processes the output must be on a file system every "
                "process sees (process 0 reads every process's spool, which a bucket cannot hold; "
                "docs/CLOUD_STORAGE.md); write it there, then upload it, or run one process"
            )
        check_output_path(output_path, options.overwrite, inputs=[input_path], remove_stale=False)
    with storage.local_copy(input_path) as local_input:
        if local_input != input_path:
            summary = None  # scanned again from the local copy (the same bytes: the same identity)
        if not storage.is_remote(output_path):
            return embed_file(params, local_input, output_path, options, summary=summary, vocabulary=vocabulary)
        local = local_output(output_path)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        # The local file is this command's own (a completed one not yet uploaded is replaced).
        mine = dataclasses.replace(options, overwrite=True)
        counts = embed_file(params, local_input, local, mine, summary=summary, vocabulary=vocabulary)
        storage.upload_file(local, output_path)
        os.unlink(local)
        logging.info("uploaded %s to %s", local, output_path)
    return counts
