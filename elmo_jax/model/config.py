"""The static hyper-parameters of an ELMo biLM, and the options JSON that describes them.

`BiLMConfig` is frozen and hashable: it travels with the parameters as pytree metadata (see
`params.BiLMParams`), so a jitted function specialises on it instead of tracing it.

The options JSON is the format bilm-tf writes and AllenNLP reads:
`{"lstm": {dim, projection_dim, n_layers, cell_clip, proj_clip, use_skip_connections},
  "char_cnn": {activation, embedding: {dim}, filters, n_highway, n_characters, max_characters_per_token},
  ...training keys...}`.

The same functions also run ELMoForManyLangs' token encoder (HIT-SCIR's models, docs/MANY_LANGUAGES.md),
as options of this one architecture, each written to the options JSON only when it is not bilm-tf's:
- a model's own character vocabulary instead of UTF-8 bytes (`char_vocab_size`, `char_specials`;
  `"char_cnn": {"characters": "vocabulary", "n_characters": n + 1, "special_characters": {bos, ...}}`);
- a word embedding concatenated with the char CNN's highway output before the projection
  (`word_vocab_size`, `word_dim`, `word_specials`; `"word_embedding": {n_words, dim, special_words}`);
- a plain LSTM whose outputs are projected afterwards (`lstm_output_projection`;
  `"lstm": {"projection": "output"}`), ELMoForManyLangs' "lstm" encoder.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

# Raw character ids are 0..260 (256 bytes + 5 specials); inference shifts them by one so that 0 means
# "no token". bilm-tf writes n_characters=261 in training options and 262 in inference options.
N_RAW_CHARACTERS = 261
N_SHIFTED_CHARACTERS = 262
ACTIVATIONS = ("relu", "tanh")

# Raw ids a vocabulary model's `char_specials` name, in this order (bytes models: 256..260, `chars.py`).
CHAR_SPECIALS = ("bos", "eos", "bow", "eow", "pad")
WORD_SPECIALS = ("bos", "eos")  # raw word ids of the sentence-boundary tokens

# The published filter bank: widths 1..7, 2048 filters in all.
PUBLISHED_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


class InvalidBiLMConfig(ValueError):
    """An architecture that cannot be built; `problems` holds (field, what is wrong) for each problem."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("invalid biLM config: " + "; ".join(text for _, text in problems))
        self.problems = problems


@dataclasses.dataclass(frozen=True)
class BiLMConfig:
    """Architecture of a character-CNN biLM (everything an options file can describe).

    Attributes:
      char_embed_dim: E, width of the character embedding.
      filters: ((width, n_filters), ...) one 1-D convolution per entry.
      n_highway: number of highway layers after the convolutions (0 for none).
      activation: "relu" or "tanh", applied after max-pooling each convolution.
      max_characters_per_token: C, character slots per token (BOW, bytes, EOW, padding).
      lstm_dim: H, LSTM cell size.
      projection_dim: P, projected LSTM output and token embedding width. The LSTM has a projection
        matrix only when P < H (bilm-tf semantics); the char CNN has one only when sum(n_filters) != P.
      n_layers: LSTM layers per direction.
      cell_clip: clip of the LSTM cell state, or None.
      proj_clip: clip of the projected LSTM output, or None.
      use_skip_connections: add each LSTM layer's input to its output, for layers above the first.
      extra_options: the options file's other keys (training settings) as canonical JSON, kept so that
        a loaded-then-saved options file loses nothing.
      char_vocab_size: 0 for UTF-8 bytes (bilm-tf: 261 raw ids, `chars.py`); n for a model's own character
        vocabulary of n raw ids (`vocabulary.TokenVocabulary`), whose specials `char_specials` names.
      char_specials: a vocabulary model's raw character ids of (bos, eos, bow, eow, pad) (`CHAR_SPECIALS`):
        a token is [bow, its characters, eow, pad, ...], a sentence boundary [bow, bos or eos, eow, pad...].
      word_vocab_size, word_dim: a word embedding of that many words and that width (0: none); each token
        then carries its word id after its C character ids, and the token layer projects
        [word vector ; char CNN output] (ELMoForManyLangs' ConvTokenEmbedder), always with a projection.
      word_specials: the raw word ids of the sentence boundaries (bos, eos).
      lstm_output_projection: False: bilm-tf's LSTM, projected inside the recurrence when P < H. True: a
        plain LSTM of H cells (no clips), each direction's output projected to P afterwards by one shared
        affine map (ELMoForManyLangs' "lstm" encoder; one layer only).
    """

    char_embed_dim: int = 16
    filters: tuple[tuple[int, int], ...] = PUBLISHED_FILTERS
    n_highway: int = 2
    activation: str = "relu"
    max_characters_per_token: int = 50
    lstm_dim: int = 4096
    projection_dim: int = 512
    n_layers: int = 2
    cell_clip: float | None = 3.0
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True
    extra_options: str = "{}"
    char_vocab_size: int = 0
    char_specials: tuple[int, ...] = ()
    word_vocab_size: int = 0
    word_dim: int = 0
    word_specials: tuple[int, ...] = ()
    lstm_output_projection: bool = False

    def __post_init__(self):
        object.__setattr__(self, "filters", tuple((int(w), int(n)) for w, n in self.filters))
        object.__setattr__(self, "char_specials", tuple(int(i) for i in self.char_specials))
        object.__setattr__(self, "word_specials", tuple(int(i) for i in self.word_specials))
        problems = config_problems(self)
        if problems:
            raise InvalidBiLMConfig(problems)

    @property
    def n_filters(self) -> int:
        """Width of the concatenated convolution outputs (2048 for the published models)."""
        return sum(n for _, n in self.filters)

    @property
    def has_cnn_projection(self) -> bool:
        """Whether the token layer ends in a projection: bilm-tf's only when the filters are not P wide;
        always with a word embedding (ELMoForManyLangs projects [word ; char CNN] whatever the widths)."""
        return self.word_dim > 0 or self.n_filters != self.projection_dim

    @property
    def has_lstm_projection(self) -> bool:
        """Whether the LSTM projects its output inside the recurrence (bilm-tf's, when P < H)."""
        return self.projection_dim < self.lstm_dim and not self.lstm_output_projection

    @property
    def state_dim(self) -> int:
        """Width of the LSTM's carried output h: P, or H for `lstm_output_projection`."""
        return self.lstm_dim if self.lstm_output_projection else self.projection_dim

    @property
    def n_raw_characters(self) -> int:
        """Rows of `char_embed`: 261 for bytes, the vocabulary's size otherwise."""
        return self.char_vocab_size or N_RAW_CHARACTERS

    @property
    def has_words(self) -> bool:
        """Whether each token carries a word id (in slot C, after its characters)."""
        return self.word_dim > 0

    @property
    def ids_per_token(self) -> int:
        """Ids per token in an id array (B, T, ·): C characters, and the word id after them."""
        return self.max_characters_per_token + (1 if self.has_words else 0)

    @property
    def output_dim(self) -> int:
        """Width of each output layer: forward and backward concatenated (2P)."""
        return 2 * self.projection_dim

    @property
    def n_output_layers(self) -> int:
        """Token layer plus one per LSTM layer."""
        return self.n_layers + 1

    def to_options(self) -> dict[str, Any]:
        """The options dict in the published (inference) format."""
        options = json.loads(self.extra_options)
        options["lstm"] = {
            "dim": self.lstm_dim,
            "projection_dim": self.projection_dim,
            "n_layers": self.n_layers,
            "cell_clip": self.cell_clip,
            "proj_clip": self.proj_clip,
            "use_skip_connections": self.use_skip_connections,
        }
        options["char_cnn"] = {
            "activation": self.activation,
            "embedding": {"dim": self.char_embed_dim},
            "filters": [list(f) for f in self.filters],
            "n_highway": self.n_highway,
            "n_characters": N_SHIFTED_CHARACTERS,
            "max_characters_per_token": self.max_characters_per_token,
        }
        _put_token_options(self, options)
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, Any], source: str = "options") -> BiLMConfig:
        """Parses an options dict; errors name `source` and the offending key."""
        if not isinstance(options, Mapping):
            raise ValueError(f"{source}: expected a JSON object at the top level, found {type(options).__name__}")
        lstm = _section(options, "lstm", source)
        cnn = _section(options, "char_cnn", source)
        embedding = _section(cnn, "embedding", f"{source}: char_cnn")
        token_fields = _token_fields(options, source)
        n_characters = _get(cnn, "n_characters", int, source, "char_cnn", default=N_SHIFTED_CHARACTERS)
        if not token_fields["char_vocab_size"] and n_characters not in (N_RAW_CHARACTERS, N_SHIFTED_CHARACTERS):
            raise ValueError(
                f"{source}: char_cnn.n_characters must be 261 (training) or 262 (inference), found {n_characters}"
            )
        filters = cnn.get("filters")
        if (
            not isinstance(filters, list)
            or not filters
            or not all(isinstance(f, list) and len(f) == 2 and all(_is_int(v) for v in f) for f in filters)
        ):
            raise ValueError(
                f"{source}: char_cnn.filters must be a non-empty list of [width, n_filters] "
                f"integer pairs, found {filters!r}"
            )
        extra = {k: v for k, v in options.items() if k not in ("lstm", "char_cnn", "word_embedding")}
        try:
            return cls(
                char_embed_dim=_get(embedding, "dim", int, source, "char_cnn.embedding"),
                filters=tuple(tuple(f) for f in filters),
                n_highway=_get(cnn, "n_highway", int, source, "char_cnn", default=0) or 0,
                activation=_get(cnn, "activation", str, source, "char_cnn"),
                max_characters_per_token=_get(cnn, "max_characters_per_token", int, source, "char_cnn"),
                lstm_dim=_get(lstm, "dim", int, source, "lstm"),
                projection_dim=_get(lstm, "projection_dim", int, source, "lstm"),
                n_layers=_get(lstm, "n_layers", int, source, "lstm", default=1),
                cell_clip=_get(lstm, "cell_clip", float, source, "lstm", default=None),
                proj_clip=_get(lstm, "proj_clip", float, source, "lstm", default=None),
                use_skip_connections=bool(_get(lstm, "use_skip_connections", bool, source, "lstm", default=False)),
                extra_options=json.dumps(extra, sort_keys=True),
                **token_fields,
            )
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    @classmethod
    def preset(cls, name: str) -> BiLMConfig:
        """A published model size: "small", "medium" or "original" (see docs/ELMO.md)."""
        try:
            lstm_dim, projection_dim, n_highway = PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown model size {name!r}; expected one of {sorted(PRESETS)}") from None
        return cls(lstm_dim=lstm_dim, projection_dim=projection_dim, n_highway=n_highway)


# name -> (H, P, n_highway); the rest is shared by all published models.
PRESETS = {"small": (1024, 128, 1), "medium": (2048, 256, 1), "original": (4096, 512, 2)}


def _put_token_options(c: BiLMConfig, options: dict[str, Any]) -> None:
    """Writes the options that are not bilm-tf's (a character vocabulary, a word embedding, an output
    projection) into `options`, and nothing for a bilm-tf model (its options file stays as it was)."""
    if c.char_vocab_size:
        options["char_cnn"]["characters"] = "vocabulary"
        options["char_cnn"]["n_characters"] = c.char_vocab_size + 1
        options["char_cnn"]["special_characters"] = dict(zip(CHAR_SPECIALS, c.char_specials))
    if c.has_words:
        options["word_embedding"] = {
            "n_words": c.word_vocab_size,
            "dim": c.word_dim,
            "special_words": dict(zip(WORD_SPECIALS, c.word_specials)),
        }
    if c.lstm_output_projection:
        options["lstm"]["projection"] = "output"


def _token_fields(options: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`BiLMConfig`'s vocabulary, word and output-projection fields from an options dict (their defaults
    when the keys are absent, as in every bilm-tf file); errors name `source` and the key."""
    cnn, lstm = options["char_cnn"], options["lstm"]
    fields: dict[str, Any] = {}
    characters = cnn.get("characters", "bytes")
    if characters not in ("bytes", "vocabulary"):
        raise ValueError(f'{source}: char_cnn.characters must be "bytes" or "vocabulary", found {characters!r}')
    if characters == "vocabulary":
        fields["char_vocab_size"] = _get(cnn, "n_characters", int, source, "char_cnn") - 1
        fields["char_specials"] = _specials(cnn, "special_characters", CHAR_SPECIALS, source, "char_cnn")
    else:
        fields["char_vocab_size"] = 0
    words = options.get("word_embedding")
    if words is not None:
        if not isinstance(words, Mapping):
            raise ValueError(f"{source}: word_embedding must be a JSON object, found {words!r}")
        fields["word_vocab_size"] = _get(words, "n_words", int, source, "word_embedding")
        fields["word_dim"] = _get(words, "dim", int, source, "word_embedding")
        fields["word_specials"] = _specials(words, "special_words", WORD_SPECIALS, source, "word_embedding")
    projection = lstm.get("projection", "recurrent")
    if projection not in ("recurrent", "output"):
        raise ValueError(f'{source}: lstm.projection must be "recurrent" or "output", found {projection!r}')
    fields["lstm_output_projection"] = projection == "output"
    return fields


def _specials(section, key, names, source, where) -> tuple[int, ...]:
    value = section.get(key)
    if not isinstance(value, Mapping) or set(value) != set(names) or not all(_is_int(value[n]) for n in names):
        raise ValueError(f"{source}: {where}.{key} must map each of {list(names)} to an integer id, found {value!r}")
    return tuple(value[n] for n in names)


def read_options(path: str | os.PathLike) -> BiLMConfig:
    """Reads an options JSON file into a config, with errors that name the file (and line)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: expected an options JSON file, found a directory")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: options file not found")
    try:
        with open(path, encoding="utf-8") as f:
            options = json.load(f)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: options file is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    return BiLMConfig.from_options(options, source=path)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _section(options: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    value = options.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{source}: missing or invalid section {key!r} (expected a JSON object)")
    return value


_MISSING = object()


def _get(section, key, kind, source, where, default=_MISSING):
    value = section.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{source}: missing key {where}.{key}")
    if value is None:
        return None
    ok = {
        int: _is_int(value),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }[kind]
    if not ok:
        raise ValueError(f"{source}: {where}.{key} must be {kind.__name__}, found {value!r}")
    return kind(value)


def config_problems(c: BiLMConfig) -> list[tuple[str, str]]:
    """(field, what is wrong) for each problem of an architecture, the field being the one to change."""
    problems = []
    for name in ("char_embed_dim", "max_characters_per_token", "lstm_dim", "projection_dim", "n_layers"):
        if getattr(c, name) < 1:
            problems.append((name, f"{name} must be >= 1, found {getattr(c, name)}"))
    if c.n_highway < 0:
        problems.append(("n_highway", f"n_highway must be >= 0, found {c.n_highway}"))
    if c.activation not in ACTIVATIONS:
        problems.append(("activation", f"activation must be one of {ACTIVATIONS}, found {c.activation!r}"))
    if c.max_characters_per_token < 3:
        problems.append(("max_characters_per_token", "max_characters_per_token must be >= 3 (BOW, one byte, EOW)"))
    for width, num in c.filters:
        if width < 1 or num < 1:
            problems.append(("filters", f"filter {[width, num]} must have width >= 1 and n_filters >= 1"))
        elif width > c.max_characters_per_token:
            problems.append(
                ("filters", f"filter width {width} exceeds max_characters_per_token {c.max_characters_per_token}")
            )
    if c.projection_dim > c.lstm_dim:
        problems.append(("projection_dim", f"projection_dim {c.projection_dim} exceeds lstm dim {c.lstm_dim}"))
    if c.has_cnn_projection and c.n_filters < c.projection_dim:
        problems.append(
            ("filters", f"the char CNN has {c.n_filters} filters, fewer than projection_dim {c.projection_dim}")
        )
    for name in ("cell_clip", "proj_clip"):
        value = getattr(c, name)
        if value is not None and value <= 0:
            problems.append((name, f"{name} must be positive or None, found {value}"))
    return problems + _token_problems(c)


def _token_problems(c: BiLMConfig) -> list[tuple[str, str]]:
    """The problems of the options that are not bilm-tf's (`config_problems`)."""
    problems = []
    if c.char_vocab_size < 0:
        problems.append(("char_vocab_size", f"char_vocab_size must be >= 0, found {c.char_vocab_size}"))
    elif c.char_vocab_size and (
        len(c.char_specials) != len(CHAR_SPECIALS) or not all(0 <= i < c.char_vocab_size for i in c.char_specials)
    ):
        problems.append(
            (
                "char_specials",
                f"char_specials must be {len(CHAR_SPECIALS)} ids {CHAR_SPECIALS} in "
                f"[0, {c.char_vocab_size}), found {c.char_specials}",
            )
        )
    elif not c.char_vocab_size and c.char_specials:
        problems.append(("char_specials", "char_specials is for a character vocabulary (char_vocab_size > 0)"))
    if (c.word_dim > 0) != (c.word_vocab_size > 0) or c.word_dim < 0:
        problems.append(
            (
                "word_dim",
                f"word_dim and word_vocab_size must both be positive or both 0, found {c.word_dim} and "
                f"{c.word_vocab_size}",
            )
        )
    elif c.word_dim and not c.char_vocab_size:
        problems.append(("word_dim", "a word embedding goes with a character vocabulary (char_vocab_size > 0)"))
    elif c.word_dim and (len(c.word_specials) != 2 or not all(0 <= i < c.word_vocab_size for i in c.word_specials)):
        problems.append(
            (
                "word_specials",
                f"word_specials must be 2 ids {WORD_SPECIALS} in [0, {c.word_vocab_size}), found {c.word_specials}",
            )
        )
    if c.lstm_output_projection and c.n_layers != 1:
        problems.append(
            (
                "n_layers",
                "an output-projected LSTM (ELMoForManyLangs' 'lstm' encoder) has one layer here: a "
                f"deeper bidirectional nn.LSTM feeds both directions into each layer above, found {c.n_layers}",
            )
        )
    return problems
