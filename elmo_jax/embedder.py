"""`Embedder`: AllenNLP's `ElmoEmbedder` in elmo-jax, one object that holds a model and its compiled programs.

    from elmo_jax import Embedder       # was: from allennlp.commands.elmo import ElmoEmbedder
    elmo = Embedder()                   # was: elmo = ElmoEmbedder()   (the original model)
    vectors = elmo.embed_sentence(["I", "ate", "an", "apple", "."])   # float32 (3, 5, 1024)

The same names, arguments and outputs as AllenNLP's class, so that changing the import is the switch:

    AllenNLP's ElmoEmbedder                          elmo_jax.Embedder
    ElmoEmbedder()                                   Embedder()  (or Embedder("original"))
    ElmoEmbedder(options_file, weight_file)          Embedder(options_file, weight_file)
    ElmoEmbedder(options_file=o, weight_file=w)      Embedder(options_file=o, weight_file=w)
    -                                                Embedder("small"), Embedder("path/to/model_dir")
    ElmoEmbedder(..., cuda_device=0)                 Embedder(..., cuda_device=0): jax.local_devices()[0]
    elmo.embed_sentence(tokens)                      elmo.embed_sentence(tokens): (3, n, 1024) float32
    elmo.embed_batch(list_of_tokens)                 elmo.embed_batch(...): a list of (3, n, 1024)
    elmo.embed_sentences(iterable, batch_size)       elmo.embed_sentences(iterable): a generator, in order
    elmo.batch_to_embeddings(batch)                  elmo.batch_to_embeddings(batch): NumPy (B, 3, T, 1024), (B, T)
    elmo.embed_file(input_file, output_file_path,    elmo.embed_file(input_file, output_file_path,
        output_format, batch_size,                       output_format, forget_sentences=..., **options)
        forget_sentences, use_sentence_keys)

It is ELMoForManyLangs' `Embedder` too (`from elmoformanylangs import Embedder` -> `from elmo_jax import
Embedder`, docs/MANY_LANGUAGES.md): `Embedder(efml_model_dir)` reads its directory (converted once into
the cache) and `sents2elmo(sents, output_layer=-1)` answers as its does (-1 the average of the layers,
-2 all of them, 0, 1, 2 one layer).

A model is what `formats.model_source` says a command's --model is: a published name (downloaded once,
docs/PRETRAINED.md), a model directory, or an options JSON + HDF5 pair; `params=` takes one already
loaded (`load_hdf5`, `init_params`, a training run's export). Sentences go through one
`SentenceEmbedder` kept for the object's life (packed rows on every local device, `sentences`), whose
programs live at module level: a second call compiles nothing for shapes already run.

Differences from AllenNLP's class, each on purpose:
- Stateless: every sentence starts from a zero LSTM state, so its vectors never depend on what was
  embedded before. AllenNLP's `ElmoEmbedder` carries each batch row's state into the next batch (its
  vectors drift with the history); its first batch on a fresh model is what this returns every time.
- NumPy arrays everywhere (`batch_to_embeddings` too), float32; an empty sentence gets (3, 0, 1024).
- Batches are sized in tokens (`batch_tokens`), not sentences: `batch_size` is accepted for
  AllenNLP's signature and has no effect.
- `embed_file` is `elmo_jax.embed_file` (python -m elmo_jax.embed_file): an input path (or an open file
  of one), an output written whole or not at all, every line checked first; dataset keys are line
  indices (`use_sentence_keys=True` is refused), `output_format` also takes "mix" and "sentence_mean".
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from elmo_jax.features.embed import embed
from elmo_jax.features.output_modes import efml_output_layer
from elmo_jax.features.sentences import DEFAULT_WINDOW, SentenceEmbedder
from elmo_jax.files.file_embedding import embed_file as embed_text_file
from elmo_jax.files.file_options import Options
from elmo_jax.formats.model_source import ModelSource
from elmo_jax.model.params import BiLMParams

DEFAULT_MODEL = "original"  # AllenNLP's ElmoEmbedder() default


class Embedder:
    """A biLM and its compiled programs, with the methods of AllenNLP's `ElmoEmbedder` (see the module doc).

    Named `Embedder` rather than `ElmoEmbedder` so that `from elmo_jax import Embedder` can sit beside
    AllenNLP's import while a project switches, and it is never mistaken for AllenNLP's stateful class.

    Args:
      model: a published model name ("small", "original", ...; docs/PRETRAINED.md) or a model directory;
        with `weight_file` also given, the options JSON (AllenNLP's first positional argument). Default:
        "original", AllenNLP's default model.
      weight_file: the HDF5 weights of an options JSON + HDF5 pair.
      cuda_device: AllenNLP's device argument: -1 runs on every local JAX device, n >= 0 on
        `jax.local_devices()[n]` alone.
      options_file: the options JSON of a pair (instead of `model`).
      params: a biLM already loaded (instead of a name or files).
      batch_tokens: time steps per batch (`SentenceEmbedder`): bounds the device memory.
      devices: indices into `jax.local_devices()` to run on (instead of `cuda_device`); None: all.
      compute_dtype: "float32" or "bfloat16" matrix products.
      batch_size: ELMoForManyLangs' argument; no effect (batches are `batch_tokens` time steps).

    Attributes:
      params: the biLM.
      sentences: the `SentenceEmbedder` that runs every call (its `stats` count sentences, tokens,
        batches, padding and compiled shapes).
    """

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        cuda_device: int = -1,
        *,
        options_file: str | os.PathLike | None = None,
        params: BiLMParams | None = None,
        batch_tokens: int = 4096,
        devices: Sequence[int] | None = None,
        compute_dtype: str = "float32",
        batch_size: int | None = None,
    ):
        del batch_size  # ELMoForManyLangs' Embedder(model_dir, batch_size=64)
        if params is not None and (model or options_file or weight_file):
            raise ValueError("Embedder: pass params, or a model (or options_file and weight_file), not both")
        if not isinstance(cuda_device, int) or isinstance(cuda_device, bool) or cuda_device < -1:
            raise ValueError(
                f"Embedder: cuda_device must be -1 (every local device) or a device index, found {cuda_device!r}"
            )
        if cuda_device >= 0 and devices is not None:
            raise ValueError("Embedder: pass cuda_device or devices, not both")
        self.params = params if params is not None else _load(model, options_file, weight_file)
        self.devices = tuple(devices) if devices is not None else (cuda_device,) if cuda_device >= 0 else None
        self.batch_tokens, self.compute_dtype = batch_tokens, compute_dtype
        self.sentences = SentenceEmbedder(
            self.params, batch_tokens=batch_tokens, devices=self.devices, compute_dtype=compute_dtype
        )

    def embed_sentence(self, sentence: Sequence[str]) -> np.ndarray:
        """float32 (L+1, n, 2P) vectors of one tokenized sentence: (3, n, 1024) for the original model."""
        return self.embed_batch([sentence])[0]

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """`embed_sentence` of each sentence of `batch` (a list), in order."""
        return self.sentences.embed(batch)

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], batch_size: int | None = None
    ) -> Iterator[np.ndarray]:
        """A generator of `embed_sentence` of each sentence of `sentences` (any iterable, e.g. a generator
        over a corpus), in input order, holding a bounded number of sentences (`SentenceEmbedder.stream`).
        `batch_size` has no effect (batches are `batch_tokens` time steps)."""
        del batch_size
        return self.sentences.stream(sentences, window=DEFAULT_WINDOW, warn=True)

    def sents2elmo(self, sents: Sequence[Sequence[str]], output_layer: int = -1) -> list[np.ndarray]:
        """ELMoForManyLangs' `Embedder.sents2elmo`: one float32 array per sentence, in order: (n, 2P) for
        output_layer -1 (the average of the L+1 layers) or a layer 0..L (0 the token layer), (L+1, n, 2P)
        for -2 (every layer); the output mode of `output_modes.efml_output_layer`."""
        layers = efml_output_layer(output_layer, self.params.config.n_output_layers)
        embedder = SentenceEmbedder(
            self.params,
            layers=layers,
            batch_tokens=self.batch_tokens,
            devices=self.devices,
            compute_dtype=self.compute_dtype,
        )
        return embedder.embed(sents)

    def batch_to_embeddings(self, batch: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """AllenNLP's `ElmoEmbedder.batch_to_embeddings`, as NumPy: (float32 (B, L+1, T, 2P) layers with
        zeros at padding, bool (B, T) mask) of one batch exactly as given (T its longest sentence): one
        program per batch shape (`embed`); `embed_batch` runs any number of sentences in a few."""
        ids = self.sentences.vocabulary.batch_ids(batch)  # the model's text -> ids
        layers, mask = embed(self.params, ids, compute_dtype=self.compute_dtype)
        return np.asarray(layers), np.asarray(mask)

    def embed_file(
        self,
        input_file,
        output_file_path: str | os.PathLike,
        output_format: str = "all",
        batch_size: int | None = None,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
        **options,
    ) -> dict:
        """Every line of a text file (one tokenized sentence per line) into an HDF5 file in the layout of
        AllenNLP's `elmo` command: `elmo_jax.files.file_embedding.embed_file`.

        Args:
          input_file: the input's path, or an open file of one (AllenNLP passes a file object).
          output_file_path: the HDF5 file to write (an existing one only with `overwrite=True`).
          output_format: "all", "top" or "average" (AllenNLP's), or "mix" / "sentence_mean".
          batch_size: no effect (batches are `batch_tokens` time steps).
          forget_sentences: leave out the "sentence_to_index" dataset.
          use_sentence_keys: refused: datasets are named by line index, AllenNLP's default.
          **options: the other fields of `file_options.Options` (overwrite, blank_lines, float16, ...).

        Returns:
          the counts `embed_file` returns (lines, sentences, tokens, batches, seconds, ...).
        """
        del batch_size
        if use_sentence_keys:
            raise ValueError(
                "embed_file: use_sentence_keys=True is not supported; datasets are named by line index (AllenNLP's "
                "default) and sentence_to_index maps each sentence to its name"
            )
        chosen = dict(
            layers=output_format,
            sentence_index=not forget_sentences,
            batch_tokens=self.batch_tokens,
            compute_dtype=self.compute_dtype,
            devices=self.devices,
        )
        return embed_text_file(
            self.params, _input_path(input_file), os.fspath(output_file_path), Options(**(chosen | options))
        )


def _load(model, options_file, weight_file) -> BiLMParams:
    """The biLM that AllenNLP's arguments, or a name or directory, name (`ModelSource`)."""
    if weight_file is not None and options_file is None:
        model, options_file = None, model  # ElmoEmbedder(options_file, weight_file)
    if options_file is not None or weight_file is not None:
        if model is not None or options_file is None or weight_file is None:
            raise ValueError("Embedder: pass options_file and weight_file together, or a model name or directory")
        return ModelSource(options_file=os.fspath(options_file), weight_file=os.fspath(weight_file)).load()
    return ModelSource(model=os.fspath(model) if model is not None else DEFAULT_MODEL).load(flag="Embedder: model")


def _input_path(input_file) -> str:
    """The path of `input_file`: a path, or an open file's name."""
    if isinstance(input_file, (str, os.PathLike)):
        return os.fspath(input_file)
    name = getattr(input_file, "name", None)
    if isinstance(name, (str, os.PathLike)) and os.path.isfile(name):
        return os.fspath(name)
    raise ValueError(
        f"embed_file: input_file must be a path or an open file of one (it is read twice: checked, then "
        f"embedded), found {type(input_file).__name__}"
    )
