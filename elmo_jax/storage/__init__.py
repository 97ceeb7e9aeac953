"""Where bytes live: local paths and Cloud Storage URLs (`gs://bucket/path`), behind one set of operations
that say what the caller wants, not how.

The bottom layer of the package (docs/ARCHITECTURE.md): it imports nothing else of elmo_jax, and it is
the only place that tells a URL from a local path. Callers ask to

- read a place: `exists`, `isdir`, `listdir`, `glob`, `open_file`, `read_bytes`, `version`, `stat_many`,
  `local_copy` (a local file for a reader that needs one), `local_directory`, `mirror` (`places`, `local`);
- write a file whole (`write_file`, `write_bytes`, `write_text`) or publish a directory whole, the file
  its readers check last (`publish_directory`) (`publish`; locally `atomic`, whose docstring states the
  one policy: fsync, an existing target, a concurrent writer);
- work locally and publish there (`working_copy` for a file, `Workspace` for a directory of work) (`local`);
- take a lock on a directory (`PlaceLock`, `lock`);
- keep a log that only grows (`AppendLog`) and a directory of files in step with a place
  (`SyncedDirectory`) (`append_log`);
- keep a local directory a copy of another, copying what changed, new directories whole, touching
  nothing that is not its own (`sync_directory`, `check_copy_target`: a workdir copied to a mounted
  Google Drive) (`sync`);
- find the package's cache on this machine (`cache_home.cache_dir`) and keep the programs JAX compiled
  for the next process (`compile_cache.use`: the persistent compilation cache, local or gs://).

A Cloud Storage service that cannot be reached costs one retry cycle of its client, then every operation
on a `gs://` place fails at once naming it (`StorageUnreachable`); a caller that hands a place to another
library (orbax) runs that call in `reaching(place)` to have the same (`outage`).

What each guarantee becomes in a bucket (no rename, no append, no directories, no flock) is in
docs/CLOUD_STORAGE.md.
"""

from elmo_jax.storage import atomic
from elmo_jax.storage.append_log import AppendLog, SyncedDirectory, may_lag, read_lines
from elmo_jax.storage.local import (
    Workspace,
    download_tree,
    download_tree_whole,
    is_working_copy,
    local_copy,
    local_directory,
    mirror,
    working_copy,
)
from elmo_jax.storage.lock import PlaceLock
from elmo_jax.storage.outage import StorageUnreachable
from elmo_jax.storage.places import (
    absolute,
    ancestors,
    basename,
    creation_problem,
    dirname,
    epath,
    exists,
    expand_user,
    getsize,
    glob,
    has_magic,
    is_inside,
    is_location,
    isdir,
    isfile,
    join,
    lexists,
    listdir,
    listing,
    makedirs,
    open_file,
    reaching,
    read_bytes,
    real,
    remove,
    rename,
    rmtree,
    same_place,
    stat_many,
    version,
)
from elmo_jax.storage.publish import (
    is_unfinished_publish,
    publish_directory,
    upload_file,
    upload_tree,
    write_bytes,
    write_file,
    write_text,
)
from elmo_jax.storage.sync import SyncStats, check_copy_target, sync_directory

__all__ = [
    "AppendLog",
    "PlaceLock",
    "StorageUnreachable",
    "SyncStats",
    "SyncedDirectory",
    "Workspace",
    "absolute",
    "ancestors",
    "atomic",
    "basename",
    "check_copy_target",
    "creation_problem",
    "dirname",
    "download_tree",
    "download_tree_whole",
    "epath",
    "exists",
    "expand_user",
    "getsize",
    "glob",
    "has_magic",
    "is_inside",
    "is_location",
    "is_unfinished_publish",
    "is_working_copy",
    "isdir",
    "isfile",
    "join",
    "lexists",
    "listdir",
    "listing",
    "local_copy",
    "local_directory",
    "makedirs",
    "may_lag",
    "mirror",
    "open_file",
    "publish_directory",
    "read_bytes",
    "read_lines",
    "reaching",
    "real",
    "remove",
    "rename",
    "rmtree",
    "same_place",
    "stat_many",
    "sync_directory",
    "upload_file",
    "upload_tree",
    "version",
    "working_copy",
    "write_bytes",
    "write_file",
    "write_text",
]
