"""A model's text -> ids: the one owner every path asks (`token_vocabulary(params)`).

    ids = elmo_jax.token_vocabulary(params).batch_ids([["今天", "天气", "很", "好"]])  # any model
    layers, mask = elmo_jax.embed(params, ids)

A biLM reads each token as `ids_per_token` int32 ids, shifted by one so that 0 marks a padding token:
C character ids, then (for a model with a word embedding) its word id. Which ids a text gets is the
model's, so it travels with the parameters (`BiLMParams.vocabulary`), and the library, `embed_file`,
the service and the exported extractor all take it from there:

- UTF-8 bytes (bilm-tf and AllenNLP's models, `BiLMParams.vocabulary` None): `chars.py`'s rule, tokens
  cut to C-2 bytes, `<S>`/`</S>` the boundaries;
- a model's own character vocabulary, with or without a word vocabulary (ELMoForManyLangs' char.dic and
  word.dic, docs/MANY_LANGUAGES.md): a token is [bow, one id per Unicode character (the unknown
  character's id for one the vocabulary lacks), eow, pad, ...] and its word's id (the unknown word's
  id), both taken after cutting it to its first C-2 characters; `<bos>`/`<eos>` the boundaries.

The ids the model itself needs inside a jitted program (the boundary tokens, the padding character)
follow from the config alone (`boundary_ids`, `pad_id`); the strings live here. Shapes: B sentences,
T tokens, W = `ids_per_token`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from absl import logging

from elmo_jax.model import chars
from elmo_jax.model.config import BiLMConfig

FORMAT = "elmo-jax token vocabulary"


def byte_boundary_ids(which: str, max_characters_per_token: int) -> np.ndarray:
    """Shifted ids int32 (C,) of a bytes model's sentence-boundary token `which` ("bos" or "eos")."""
    char = (chars.BOS_CHAR, chars.EOS_CHAR)[("bos", "eos").index(which)]
    return chars.boundary_char_ids(char, max_characters_per_token) + 1


def boundary_ids(config: BiLMConfig, which: str) -> np.ndarray:
    """Shifted ids int32 (W,) of the sentence-boundary token `which` ("bos" or "eos")."""
    index = ("bos", "eos").index(which)
    C = config.max_characters_per_token
    if not config.char_vocab_size:
        return byte_boundary_ids(which, C)
    bos, eos, bow, eow, pad = config.char_specials
    ids = np.full((config.ids_per_token,), pad + 1, np.int32)
    ids[:3] = (bow + 1, (bos, eos)[index] + 1, eow + 1)
    if config.has_words:
        ids[C] = config.word_specials[index] + 1
    return ids


def pad_id(config: BiLMConfig) -> int:
    """The shifted id of the padding character within a token (after its eow)."""
    return (config.char_specials[4] if config.char_vocab_size else chars.PAD_CHAR) + 1


class TokenVocabulary:
    """Tokens to a model's ids (see the module doc); compare and hash by content.

    Args:
      config: the model's architecture (C, the specials, whether it has words).
      characters: a vocabulary model's {character: raw id}; None for UTF-8 bytes.
      unknown_character: the raw id of a character `characters` lacks.
      words, unknown_word: the same for words (a model with a word embedding).
      boundary_tokens: the literal tokens that stand for the sentence boundaries.
    """

    def __init__(
        self,
        config: BiLMConfig,
        characters: Mapping[str, int] | None = None,
        unknown_character: int | None = None,
        words: Mapping[str, int] | None = None,
        unknown_word: int | None = None,
        boundary_tokens: tuple[str, str] = (chars.BOS_TOKEN, chars.EOS_TOKEN),
    ):
        self.config, self.C, self.width = config, config.max_characters_per_token, config.ids_per_token
        self.characters, self.unknown_character = characters, unknown_character
        self.words, self.unknown_word = words, unknown_word
        self.boundary_tokens = tuple(boundary_tokens)
        problem = _problem(self)
        if problem:
            raise ValueError(f"token vocabulary: {problem}")
        self._boundaries = {t: boundary_ids(config, w) for t, w in zip(self.boundary_tokens, ("bos", "eos"))}
        self.digest = hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    @property
    def is_bytes(self) -> bool:
        return self.characters is None

    def __eq__(self, other) -> bool:
        return isinstance(other, TokenVocabulary) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        kind = "UTF-8 bytes" if self.is_bytes else f"{len(self.characters)} characters"
        return f"TokenVocabulary({kind}, {len(self.words or ())} words, C={self.C})"

    def is_truncated(self, token: str) -> bool:
        """Whether `token` is cut to its first C-2 bytes (or characters); boundary tokens never are."""
        if self.is_bytes:
            return chars.is_truncated(token, self.C)
        return len(token) > self.C - 2 and token not in self._boundaries

    def count_truncated(self, sentences: Iterable[Sequence[str]]) -> int:
        """How many tokens of `sentences` are cut."""
        if self.is_bytes:
            return chars.count_truncated(sentences, self.C)
        return sum(self.is_truncated(token) for sentence in sentences for token in sentence if len(token) > self.C - 2)

    def truncation_note(self, truncated: int, tokens: int) -> str:
        """The one sentence that says `truncated` of `tokens` tokens were cut."""
        if self.is_bytes:
            return chars.truncation_note(truncated, tokens, self.C)
        limit = self.C - 2
        return (
            f"{truncated:,} of {tokens:,} tokens are longer than the model's {limit} characters and were cut to "
            f"{limit} ({chars.LONG_TOKENS_DOC})"
        )

    def warn_truncated(self, truncated: int, tokens: int) -> None:
        """Logs `truncation_note` as a warning when any token was cut."""
        if truncated:
            logging.warning("%s", self.truncation_note(truncated, tokens))

    def token_ids(self, token: str) -> np.ndarray:
        """Shifted ids int32 (W,) of one token, cut silently (callers count with `is_truncated`)."""
        if self.is_bytes:
            return chars.token_to_raw_ids(token, self.C) + 1
        if not isinstance(token, str):
            raise ValueError(f"a token must be a str, found {type(token).__name__}: {token!r}")
        boundary = self._boundaries.get(token)
        if boundary is not None:
            return boundary.copy()
        _, _, bow, eow, pad = self.config.char_specials
        kept = token[: self.C - 2]
        ids = np.full((self.width,), pad + 1, np.int32)
        ids[0] = bow + 1
        ids[1 : 1 + len(kept)] = [self.characters.get(c, self.unknown_character) + 1 for c in kept]
        ids[1 + len(kept)] = eow + 1
        if self.words is not None:
            ids[self.C] = self.words.get(kept, self.unknown_word) + 1
        return ids

    def batch_ids(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
        """Shifted ids int32 (B, T, W) of tokenized sentences, zeros for padding tokens (`chars.batch_to_ids`
        for a bytes model); one warning says how many tokens were cut."""
        if self.is_bytes:
            return chars.batch_to_ids(sentences, self.C)
        if isinstance(sentences, str) or not isinstance(sentences, Sequence) or len(sentences) == 0:
            raise ValueError("sentences must be a non-empty list of tokenized sentences (lists of str)")
        for b, sentence in enumerate(sentences):
            chars.check_sentence(sentence, b)
        out = np.zeros((len(sentences), max(map(len, sentences)), self.width), np.int32)
        for b, sentence in enumerate(sentences):
            for t, token in enumerate(sentence):
                out[b, t] = self.token_ids(token)
        self.warn_truncated(self.count_truncated(sentences), sum(map(len, sentences)))
        return out

    def to_json(self) -> dict:
        """The vocabulary file's content (`from_json` reads it back): `"characters": "bytes"` for a bytes
        model, else the characters and words with their raw ids, the unknown ones' ids and the boundary
        tokens."""
        if self.is_bytes:
            return {"format": FORMAT, "characters": "bytes", "max_characters_per_token": self.C}
        return {
            "format": FORMAT,
            "characters": dict(self.characters),
            "unknown_character": self.unknown_character,
            "words": None if self.words is None else dict(self.words),
            "unknown_word": self.unknown_word,
            "boundary_tokens": list(self.boundary_tokens),
        }

    @classmethod
    def from_json(cls, data, config: BiLMConfig, source: str) -> TokenVocabulary:
        """The vocabulary of `to_json`'s dict; errors name `source` and the key."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ValueError(f'{source}: not an elmo-jax token vocabulary (expected "format": "{FORMAT}")')
        if data.get("characters") == "bytes":
            return cls(config)
        for key, kind in (("characters", Mapping), ("unknown_character", int), ("boundary_tokens", list)):
            if not isinstance(data.get(key), kind):
                raise ValueError(f"{source}: missing or invalid key {key!r}")
        try:
            return cls(
                config,
                data["characters"],
                data["unknown_character"],
                data.get("words"),
                data.get("unknown_word"),
                tuple(data["boundary_tokens"]),
            )
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None


def _problem(v: TokenVocabulary) -> str | None:
    """What makes `v` unusable with its config, or None."""
    c = v.config
    if v.is_bytes:
        return "a model with a character vocabulary needs its characters" if c.char_vocab_size else None
    if not c.char_vocab_size:
        return "the model reads UTF-8 bytes (char_cnn.characters), not a character vocabulary"
    ids = list(v.characters.values()) + [v.unknown_character]
    if not all(isinstance(i, int) and 0 <= i < c.char_vocab_size for i in ids):
        return f"character ids must be integers in [0, {c.char_vocab_size}) (the model's char_embed rows)"
    if (v.words is not None) != c.has_words:
        return "words are given for a model without a word embedding, or missing for one with it"
    if v.words is not None:
        ids = list(v.words.values()) + [v.unknown_word]
        if not all(isinstance(i, int) and 0 <= i < c.word_vocab_size for i in ids):
            return f"word ids must be integers in [0, {c.word_vocab_size}) (the model's word_embed rows)"
    if len(v.boundary_tokens) != 2 or not all(isinstance(t, str) for t in v.boundary_tokens):
        return f"boundary_tokens must be two strings, found {v.boundary_tokens!r}"
    return None


def token_vocabulary(params) -> TokenVocabulary:
    """The vocabulary of a `BiLMParams` (UTF-8 bytes when it carries none)."""
    vocabulary = getattr(params, "vocabulary", None)
    return vocabulary if vocabulary is not None else TokenVocabulary(params.config)
