"""Model directories: a trained biLM as one self-contained, checkable folder.

    MODEL_DIR/
      options.json    the architecture, in the published format (bilm-tf, AllenNLP)
      weights.hdf5    the weights, in the published format
      params.npz      the same weights as the frozen parameter pytree: float32 arrays keyed by weight-file
                      path, readable with NumPy alone (`BiLMParams.weights` is `from_flat` of it)
      extractor.jax   `jax.export` StableHLO of the feature extractor, symbolic (batch, time), for CPU,
                      CUDA and TPU; runs with jax alone (see USAGE.md and `elmo_jax.formats.extractor`)
      vocab.txt       the training vocabulary, when there is one (bilm-tf format)
      vocabulary.json a model's own text -> ids (characters, and words), when it reads no UTF-8 bytes
                      (ELMoForManyLangs' models, `model.vocabulary.TokenVocabulary`)
      USAGE.md        how to run the extractor without elmo_jax
      manifest.json   format version, versions used, and the size and SHA-256 of every file above

The directory is built under a temporary name next to the target and renamed into place, so a crash
never leaves a half-written model under the target name. `load` checks the manifest before trusting
any file: a missing, truncated or altered file is reported by name instead of giving garbage vectors.

In Cloud Storage (`gs://...`), which has no rename, the directory is built locally and uploaded with
manifest.json last; replacing one first deletes its manifest, then its files. A reader that finds the
manifest finds every file it lists (sizes and SHA-256 checked); a killed upload leaves files without a
manifest, which no reader accepts and the next `--overwrite` (or training's next export) replaces.
`load` of a URL downloads the directory to a local temporary copy and checks it there.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import time
from typing import Any

import jax
import numpy as np

from elmo_jax import storage
from elmo_jax.formats import output_paths
from elmo_jax.formats.output_paths import MODEL_FORMAT, MODEL_MANIFEST, is_model_directory
from elmo_jax.model.config import BiLMConfig, read_options
from elmo_jax.model.params import BiLMParams, check_finite, from_flat, iter_flat, lstm_cell_path, weight_shapes
from elmo_jax.model.vocabulary import TokenVocabulary

FORMAT = MODEL_FORMAT
FORMAT_VERSION = 1
MANIFEST = MODEL_MANIFEST
OPTIONS, WEIGHTS, PARAMS, EXTRACTOR, VOCAB, USAGE, TOKENS = (
    "options.json",
    "weights.hdf5",
    "params.npz",
    "extractor.jax",
    "vocab.txt",
    "USAGE.md",
    "vocabulary.json",
)
REQUIRED = (OPTIONS, WEIGHTS, PARAMS, EXTRACTOR, USAGE)


def write_model_dir(
    params: BiLMParams,
    directory: str | os.PathLike,
    *,
    vocab_file: str | None = None,
    vocab=None,
    source: str = "",
    compute_dtype: str = "float32",
    overwrite: bool = False,
    inputs=(),
    allow_inside: str | None = None,
    extractor: bool = True,
) -> dict[str, Any]:
    """Writes a complete model directory at `directory`; returns its manifest.

    Args:
      params: the biLM (any device; gathered to the host).
      directory: the target; it must not exist unless `overwrite`, and its parent must.
      vocab_file: a bilm-tf vocabulary to copy in, or None.
      vocab: or a `Vocab` to write (not both).
      source: where the weights came from (a workdir and step, or HDF5 files), recorded in the manifest.
      compute_dtype: matmul precision baked into the extractor ("float32" or "bfloat16").
      overwrite: replace an existing model directory (only after the new one is complete; never a
        directory that is not exactly an earlier export, see `output_paths`).
      inputs: files the caller read the model from (the output may not be or hold one of them).
      allow_inside: a workdir the caller owns, where the directory may be written (training's export).
      extractor: write extractor.jax (False: the manifest records that it was left out, and USAGE.md says
        how to add it; everything else reads the directory as usual).

    Raises:
      FileExistsError, FileNotFoundError, NotADirectoryError, PermissionError, ValueError: the target
        cannot be written (`output_paths.check_output`), or the weights are not finite; nothing is touched.
    """
    target = storage.absolute(directory)
    check_target(target, overwrite, inputs=inputs, allow_inside=allow_inside)
    host = _host_params(params, target)
    manifest = {}

    def fill(staging: str) -> None:
        manifest.update(_write_files(staging, host, vocab_file, vocab, source, compute_dtype if extractor else None))

    # An earlier model directory (allowed by `check_target`) is replaced only once the new one is complete.
    storage.publish_directory(target, fill, last=MANIFEST, existing="replace" if overwrite else "refuse")
    return manifest


def _host_params(params: BiLMParams, target: str) -> BiLMParams:
    """`params` gathered to the host as NumPy arrays; ValueError naming `target` if one is not finite."""
    host = params.replace(weights=jax.tree.map(np.asarray, jax.device_get(params.weights)))
    check_finite(host.weights, f"cannot write the model directory {target}")
    return host


def _write_files(
    staging: str, host: BiLMParams, vocab_file: str | None, vocab, source: str, extractor_dtype: str | None
) -> dict[str, Any]:
    """Writes a model directory's files into `staging`, manifest.json last; returns the manifest.

    Args: as `write_model_dir`'s, and extractor_dtype: the extractor's matmul precision, or None to leave
    extractor.jax out.
    """
    # Imported here: weights_hdf5 imports h5py, and the extractor traces the model.
    from elmo_jax.formats import extractor, weights_hdf5

    weights_hdf5.save_hdf5(host, os.path.join(staging, OPTIONS), os.path.join(staging, WEIGHTS))
    with open(os.path.join(staging, PARAMS), "wb") as f:
        np.savez(f, **{path: np.asarray(a, np.float32) for path, a in iter_flat(host.weights)})
    if extractor_dtype is not None:
        with open(os.path.join(staging, EXTRACTOR), "wb") as f:
            f.write(extractor.export_extractor(host, extractor_dtype))
    if vocab_file:
        with open(os.path.join(staging, VOCAB), "wb") as f:
            f.write(storage.read_bytes(vocab_file))
    elif vocab is not None:
        vocab.save(os.path.join(staging, VOCAB))
    if host.vocabulary is not None and not host.vocabulary.is_bytes:
        with open(os.path.join(staging, TOKENS), "w", encoding="utf-8") as f:
            json.dump(host.vocabulary.to_json(), f, ensure_ascii=False, sort_keys=True)
    with open(os.path.join(staging, USAGE), "w", encoding="utf-8") as f:
        f.write(usage_text(host.config) if extractor_dtype is not None else usage_without_extractor(source))
    manifest = _manifest(staging, host.config, source, extractor_dtype)
    with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    return manifest


def load(directory: str | os.PathLike, *, verify: bool = True) -> BiLMParams:
    """The frozen biLM of a model directory, ready for `embed`.

    Args:
      directory: written by `python -m elmo_jax.export` (or `write_model_dir`).
      verify: check every file's SHA-256 against the manifest (sizes are always checked).

    Raises:
      FileNotFoundError: not a directory, or a file is missing (named).
      ValueError: the manifest is unreadable or of another format; a file is truncated or altered; the
        parameters do not match the options (the message names the file and key).
    """
    path = os.fspath(directory)
    if not storage.exists(path):
        raise FileNotFoundError(f"{path}: model directory not found")
    if storage.is_unfinished_publish(path, MANIFEST):
        raise FileNotFoundError(
            f"{path}: missing {MANIFEST}; not a model directory written by elmo_jax.export (or its upload did "
            "not finish)"
        )
    with storage.local_directory(path) as local:
        try:
            return _load_local(local, verify)
        except (OSError, ValueError) as e:  # name what the user gave, not a temporary copy
            raise type(e)(str(e).replace(local, path)) from None


def _load_local(path: str, verify: bool) -> BiLMParams:
    """`load` of a local model directory."""
    read_manifest(path, verify=verify)
    config = read_options(os.path.join(path, OPTIONS))
    params_file = os.path.join(path, PARAMS)
    try:
        with np.load(params_file, allow_pickle=False) as archive:
            flat = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{params_file}: cannot read the parameter archive ({e})") from None
    expected = weight_shapes(config)
    if set(flat) != set(expected):
        raise ValueError(
            f"{params_file}: arrays do not match {os.path.join(path, OPTIONS)}: missing "
            f"{sorted(set(expected) - set(flat))}, unexpected {sorted(set(flat) - set(expected))}"
        )
    for key, shape in expected.items():
        if flat[key].shape != shape or flat[key].dtype != np.float32:
            raise ValueError(f"{params_file}: {key!r} is {flat[key].dtype} {flat[key].shape}, expected float32 {shape}")
    check_finite(flat, params_file)
    _check_same_weights(path, config, flat)
    weights = from_flat({k: jax.numpy.asarray(v) for k, v in flat.items()})
    return BiLMParams(weights=weights, config=config, vocabulary=_read_vocabulary(path, config))


def _read_vocabulary(path: str, config: BiLMConfig) -> TokenVocabulary | None:
    """The directory's vocabulary.json for a model that reads no UTF-8 bytes (None for one that does);
    errors name the file."""
    tokens_file = os.path.join(path, TOKENS)
    if not config.char_vocab_size:
        return None
    if not os.path.exists(tokens_file):
        raise FileNotFoundError(f"{path}: missing {TOKENS}, the vocabulary {os.path.join(path, OPTIONS)} names")
    return TokenVocabulary.from_json(read_json(tokens_file), config, tokens_file)


def read_json(path: str):
    """The JSON value in the local file `path`; ValueError naming it when it is not UTF-8 JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def _cross_checked(config: BiLMConfig) -> tuple[str, ...]:
    """Two small datasets from opposite ends of the network (the first filter's bias, the last LSTM
    layer's bias): weights of two different models, or two steps of one run, differ in both."""
    return ("CNN/b_cnn_0", f"{lstm_cell_path(1, config.n_layers - 1)}/B")


def _check_same_weights(path: str, config: BiLMConfig, flat: dict[str, np.ndarray]) -> None:
    """Raises ValueError naming both files when weights.hdf5 and params.npz hold different weights (a
    hand-merged directory: `load` and the extractor read params.npz, bilm-tf and AllenNLP the HDF5 file).
    Two small datasets are compared exactly; the files' own digests are the manifest's business."""
    import h5py

    weights_file, params_file = os.path.join(path, WEIGHTS), os.path.join(path, PARAMS)
    try:
        with h5py.File(weights_file, "r") as f:
            differing = [key for key in _cross_checked(config) if not np.array_equal(f[key][...], flat[key])]
    except (OSError, KeyError) as e:
        raise ValueError(f"{weights_file}: cannot read it to compare with {params_file} ({e})") from None
    if differing:
        raise ValueError(
            f"{path}: {PARAMS} and {WEIGHTS} hold different weights ({differing[0]!r} differs), so readers of "
            f"this directory would get different models (elmo_jax.load and extractor.jax read {params_file}; "
            f"bilm-tf and AllenNLP read {weights_file}). Copied from two models? Export the model again"
        )


def read_manifest(directory: str, *, verify: bool = True) -> dict[str, Any]:
    """The checked manifest of a model directory (see `load` for what is checked and raised)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"{directory}: model directory not found"
            if not os.path.exists(directory)
            else f"{directory}: expected a model directory, found a file"
        )
    manifest_file = os.path.join(directory, MANIFEST)
    if not os.path.exists(manifest_file):
        hint = (
            " (it has options.json and weights.hdf5: pass them as --options/--weights, or make a model "
            "directory with python -m elmo_jax.export)"
            if os.path.exists(os.path.join(directory, OPTIONS))
            else ""
        )
        raise FileNotFoundError(
            f"{directory}: missing {MANIFEST}; not a model directory written by elmo_jax.export" + hint
        )
    manifest = read_json(manifest_file)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f'{manifest_file}: not an elmo-jax model manifest (expected "format": "{FORMAT}")')
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{manifest_file}: format_version {manifest.get('format_version')!r}; this elmo_jax reads "
            f"version {FORMAT_VERSION}"
        )
    files = manifest.get("files", {})
    left_out = () if manifest.get("extractor", {}) is not None else (EXTRACTOR,)  # export_extractor=False
    for name in REQUIRED:
        if name not in files and name not in left_out:
            raise ValueError(f"{manifest_file}: does not list {name}")
    for name, entry in files.items():
        _check_file(directory, name, entry, verify)
    return manifest


def usage_text(config: BiLMConfig) -> str:
    """USAGE.md: running the exported extractor with jax and NumPy only."""
    C = config.max_characters_per_token
    if config.char_vocab_size:
        return _vocabulary_usage_text(config)
    return f"""# Running this model without elmo_jax

`extractor.jax` is a `jax.export` (StableHLO) program for CPU, CUDA and TPU with symbolic batch and
length. It needs jax and NumPy only:

```python
import jax, jax.export, numpy as np

extract = jax.export.deserialize(open("extractor.jax", "rb").read())
weights = dict(np.load("params.npz"))

def char_ids(sentences, C={C}):
    # UTF-8 bytes + 1 between begin-of-word (259) and end-of-word (260), padded with 261; 0 = no token
    out = np.zeros((len(sentences), max(map(len, sentences)), C), np.int32)
    for b, sentence in enumerate(sentences):
        for t, token in enumerate(sentence):
            raw = list(token.encode("utf-8"))[:C - 2]
            out[b, t] = [259] + [x + 1 for x in raw] + [260] + [261] * (C - 2 - len(raw))
    return out

layers, mask = extract.call(weights, char_ids([["The", "bank", "."], ["Hello", "!"]]))
# layers: float32 (batch, {config.n_output_layers}, time, {config.output_dim}); mask: bool (batch, time)
```

The tokens `<S>` and `</S>` are added inside the program, as `elmo_jax.embed` does (a literal `<S>` or
`</S>` in the text is a special token for `elmo_jax.batch_to_ids`; this short version does not do that). With elmo_jax:
`params = elmo_jax.load(MODEL_DIR)` then `elmo_jax.embed(params, elmo_jax.batch_to_ids(sentences))`.
"""


def _vocabulary_usage_text(config: BiLMConfig) -> str:
    """USAGE.md of a model with its own vocabulary (vocabulary.json)."""
    C = config.max_characters_per_token
    _, _, bow, eow, pad = config.char_specials
    word_line = (
        '\n            out[b, t, C] = words.get(token, vocabulary["unknown_word"]) + 1' if config.has_words else ""
    )
    return f"""# Running this model without elmo_jax

`extractor.jax` is a `jax.export` (StableHLO) program for CPU, CUDA and TPU with symbolic batch and
length. It needs jax and NumPy only. This model reads its own vocabulary (`vocabulary.json`): a token is
{C} character ids{" and then its word id" if config.has_words else ""}, each id + 1 (0 = no token):

```python
import json, jax, jax.export, numpy as np

extract = jax.export.deserialize(open("extractor.jax", "rb").read())
weights = dict(np.load("params.npz"))
vocabulary = json.load(open("vocabulary.json", encoding="utf-8"))
chars, words = vocabulary["characters"], vocabulary["words"]

def ids(sentences, C={C}):
    out = np.zeros((len(sentences), max(map(len, sentences)), {config.ids_per_token}), np.int32)
    for b, sentence in enumerate(sentences):
        for t, token in enumerate(sentence):
            token = token[:C - 2]  # characters, not bytes
            row = [{bow}] + [chars.get(c, vocabulary["unknown_character"]) for c in token] + [{eow}]
            out[b, t, :C] = np.array(row + [{pad}] * (C - len(row))) + 1{word_line}
    return out

layers, mask = extract.call(weights, ids([["The", "bank", "."], ["Hello", "!"]]))
# layers: float32 (batch, {config.n_output_layers}, time, {config.output_dim}); mask: bool (batch, time)
```

The sentence boundaries are added inside the program (a token equal to one of the vocabulary's
`boundary_tokens` is a boundary for elmo_jax; this short version does not do that). With elmo_jax:
`params = elmo_jax.load(MODEL_DIR)`, then `elmo_jax.embed_sentences(params, sentences)`.
"""


def usage_without_extractor(source: str) -> str:
    """USAGE.md of a model directory written without extractor.jax."""
    workdir = source.rsplit(" step ", 1)[0] if " step " in source else "WORKDIR"
    return f"""# Using this model

This directory was written without `extractor.jax` (the training config's `export_extractor` was
False). `elmo_jax.load(MODEL_DIR)` and every elmo_jax command read it as usual; for the program that
runs with jax alone, export it again: `python -m elmo_jax.export --workdir={workdir} --output=DIR`.
"""


def _manifest(staging: str, config: BiLMConfig, source: str, compute_dtype: str | None) -> dict[str, Any]:
    files = {
        name: {"bytes": os.path.getsize(os.path.join(staging, name)), "sha256": _sha256(os.path.join(staging, name))}
        for name in sorted(os.listdir(staging))
    }
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {name: _version(name) for name in ("elmo-jax", "jax", "jaxlib")},
        "source": source,
        "output": {
            "layers": config.n_output_layers,
            "dim": config.output_dim,
            "max_characters_per_token": config.max_characters_per_token,
        },
        "extractor": None
        if compute_dtype is None  # written without it
        else {
            "file": EXTRACTOR,
            "compute_dtype": compute_dtype,
            "platforms": ["cpu", "cuda", "tpu"],
            "inputs": "weights: dict(np.load('params.npz')); chars: int32 (batch, time, C) shifted ids",
            "outputs": "layers float32 (batch, L+1, time, 2P); mask bool (batch, time)",
        },
        "files": files,
    }


def _check_file(directory: str, name: str, entry: dict, verify: bool) -> None:
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("bytes"), int)
        or os.sep in name
        or name in (os.curdir, os.pardir)
    ):
        raise ValueError(
            f"{os.path.join(directory, MANIFEST)}: bad entry for {name!r} (expected a file name in the "
            'directory with its "bytes" and "sha256")'
        )
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{directory}: missing {name} (listed in {MANIFEST}); copy the whole directory or export it again"
        )
    size = os.path.getsize(path)
    if size != entry.get("bytes"):
        raise ValueError(
            f"{path}: {size:,} bytes, expected {entry.get('bytes'):,} from {MANIFEST} (truncated or "
            "replaced); copy the whole directory again"
        )
    if verify and _sha256(path) != entry.get("sha256"):
        raise ValueError(f"{path}: contents differ from {MANIFEST} (SHA-256 mismatch: corrupted or edited)")


def is_exact_model_dir(directory: str) -> bool:
    """Whether `directory` is a model directory whose manifest lists exactly the files in it: what
    `--overwrite` may replace (a folder with a copied manifest, or user files added, is not). Also a
    publish that did not finish (in a bucket, where a directory is uploaded file by file: no manifest
    yet, and only files a model directory has)."""
    try:
        if not storage.isdir(directory):
            return False
        names = set(storage.listdir(directory))
        if storage.is_unfinished_publish(directory, MANIFEST):
            return names <= {OPTIONS, WEIGHTS, PARAMS, EXTRACTOR, VOCAB, USAGE, TOKENS}
        if not is_model_directory(directory):
            return False
        listed = set(json.loads(storage.read_bytes(storage.join(directory, MANIFEST))).get("files", {}))
        return listed | {MANIFEST} == names
    except (OSError, ValueError, AttributeError, TypeError):
        return False


MODEL_DIRECTORY = output_paths.Artifact("an elmo-jax model directory", is_directory=True, recognizes=is_exact_model_dir)


def check_target(target: str, overwrite: bool, *, inputs=(), flag: str = "--output", allow_inside=None) -> str:
    """Raises unless a model directory may be written at `target` (`output_paths.check_output`)."""
    return output_paths.check_output(
        target, MODEL_DIRECTORY, overwrite=overwrite, inputs=inputs, flag=flag, allow_inside=allow_inside
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
