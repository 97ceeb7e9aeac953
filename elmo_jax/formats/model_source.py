"""What a command's --model names: a model directory, a published model by name, or (with --options and
--weights instead) an options JSON + HDF5 pair. One function, `load_model`, for every command that
takes --model, and `ModelSource`, the three flags as one value that the library's entry points take.

A path that exists is always a path: `--model=small` is the published small model unless a file or
directory called `small` is where the command runs.

Importing this module imports no JAX (the model's modules are imported where a model is read): a command
checks its model flags with `check_model_flags` before it imports its libraries (`cli.run_main`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from elmo_jax import storage
from elmo_jax.formats.published_models import is_published_name, names_text

if TYPE_CHECKING:
    from elmo_jax.model.params import BiLMParams


def names_published_model(source: str) -> bool:
    """Whether `source` (a --model, an `init_from`) names a published model rather than a place: one of
    the published names, with no file or directory of that name where the command runs (a path that
    exists is always a path, and a URL always a place). The one rule every reader of such a string
    follows."""
    return not storage.is_location(source) and is_published_name(source)


def model_directory(model: str, *, flag: str = "--model") -> str:
    """The model directory `model` names: itself if it exists, else the cached published model of that
    name (downloaded first if needed, `pretrained.fetch`); for an ELMoForManyLangs model directory, its
    conversion in the cache (`efml.efml_model_dir`, converted the first time).

    Raises:
      FileNotFoundError: neither a path nor a published name.
      OSError, ValueError: the published model cannot be downloaded or checked (`pretrained.fetch`).
    """
    if names_published_model(model):
        from elmo_jax.formats import pretrained

        return pretrained.fetch(model)
    if not storage.is_location(model):
        raise FileNotFoundError(
            f"{flag}={model}: no such model directory, and not a published model name ({names_text()})"
        )
    if not storage.exists(model):  # a URL with nothing under it, a dangling link
        raise FileNotFoundError(f"{flag}={model}: no such model directory")
    from elmo_jax.formats import efml  # imports JAX: the model is about to be read anyway

    return efml.efml_model_dir(model) if efml.is_efml_dir(model) else model


def check_model_flags(model: str | None, options_file: str | None, weight_file: str | None) -> None:
    """Raises ValueError unless exactly one model is named: --model, or --options and --weights together
    (the flags' values; nothing is read)."""
    if bool(model) == bool(options_file or weight_file):
        raise ValueError(
            f"pass either --model=MODEL_DIR (or a published model: {names_text()}), or --options=FILE --weights=FILE"
        )
    if not model and not (options_file and weight_file):
        raise ValueError("--options and --weights go together")


def load_model(
    model: str | None, options_file: str | None, weight_file: str | None, *, flag: str = "--model"
) -> BiLMParams:
    """The biLM named by a command's --model (a model directory or a published name) or by its
    --options/--weights (an HDF5 pair). `flag` is how an error names `model` (a library caller's own
    argument name instead of the command's flag).

    Raises:
      ValueError: both or neither given, or only one of --options/--weights; a model that is not valid.
      FileNotFoundError, OSError: as `model_directory` and `model_dir.load`.
    """
    check_model_flags(model, options_file, weight_file)
    from elmo_jax.formats import model_dir, pretrained

    if model:
        if names_published_model(model):
            return pretrained.load(model)  # says how to remove a damaged cached copy
        return model_dir.load(model_directory(model, flag=flag))
    from elmo_jax.formats.weights_hdf5 import load_hdf5

    return load_hdf5(options_file, weight_file)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A command's --model, or its --options and --weights (the flags `cli.define_model_flags` defines)."""

    model: str | None = None
    options_file: str | None = None
    weight_file: str | None = None

    @property
    def paths(self) -> list[str]:
        """The paths given: inputs, which no output of the command may replace."""
        return [p for p in (self.model, self.options_file, self.weight_file) if p]

    def load(self, *, flag: str = "--model") -> BiLMParams:
        """The biLM (`load_model`; `flag` names `model` in its errors)."""
        return load_model(self.model, self.options_file, self.weight_file, flag=flag)

    def vocabulary_file(self) -> str | None:
        """The vocabulary of --model when it is a path to a model directory that holds one (a training
        run's export, `model_dir.VOCAB`); None for a published name or an HDF5 pair."""
        if not self.model:
            return None
        from elmo_jax.formats import model_dir

        path = storage.join(self.model, model_dir.VOCAB)
        return path if storage.isfile(path) else None
