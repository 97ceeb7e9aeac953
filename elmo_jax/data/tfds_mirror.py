"""A TFDS dataset prepared in Cloud Storage (`tfds_data_dir=gs://...`), read from a local copy.

TFDS opens a `gs://` data directory itself (its metadata through `etils.epath`), and array_record 0.8.3
and later open `gs://` shards through google-cloud-cpp (`riegeli::GcsReader`; earlier releases open
local files only). But random access reads one record per request there (TFDS opens each shard with
`readahead_buffer_size:0` and a 32 KiB buffer): a network round trip per sentence, thousands per training
batch. So, as for the prepared corpora (`local_corpus`), every process reads a local copy: the dataset's
version directory (`<data_dir>/<name>/[<config>/]<version>/`) is downloaded once into

    $TMPDIR/elmo_jax_tfds/<hash of its URL>/<hash of its listing>/<name>/[<config>/]<version>/

The listing is every object's name, size and generation, read again (one request) at each open: a dataset
rewritten in the bucket is downloaded again, and the older copy removed. A copy is downloaded under a
staging name and renamed into place, so a killed download leaves nothing that looks complete; one that
lacks a shard its `dataset_info.json` lists (an upload still running, or cut short) is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

from absl import logging

from elmo_jax.formats import storage

DIRECTORY = "elmo_jax_tfds"


def local_data_dir(builder) -> str:
    """A local TFDS data directory holding a copy of the prepared dataset of `builder` (a TFDS builder
    whose `data_dir` is a URL): `tfds.builder(name, data_dir=<it>)` opens the same dataset there.

    Raises:
      ValueError: the builder's directory is not `<root>/<its full name>` (not a dataset TFDS prepared).
      FileNotFoundError: the dataset in the bucket lacks a shard its metadata lists.
      OSError: the download failed (nothing is left under the final name).
    """
    remote, full_name = storage.absolute(builder.data_dir), builder.info.full_name
    if not remote.endswith("/" + full_name):
        raise ValueError(f"{remote}: expected the directory of the TFDS dataset {full_name} (ending in it)")
    listing = storage.listing(remote)
    _check_shards(builder, remote, listing)
    url_key = hashlib.sha256(remote.encode("utf-8")).hexdigest()[:16]
    listing_key = hashlib.sha256(json.dumps(sorted(listing.items())).encode("utf-8")).hexdigest()[:16]
    mirrors = os.path.join(tempfile.gettempdir(), DIRECTORY, url_key)
    root = os.path.join(mirrors, listing_key)
    local = os.path.join(root, *full_name.split("/"))
    if not os.path.isdir(local):
        storage.download_tree_whole(remote, local)
        logging.info("downloaded the TFDS dataset %s to %s", remote, local)
        for older in set(os.listdir(mirrors)) - {listing_key}:  # copies of what the bucket held before
            shutil.rmtree(os.path.join(mirrors, older), ignore_errors=True)
    return root


def _check_shards(builder, remote: str, listing: dict) -> None:
    """Raises FileNotFoundError naming the first shard that `dataset_info.json` lists but the bucket lacks."""
    for split, info in builder.info.splits.items():
        for name in info.filenames:
            if name not in listing:
                raise FileNotFoundError(
                    f"{remote}: split {split!r} lacks its shard {name} (is an upload still running, or was it "
                    "cut short?)"
                )
