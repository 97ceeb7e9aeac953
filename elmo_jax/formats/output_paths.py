"""One rule for every output path a command writes, in one place: a command never replaces a file or
directory it did not create for that purpose.

- An existing output is refused unless `--overwrite`; even then, only when it is the same kind of
  artifact the command writes (`Artifact.recognizes`): an `elmo`-command HDF5 file for embed_file, a
  model directory whose manifest lists exactly its files for export, a vocabulary for vocab, an .npz
  of layers and mask for embed_text.
- An output inside a model directory or a training workdir is refused: it would change a model or a
  run that others read (a run writes into its own workdir through `allow_inside`).
- An output that is one of the command's inputs, also through links, or a directory holding one, is
  refused.
- The output's directory must exist and be writable.

Checking also removes what interrupted runs left staged for the same target (`storage.atomic`), saying so.

The same rules hold for outputs in Cloud Storage (`gs://bucket/path`, through `storage`): there the
"directory" of an output is its prefix, which needs no creation; the bucket must exist.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable

from absl import logging

from elmo_jax import storage
from elmo_jax.storage import atomic

MODEL_MANIFEST = "manifest.json"
MODEL_FORMAT = "elmo-jax model directory"  # the manifest's "format"


@dataclasses.dataclass(frozen=True)
class Artifact:
    """A kind of output.

    Attributes:
      name: what it is called in messages ("an elmo-command HDF5 file").
      is_directory: whether it is a directory.
      recognizes: path -> whether an existing path is one of these (what --overwrite may replace).
    """

    name: str
    is_directory: bool
    recognizes: Callable[[str], bool]


def check_output(
    path: str | os.PathLike,
    artifact: Artifact,
    *,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    flag: str = "--output",
    allow_inside: str | os.PathLike | None = None,
    remove_stale: bool = True,
) -> str:
    """Raises (naming `flag`, the path and what was expected) unless `artifact` may be written at `path`.

    Args:
      path: the output.
      artifact: what will be written there.
      overwrite: whether an existing output of the same kind may be replaced.
      inputs: the files the command reads; none may be the output or lie inside it.
      flag: the flag that named the path, for messages.
      allow_inside: a model directory or workdir the caller owns and may write into (training's export).
      remove_stale: remove what killed writers left staged for `path`; a resumable writer passes False,
        adopts what it can continue from (`vector_spool.adopt`), then calls
        `atomic.remove_stale_staging` itself.

    Returns:
      The absolute path.

    Raises:
      FileExistsError, IsADirectoryError, NotADirectoryError, FileNotFoundError, PermissionError,
      ValueError: the output may not be written; nothing has been touched.
    """
    target = storage.absolute(path)
    shown = f"{flag}={os.fspath(path)}"
    problem = storage.creation_problem(target)
    if problem is not None:
        raise type(problem)(f"{shown}: {problem}")
    exists = storage.lexists(target)
    if exists:
        _check_kind(target, shown, artifact)
    _check_not_an_input(target, shown, inputs)
    _check_not_inside_protected(target, shown, allow_inside)
    if exists:
        _check_replaceable(target, shown, artifact, overwrite)
    if remove_stale:
        atomic.remove_stale_staging(target, log=logging.warning)
    return target


def is_model_directory(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds an elmo-jax model manifest (it may be incomplete or altered)."""
    try:
        with storage.open_file(storage.join(directory, MODEL_MANIFEST), "r", encoding="utf-8") as f:
            return json.load(f).get("format") == MODEL_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def is_workdir(directory: str | os.PathLike) -> bool:
    """Whether `directory` is a training workdir (it holds checkpoints or training metrics)."""
    return storage.isdir(storage.join(directory, "checkpoints")) or storage.isfile(
        storage.join(directory, "metrics.jsonl")
    )


def _check_not_an_input(target: str, shown: str, inputs: Iterable[str | os.PathLike]) -> None:
    for source in map(os.fspath, inputs):
        if storage.same_place(source, target):
            raise ValueError(f"{shown} is the input {source}; writing there would destroy it")
        if storage.is_inside(source, target):
            raise ValueError(f"{shown} holds the input {source}; writing there would destroy it")


def _check_not_inside_protected(target: str, shown: str, allow_inside) -> None:
    allowed = None if allow_inside is None else storage.real(allow_inside)
    for directory in storage.ancestors(target):
        if directory == allowed:
            return
        for what, test in (("a model directory", is_model_directory), ("a training workdir", is_workdir)):
            if test(directory):
                raise ValueError(
                    f"{shown} is inside {directory}, {what}; writing there would change it for everything that "
                    "reads it. Choose a path outside it"
                )


def _check_kind(target: str, shown: str, artifact: Artifact) -> None:
    if artifact.is_directory and not storage.isdir(target):
        raise NotADirectoryError(f"{shown} is a file; expected {artifact.name} (a directory) or a new name")
    if not artifact.is_directory and storage.isdir(target):
        raise IsADirectoryError(f"{shown} is a directory; expected {artifact.name} (a file) or a new name")


def _check_replaceable(target: str, shown: str, artifact: Artifact, overwrite: bool) -> None:
    if not overwrite:
        raise FileExistsError(
            f"{shown} already exists; pass --overwrite to replace it (only {artifact.name} is ever replaced, and "
            "only once the new one is complete)"
        )
    if not artifact.recognizes(target):
        raise FileExistsError(
            f"{shown} exists and is not {artifact.name}; --overwrite replaces only what this command writes, "
            "never other files. Choose another path or move it away"
        )
