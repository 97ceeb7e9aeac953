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

from absl import logging

from elmo_jax import storage

DIRECTORY = "tfds"  # copies go under $TMPDIR/elmo_jax_tfds/


def local_data_dir(builder) -> str:
    """A local TFDS data directory holding the prepared dataset of `builder`: its own data directory when
    local; for one in a bucket a local copy (see the module docstring). `tfds.builder(name,
    data_dir=<it>)` opens the same dataset there.

    Raises:
      ValueError: the builder's directory is not `<root>/<its full name>` (not a dataset TFDS prepared).
      FileNotFoundError: the dataset in the bucket lacks a shard its metadata lists.
      OSError: the download failed (nothing is left under the final name).
    """
    place, full_name = storage.absolute(builder.data_dir), builder.info.full_name
    if not place.endswith("/" + full_name):
        raise ValueError(f"{place}: expected the directory of the TFDS dataset {full_name} (ending in it)")
    _check_shards(builder, place, storage.listing(place))
    local = storage.mirror(place, DIRECTORY, under=full_name)
    if local != place:
        logging.info("reading the TFDS dataset %s from its local copy %s", place, local)
    return local[: -len(full_name) - 1]


def _check_shards(builder, remote: str, listing: dict) -> None:
    """Raises FileNotFoundError naming the first shard that `dataset_info.json` lists but the bucket lacks."""
    for split, info in builder.info.splits.items():
        for name in info.filenames:
            if name not in listing:
                raise FileNotFoundError(
                    f"{remote}: split {split!r} lacks its shard {name} (is an upload still running, or was it "
                    "cut short?)"
                )
