"""The published ELMo models by name: downloaded once into a cache and kept there as model directories.

    params = load("small")        # the first call downloads, checks and converts; later ones read the cache
    path = fetch("small")         # the model directory (for --model=PATH, or a copy elsewhere)

The cache (`cache_dir()`: $ELMO_JAX_CACHE, else $XDG_CACHE_HOME/elmo_jax, else ~/.cache/elmo_jax):

    CACHE/
      models/NAME/           a model directory (`formats.model_dir`): options, weights, params.npz,
                             extractor.jax, USAGE.md, manifest.json with every file's SHA-256
                             (NAME is "efml-LANG" for efml:LANG: no colon in a file name on Windows)
      downloads/NAME/        the published files while they download (FILE.part) and convert (an EFML
                             archive unpacked in unpacked/)
      known_files.json       size and SHA-256 of each published file the first time it was downloaded

What is checked: each file's size and SHA-256 against the published checksum where there is one
(`published_models`), else against `known_files.json` (trust on first use: the first download is
recorded, every later one must match); then the pair structurally (`load_hdf5`: every dataset against
the options, and the options against the model's published shape), or an ELMoForManyLangs archive
(`efml:LANG`) unpacked in its download folder and read by the EFML reader. Downloads resume where a broken
connection left them (`formats.download`). A model directory appears under `models/` complete or not at
all, and the downloads are removed once it is written. Two processes fetching the same model take turns
(`download.locked` on a lock file in its download folder). Nothing is requested for a model already in
the cache.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import zipfile

from elmo_jax.formats import download, efml, model_dir
from elmo_jax.formats.output_paths import is_model_directory
from elmo_jax.formats.published_models import (
    EfmlModel,
    PublishedFile,
    PublishedModel,
    find,
    mirror_url,
)
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.params import BiLMParams
from elmo_jax.storage import atomic
from elmo_jax.storage.cache_home import CACHE_VARIABLE, cache_dir  # where published models are kept

KNOWN_FILES = "known_files.json"


class PretrainedError(download.DownloadError):
    """A published model could not be made available; one line naming the address, the cache path and
    how to place the files by hand."""


def model_path(name: str, cache: str | None = None) -> str:
    """The model directory `fetch(name)` makes (it may not exist yet; nothing is downloaded)."""
    return os.path.join(cache or cache_dir(), "models", find(name).cache_name)


def fetch(name: str, *, cache: str | None = None, progress: bool = True) -> str:
    """The model directory of the published model `name`, downloaded and converted first if the cache
    does not hold it yet.

    Args:
      name: "small", "medium", "original", "original-5.5b", "pubmed", or "efml:LANG" (ELMoForManyLangs;
        `published_models.MODELS`).
      cache: the cache directory (default `cache_dir()`).
      progress: report the download on standard error.

    Raises:
      ValueError: unknown name, a malformed $ELMO_JAX_MODELS_URL (before anything is created or
        requested), or the downloaded files are not the model they should be.
      PretrainedError (an OSError): the download failed, or a file does not match its checksum; the
        message names the address and the path, and says what to do for the kind of failure: for the
        network (retried first) or the server, how to place the files by hand; for the disk (never
        retried; a part on a full disk is deleted), the space wanted and free, and $ELMO_JAX_CACHE.
    """
    model = find(name)
    root = os.path.abspath(cache or cache_dir())
    target = os.path.join(root, "models", model.cache_name)
    if is_model_directory(target):
        return target  # already converted: no request (model_dir.load checks every file)
    for file in model.files:  # a malformed $ELMO_JAX_MODELS_URL fails here, before anything is created or tried
        mirror_url(file.host)
    downloads = os.path.join(root, "downloads", model.cache_name)
    try:
        os.makedirs(downloads, exist_ok=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
    except OSError as e:
        raise PretrainedError(f"cannot create the model cache {root} ({e.strerror}); set ${CACHE_VARIABLE}") from None
    with download.locked(os.path.join(downloads, ".lock")):
        if is_model_directory(target):  # another process converted it while this one waited
            return target
        if os.path.lexists(target):
            raise PretrainedError(f"{target} exists but is not a model directory; remove it and try again")
        files = [_available(model, f, downloads, root, progress) for f in model.files]
        source = f"published model {model.name!r}: " + ", ".join(f"{f.url()} (SHA-256 {d})" for f, _, _, d in files)
        if isinstance(model, EfmlModel):
            _convert_efml(model, files[0], downloads, target, source)
        else:
            model_dir.write_model_dir(_check_structure(model, *files), target, source=source)
        _record(root, model, files)
        shutil.rmtree(downloads, ignore_errors=True)  # the model directory holds everything now
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(downloads))  # when no other model is downloading
    return target


def load(name: str, *, cache: str | None = None, progress: bool = True, verify: bool = True) -> BiLMParams:
    """The published model `name` ready for `embed`: `model_dir.load(fetch(name))`.

    Args:
      name: see `fetch`.
      cache: the cache directory (default `cache_dir()`).
      progress: report a download on standard error.
      verify: check every cached file's SHA-256 against the model directory's manifest.

    Raises:
      as `fetch`; and ValueError / FileNotFoundError when the cached model directory is damaged (the
      message says to remove it, so the next call downloads it again).
    """
    path = fetch(name, cache=cache, progress=progress)
    try:
        return model_dir.load(path, verify=verify)
    except (ValueError, FileNotFoundError) as e:
        raise type(e)(f"{e} (a damaged cached model: remove {path} and it is downloaded again)") from None


def _available(model: PublishedModel | EfmlModel, file: PublishedFile, downloads: str, root: str, progress: bool):
    """(file, path, size, SHA-256) of one published file in the download folder: a copy placed there by
    hand is checked, otherwise it is downloaded (resuming a `.part`)."""
    path = os.path.join(downloads, file.name)
    expected_bytes, expected_sha256, source = _expected(root, file)
    if os.path.exists(path):
        size, digest = os.path.getsize(path), download.sha256_of(path)
        if (expected_bytes not in (None, size)) or (expected_sha256 not in (None, digest)):
            raise PretrainedError(
                f"{path}: {size:,} bytes with SHA-256 {digest}, expected {expected_bytes} bytes with SHA-256 "
                f"{expected_sha256} ({source}); remove it to download {file.url()} again"
            )
        return file, path, size, digest
    report = download.Report(f"{model.name}: {file.name}") if progress else None
    try:
        size, digest = download.download(
            file.url(),
            path,
            expected_bytes=expected_bytes,
            expected_sha256=expected_sha256,
            checksum_source=source,
            progress=report,
            waiting=report.waiting if report else None,
        )
    except download.DiskError as e:  # not retried, and no use placing files by hand on the same disk
        raise PretrainedError(f"{e}. Free space there, or set ${CACHE_VARIABLE} to a cache on another disk") from None
    except download.DownloadError as e:
        offline = isinstance(e, download.NetworkError)
        raise PretrainedError(f"{e}. {_by_hand(model, downloads, offline=offline)}") from None
    return file, path, size, digest


def _by_hand(model: PublishedModel | EfmlModel, downloads: str, offline: bool) -> str:
    """How to place a model's files by hand, for error messages (`offline`: the network failed)."""
    urls = " and ".join(f.published_url for f in model.files)  # the published addresses, whatever the mirror
    variable = model.files[0].host.variable
    mirror = os.environ.get(variable)
    where = (
        f"The address comes from ${variable}={mirror!r}; unset it for the published files, or "
        if mirror
        else f"${variable} names a mirror. Or "
    )
    return (
        f"{'Offline or behind a proxy? ' if offline else ''}{where}download {urls} by any means into "
        f"{downloads}/ (same file names) and call again; they are checked and converted there "
        f"(${CACHE_VARIABLE} names another cache)"
    )


def _expected(root: str, file: PublishedFile) -> tuple[int | None, str | None, str]:
    """(bytes, SHA-256, where they come from) that `file` must have: published, recorded, or unknown."""
    if file.sha256 is not None:
        return file.bytes, file.sha256, file.checksum_source
    known = _read_known(root).get(file.path)
    if known:
        return known["bytes"], known["sha256"], _recorded_source(root, file, known)
    return file.bytes, None, "no published checksum; this download's is recorded"


def _recorded_source(root: str, file: PublishedFile, known: dict) -> str:
    """Where a recorded size and SHA-256 come from, and what to do when a file does not match them: no
    checksum was published for it, so the record may be the damaged one (trust on first use)."""
    return (
        f"recorded at its first download, {known.get('recorded', '?')}, from {known.get('url', '?')}; no "
        f"checksum is published for it, so either that first download or this file is damaged. If this file "
        f"is the right one (from a source you trust), delete the entry {file.path!r} from "
        f"{os.path.join(root, KNOWN_FILES)} (or the whole file: it holds only such records) and it is "
        "recorded afresh"
    )


def _check_structure(model: PublishedModel, options, weights) -> BiLMParams:
    """The pair loaded and checked dataset by dataset; a pair that is not the model is deleted."""
    from elmo_jax.formats.weights_hdf5 import load_hdf5  # h5py

    (_, options_path, *_), (_, weights_path, *_) = options, weights
    try:
        params = load_hdf5(options_path, weights_path)
        if model.preset is not None:
            shape = BiLMConfig.preset(model.preset)
            found = params.config
            if (found.lstm_dim, found.projection_dim, found.n_highway, found.filters) != (
                shape.lstm_dim,
                shape.projection_dim,
                shape.n_highway,
                shape.filters,
            ):
                raise ValueError(f"{options_path}: does not describe the published {model.preset} shape")
    except (ValueError, OSError) as e:
        for path in (options_path, weights_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        raise ValueError(f"published model {model.name!r}: {e}; the downloaded files were deleted") from None
    return params


def _convert_efml(model: EfmlModel, archive, downloads: str, target: str, source: str) -> None:
    """Unpacks the downloaded archive into the download folder and converts the EFML model directory in
    it into the model directory `target`. After a failure nothing unpacked is left (on a full disk it holds
    the space that is missing), and an archive that is not the model is deleted too."""
    _, archive_path, *_ = archive
    unpacked = os.path.join(downloads, "unpacked")
    try:
        params = efml.read_efml(_unpack_efml(archive_path, unpacked))
    except (ValueError, FileNotFoundError) as e:  # not the model
        shutil.rmtree(unpacked, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(archive_path)
        raise ValueError(f"published model {model.name!r}: {e}; the downloaded archive was deleted") from None
    except BaseException:  # the disk (PretrainedError), an interruption: the archive is kept for the next try
        shutil.rmtree(unpacked, ignore_errors=True)
        raise
    model_dir.write_model_dir(params, target, source=source)


def _unpack_efml(archive_path: str, unpacked: str) -> str:
    """The EFML model directory in the zip archive `archive_path`, unpacked into `unpacked` (at its top,
    or in the one folder that holds config.json). zipfile keeps every member inside `unpacked` (a name's
    leading "/" and its ".." parts are dropped).

    Raises:
      ValueError: not a zip archive, or no folder in it holds an EFML model's files.
      PretrainedError: the files cannot be written (a full cache disk).
    """
    shutil.rmtree(unpacked, ignore_errors=True)
    try:
        with zipfile.ZipFile(archive_path) as archive:
            archive.extractall(unpacked)
    except zipfile.BadZipFile as e:
        raise ValueError(f"{archive_path} is not a zip archive ({e})") from None
    except OSError as e:
        raise PretrainedError(
            f"cannot unpack {archive_path} into {unpacked} ({e.strerror or e}); free space there, or set "
            f"${CACHE_VARIABLE} to a cache on another disk"
        ) from None
    found = sorted(folder for folder, _, names in os.walk(unpacked) if "config.json" in names)
    if len(found) != 1 or not all(os.path.isfile(os.path.join(found[0], f)) for f in efml.FILES):
        raise ValueError(
            f"{archive_path} does not hold one ELMoForManyLangs model directory (expected {', '.join(efml.FILES)} "
            f"together; found config.json in {len(found)} folders)"
        )
    return found[0]


def _record(root: str, model: PublishedModel | EfmlModel, files) -> None:
    """Adds the size and SHA-256 of files with no published checksum to known_files.json (first use)."""
    new = {
        file.path: {"bytes": size, "sha256": digest, "url": file.url(), "recorded": _now()}
        for file, _, size, digest in files
        if file.sha256 is None
    }
    if not new:
        return
    with download.locked(os.path.join(root, ".known_files.lock")):
        known = _read_known(root)
        new = {k: v for k, v in new.items() if k not in known}
        if new:
            text = json.dumps({**known, **new}, indent=2, sort_keys=True) + "\n"
            atomic.write_text(os.path.join(root, KNOWN_FILES), text)


def _read_known(root: str) -> dict:
    path = os.path.join(root, KNOWN_FILES)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f)
        if isinstance(known, dict) and all(
            isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
            for v in known.values()
        ):
            return known
    except (OSError, ValueError):
        pass
    raise PretrainedError(
        f"{path}: not a record of published files (expected JSON: path -> bytes, sha256); remove it to "
        "record the next downloads afresh"
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
