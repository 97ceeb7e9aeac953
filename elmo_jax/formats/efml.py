"""ELMoForManyLangs (HIT-SCIR's models, the `elmoformanylangs` package) model directories, read as biLMs.

    EFML_DIR/
      config.json          the training settings; its "config_path" names the architecture JSON
      cnn_50_100_512_4096_sample.json   (that JSON: "encoder", "token_embedder"; the released models name
                           one of the package's own two, which this module knows when the file is absent)
      char.dic, word.dic   "entry<TAB>id" lines: the characters (with <bow>, <eow>, <pad>, <oov>, <bos>,
                           <eos>) and the words (with <oov>, <pad>, <bos>, <eos>)
      token_embedder.pkl   PyTorch state dicts (`formats.torch_pickle`, read without torch)
      encoder.pkl

`read_efml` maps them onto the one biLM of `elmo_jax.model` (docs/MANY_LANGUAGES.md says how each
piece corresponds): the token layer is the char CNN over the model's characters and a word embedding
(`BiLMConfig.char_vocab_size`, `word_dim`), the "elmo" encoder is bilm-tf's LSTM (its gates reordered,
its forget bias moved, its highway gate negated), the "lstm" encoder a one-layer LSTM projected after
the recurrence (`lstm_output_projection`). What the package does to text is kept, quirks included: a
token is cut to its first C-2 characters before its word is looked up, and the package puts the id of
`<eow>` first in a token and the id of `<bow>` last (frontend.create_one_batch reads them into swapped
names), so `char_specials` says so. `efml_model_dir` converts a directory once into a model directory in
the package's cache, as the published models are, so every command's `--model=EFML_DIR` reads it.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from elmo_jax.formats import model_dir
from elmo_jax.formats.output_paths import is_model_directory
from elmo_jax.formats.torch_pickle import read_state_dict
from elmo_jax.model.config import BiLMConfig, InvalidBiLMConfig
from elmo_jax.model.params import OUTPUT_PROJECTION, BiLMParams, check_finite, from_flat, lstm_cell_path
from elmo_jax.model.vocabulary import TokenVocabulary
from elmo_jax.storage.cache_home import cache_dir

CONFIG, CHARS, WORDS, TOKEN_EMBEDDER, ENCODER = (
    "config.json",
    "char.dic",
    "word.dic",
    "token_embedder.pkl",
    "encoder.pkl",
)
FILES = (CONFIG, CHARS, WORDS, TOKEN_EMBEDDER, ENCODER)

# The package's two architecture files (elmoformanylangs/configs/), which the released models' config.json
# name without shipping them; both hold the same numbers.
_RELEASED = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "word_dim": 100,
        "char_dim": 50,
        "max_characters_per_token": 50,
    },
}
PACKAGE_CONFIGS = {"cnn_50_100_512_4096_sample.json": _RELEASED, "cnn_0_100_512_4096_sample.json": _RELEASED}


def is_efml_dir(path: str) -> bool:
    """Whether `path` is a local directory with ELMoForManyLangs' config.json and both weight pickles."""
    return os.path.isdir(path) and all(os.path.isfile(os.path.join(path, f)) for f in (CONFIG, TOKEN_EMBEDDER, ENCODER))


def read_efml(directory: str | os.PathLike) -> BiLMParams:
    """The biLM of an ELMoForManyLangs model directory, with its vocabulary (see the module doc).

    Raises:
      FileNotFoundError: a file is missing (named).
      ValueError: a file is not what the package writes, or the model is one this biLM cannot express
        (the package's LSTM token embedder; a deeper "lstm" encoder); the message names the file and key.
    """
    directory = os.fspath(directory)
    for name in FILES:
        if not os.path.isfile(os.path.join(directory, name)):
            raise FileNotFoundError(f"{directory}: missing {name}; not an ELMoForManyLangs model directory")
    architecture, source = _architecture(directory)
    characters = read_dictionary(os.path.join(directory, CHARS))
    words = read_dictionary(os.path.join(directory, WORDS))
    tokens_file, encoder_file = os.path.join(directory, TOKEN_EMBEDDER), os.path.join(directory, ENCODER)
    token_state, encoder_state = read_state_dict(tokens_file), read_state_dict(encoder_file)
    config = _config(architecture, source, characters, words, token_state, tokens_file)
    flat = _token_weights(token_state, config, tokens_file)
    flat |= _encoder_weights(encoder_state, config, architecture["encoder"]["name"], encoder_file)
    check_finite(flat, directory)
    vocabulary = TokenVocabulary(config, characters, characters["<oov>"], words, words["<oov>"], ("<bos>", "<eos>"))
    return BiLMParams(weights=from_flat(flat), config=config, vocabulary=vocabulary)


def read_dictionary(path: str) -> dict[str, int]:
    """char.dic or word.dic as the package reads it: "entry<TAB>id" per line, stripped of surrounding
    whitespace; a line left with its id alone was the full-width space U+3000, which the strip removed.
    A later line for the same entry wins."""
    entries = {}
    with open(path, encoding="utf-8", newline="") as f:
        for number, line in enumerate(f, 1):
            parts = line.strip().split("\t")
            if len(parts) == 1:
                parts.insert(0, "\u3000")
            if len(parts) != 2 or not parts[1].isdigit():
                raise ValueError(f"{path}:{number}: expected an entry, a tab and an integer id, found {line.strip()!r}")
            entries[parts[0]] = int(parts[1])
    return entries


def _architecture(directory: str) -> tuple[dict, str]:
    """The architecture JSON that config.json names (its "config_path": in the directory, else its file
    name there, else one of the package's own), and where it came from."""
    config_file = os.path.join(directory, CONFIG)
    settings = model_dir.read_json(config_file)
    path = settings.get("config_path") if isinstance(settings, dict) else None
    if not isinstance(path, str):
        raise ValueError(
            f'{config_file}: missing "config_path" (the architecture JSON, e.g. cnn_50_100_512_4096_sample.json)'
        )
    for candidate in (os.path.join(directory, path), os.path.join(directory, os.path.basename(path))):
        if os.path.isfile(candidate):
            return model_dir.read_json(candidate), candidate
    name = os.path.basename(path)
    if name in PACKAGE_CONFIGS:
        return PACKAGE_CONFIGS[name], f"{config_file} (the package's {name})"
    raise FileNotFoundError(
        f'{config_file}: "config_path" names {path}, which is neither in {directory} nor one of the '
        f"package's {sorted(PACKAGE_CONFIGS)}"
    )


def _section(architecture, key: str, source: str, names: tuple[str, ...]) -> dict:
    section = architecture.get(key) if isinstance(architecture, dict) else None
    if not isinstance(section, dict):
        raise ValueError(f'{source}: missing section "{key}"')
    missing = [n for n in names if n not in section]
    if missing:
        raise ValueError(f"{source}: missing key {key}.{missing[0]}")
    return section


def _config(architecture, source, characters, words, token_state, tokens_file) -> BiLMConfig:
    """The `BiLMConfig` of an EFML model; errors name the architecture file or the dictionary and key."""
    tok = _section(architecture, "token_embedder", source, ("name", "filters", "n_highway", "char_dim", "word_dim"))
    enc = _section(architecture, "encoder", source, ("name", "projection_dim", "dim", "n_layers"))
    if str(tok["name"]).lower() != "cnn":
        raise ValueError(f"{source}: token_embedder.name is {tok['name']!r}; only the char CNN ('cnn') is supported")
    if not tok["char_dim"] or not tok["word_dim"]:
        raise ValueError(f"{source}: token_embedder.char_dim and word_dim must both be > 0 here (a char CNN and words)")
    encoder = str(enc["name"]).lower()
    if encoder not in ("elmo", "lstm"):
        raise ValueError(f"{source}: encoder.name is {enc['name']!r}; expected 'elmo' or 'lstm'")
    chars_file, words_file = tokens_file.replace(TOKEN_EMBEDDER, CHARS), tokens_file.replace(TOKEN_EMBEDDER, WORDS)
    specials = [_special(characters, s, chars_file) for s in ("<bos>", "<eos>", "<eow>", "<bow>", "<pad>", "<oov>")]
    _special(words, "<oov>", words_file), _special(words, "<pad>", words_file)
    rows = {k: v.shape[0] for k, v in token_state.items() if k.endswith("embedding.weight") and v.ndim == 2}
    clip = lambda key: float(enc[key]) if encoder == "elmo" and enc.get(key) else None  # the package: `if clip:`
    try:
        return BiLMConfig(
            char_embed_dim=int(tok["char_dim"]),
            filters=tuple(tuple(f) for f in tok["filters"]),
            n_highway=int(tok["n_highway"]),
            activation=tok.get("activation", "relu"),
            max_characters_per_token=int(tok.get("max_characters_per_token", 50)),
            lstm_dim=int(enc["dim"]),
            projection_dim=int(enc["projection_dim"]),
            n_layers=int(enc["n_layers"]),
            cell_clip=clip("cell_clip"),
            proj_clip=clip("proj_clip"),
            use_skip_connections=encoder == "elmo",
            char_vocab_size=rows.get("char_emb_layer.embedding.weight", len(characters)),
            char_specials=tuple(specials[:5]),  # bos, eos, then the package's swapped bow and eow, pad
            word_vocab_size=rows.get("word_emb_layer.embedding.weight", len(words)),
            word_dim=int(tok["word_dim"]),
            word_specials=(words.get("<bos>", words["<oov>"]), words.get("<eos>", words["<oov>"])),
            lstm_output_projection=encoder == "lstm",
        )
    except InvalidBiLMConfig as e:
        raise ValueError(f"{source}: this ELMoForManyLangs model cannot be read: {e}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: invalid architecture ({e})") from None


def _special(entries: dict[str, int], name: str, path: str) -> int:
    if name not in entries:
        raise ValueError(f"{path}: missing the entry {name!r}, which the package needs")
    return entries[name]


def _token_weights(state: dict[str, np.ndarray], config: BiLMConfig, path: str) -> dict[str, np.ndarray]:
    """The token embedder's weights at our paths: convolutions (n, E, w) -> (1, w, E, n); each highway
    layer's (2F, F) kernel split into its transform half and its gate half, negated (the package carries
    the input where its gate is 1, bilm-tf where its carry gate is 0); the projection transposed."""
    F = config.n_filters
    expected = {
        "char_emb_layer.embedding.weight": (config.char_vocab_size, config.char_embed_dim),
        "word_emb_layer.embedding.weight": (config.word_vocab_size, config.word_dim),
        "projection.weight": (config.projection_dim, config.word_dim + F),
        "projection.bias": (config.projection_dim,),
    }
    for i, (width, num) in enumerate(config.filters):
        expected[f"convolutions.{i}.weight"] = (num, config.char_embed_dim, width)
        expected[f"convolutions.{i}.bias"] = (num,)
    for k in range(config.n_highway):
        expected[f"highways._layers.{k}.weight"] = (2 * F, F)
        expected[f"highways._layers.{k}.bias"] = (2 * F,)
    s = _checked(state, expected, path)
    flat = {
        "char_embed": s["char_emb_layer.embedding.weight"],
        "word_embed": s["word_emb_layer.embedding.weight"],
        "CNN_proj/W_proj": s["projection.weight"].T,
        "CNN_proj/b_proj": s["projection.bias"],
    }
    for i in range(len(config.filters)):
        flat[f"CNN/W_cnn_{i}"] = s[f"convolutions.{i}.weight"].transpose(2, 1, 0)[None]
        flat[f"CNN/b_cnn_{i}"] = s[f"convolutions.{i}.bias"]
    for k in range(config.n_highway):
        w, b = s[f"highways._layers.{k}.weight"], s[f"highways._layers.{k}.bias"]
        flat[f"CNN_high_{k}/W_transform"], flat[f"CNN_high_{k}/b_transform"] = w[:F].T, b[:F]
        flat[f"CNN_high_{k}/W_carry"], flat[f"CNN_high_{k}/b_carry"] = -w[F:].T, -b[F:]
    return flat


def _gates(x: np.ndarray, forget_shift: float = 0.0) -> np.ndarray:
    """PyTorch's gate blocks (i, f, g, o) along the last axis reordered to bilm-tf's (i, j=g, f, o); the
    forget block less `forget_shift` (bilm-tf adds 1 to it at run time)."""
    i, f, g, o = np.split(x, 4, axis=-1)
    return np.concatenate([i, g, f - np.float32(forget_shift), o], axis=-1)


def _encoder_weights(state, config: BiLMConfig, encoder: str, path: str) -> dict[str, np.ndarray]:
    """The encoder's weights at our paths (`_elmo_cells` or `_lstm_cells`), checked against `config`."""
    return (_elmo_cells if encoder == "elmo" else _lstm_cells)(state, config, path)


def _elmo_cells(state, config: BiLMConfig, path: str) -> dict[str, np.ndarray]:
    """ElmobiLm: per direction and layer, input_linearity (4H, P) and state_linearity (4H, P) + bias -> W_0
    (2P, 4H) and B; state_projection (P, H) -> W_P_0 (H, P)."""
    H, P = config.lstm_dim, config.projection_dim
    if not config.has_lstm_projection:
        raise ValueError(f"{path}: encoder.projection_dim {P} must be smaller than encoder.dim {H} here")
    expected = {}
    for direction in ("forward", "backward"):
        for layer in range(config.n_layers):
            cell = f"{direction}_layer_{layer}"
            expected |= {
                f"{cell}.input_linearity.weight": (4 * H, P),
                f"{cell}.state_linearity.weight": (4 * H, P),
                f"{cell}.state_linearity.bias": (4 * H,),
                f"{cell}.state_projection.weight": (P, H),
            }
    s = _checked(state, expected, path)
    flat = {}
    for d, direction in enumerate(("forward", "backward")):
        for layer in range(config.n_layers):
            cell, ours = f"{direction}_layer_{layer}", lstm_cell_path(d, layer)
            kernel = np.concatenate([s[f"{cell}.input_linearity.weight"].T, s[f"{cell}.state_linearity.weight"].T])
            flat[f"{ours}/W_0"] = _gates(kernel)
            flat[f"{ours}/B"] = _gates(s[f"{cell}.state_linearity.bias"], forget_shift=1.0)
            flat[f"{ours}/W_P_0"] = s[f"{cell}.state_projection.weight"].T
    return flat


def _lstm_cells(state, config: BiLMConfig, path: str) -> dict[str, np.ndarray]:
    """LstmbiLm: torch.nn.LSTM's weight_ih (4H, P), weight_hh (4H, H) and two biases per direction -> W_0
    (P + H, 4H) and B; its projection (P, H), shared by both directions -> RNN_proj."""
    H, P = config.lstm_dim, config.projection_dim
    expected = {"projection.weight": (P, H), "projection.bias": (P,)}
    for suffix in ("", "_reverse"):
        expected |= {
            f"encoder.weight_ih_l0{suffix}": (4 * H, P),
            f"encoder.weight_hh_l0{suffix}": (4 * H, H),
            f"encoder.bias_ih_l0{suffix}": (4 * H,),
            f"encoder.bias_hh_l0{suffix}": (4 * H,),
        }
    s = _checked(state, expected, path)
    flat = {
        f"{OUTPUT_PROJECTION}/W_proj": s["projection.weight"].T,
        f"{OUTPUT_PROJECTION}/b_proj": s["projection.bias"],
    }
    for d, suffix in enumerate(("", "_reverse")):
        ours = lstm_cell_path(d, 0)
        kernel = np.concatenate([s[f"encoder.weight_ih_l0{suffix}"].T, s[f"encoder.weight_hh_l0{suffix}"].T])
        flat[f"{ours}/W_0"] = _gates(kernel)
        flat[f"{ours}/B"] = _gates(s[f"encoder.bias_ih_l0{suffix}"] + s[f"encoder.bias_hh_l0{suffix}"], 1.0)
    return flat


def _checked(state: dict[str, np.ndarray], expected: dict[str, tuple], path: str) -> dict[str, np.ndarray]:
    """`state`'s arrays as float32 once every expected key is there with its shape and a float dtype and no
    other key is; ValueError naming `path` and the key otherwise."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: tensors do not match the architecture: missing {missing}, unexpected {unexpected}")
    for key, shape in expected.items():
        if state[key].shape != shape or not np.issubdtype(state[key].dtype, np.floating):
            raise ValueError(f"{path}: {key!r} is {state[key].dtype} {state[key].shape}, expected float {shape}")
    return {key: np.ascontiguousarray(value, np.float32) for key, value in state.items()}


def efml_digest(directory: str) -> str:
    """SHA-256 over the model's files (names and contents), the architecture JSON included when it is in
    the directory: the key of its conversion in the cache."""
    digest = hashlib.sha256()
    architecture = _architecture(directory)[1]
    paths = [os.path.join(directory, name) for name in FILES] + ([architecture] if os.path.isfile(architecture) else [])
    for path in paths:
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def efml_model_dir(directory: str | os.PathLike, *, cache: str | None = None) -> str:
    """The model directory converted from the EFML model directory `directory`, in the cache
    (`storage.cache_home`: models/efml-dir-DIGEST, the digest of its files): converted (`read_efml`,
    `model_dir.write_model_dir`, published whole) the first time, read as it is afterwards."""
    directory = os.path.abspath(os.fspath(directory))
    target = os.path.join(cache or cache_dir(), "models", f"efml-dir-{efml_digest(directory)[:16]}")
    if not is_model_directory(target):
        params = read_efml(directory)  # a bad directory leaves nothing in the cache
        os.makedirs(os.path.dirname(target), exist_ok=True)
        model_dir.write_model_dir(
            params, target, source=f"ELMoForManyLangs model directory {directory}", overwrite=True
        )
    return target
