"""A biLM's own character vocabulary, counted from its training text (`config.data.characters =
"corpus"`), the way the word vocabulary is (`vocab_builder`): for text whose characters are many and
wide in UTF-8 (Chinese: 3 bytes each), so that the char CNN reads one id per character and the token
limit counts characters (C - 2 of them), as ELMoForManyLangs' models do.

    characters = build_characters(word_counts)               # the corpus's characters, most frequent first
    write_characters(path, characters); read_characters(path)   # WORKDIR/characters.json
    config = dataclasses.replace(config, **model_fields(characters))
    vocabulary = token_vocabulary(config, characters)            # what the stream and the export use

Raw character ids: 0-4 the specials (bos, eos, bow, eow, pad: `model.config.CHAR_SPECIALS`' order), 5 a
character the vocabulary lacks, then the characters from 6 on. The sentence boundaries are bilm-tf's
`<S>` and `</S>` (the batch stream's), each read as [bow, bos or eos, eow, pad, ...]
(`model.vocabulary`, which owns text -> ids).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping

from elmo_jax import storage
from elmo_jax.formats.vocab_file import SPECIALS
from elmo_jax.model.chars import BOS_TOKEN, EOS_TOKEN
from elmo_jax.model.config import CHAR_SPECIALS, BiLMConfig
from elmo_jax.model.vocabulary import TokenVocabulary

FILE = "characters.json"  # in the workdir, beside vocab.txt
FORMAT = "elmo-jax training characters"
SPECIAL_IDS = tuple(range(len(CHAR_SPECIALS)))  # bos, eos, bow, eow, pad
UNKNOWN = len(CHAR_SPECIALS)
FIRST = UNKNOWN + 1
CHARACTERS = ("bytes", "corpus")  # config.data.characters


def build_characters(word_counts: Mapping[str, int]) -> list[str]:
    """The characters of the counted words (reserved tokens `<S>`, `</S>` and `<UNK>` left out), by
    descending count (a word's count for each of its characters), ties in code-point order."""
    counts: collections.Counter = collections.Counter()
    for word, n in word_counts.items():
        if word in SPECIALS:
            continue
        for c in word:
            counts[c] += n
    return [c for c, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def model_fields(characters: list[str]) -> dict:
    """The `BiLMConfig` fields of a model that reads these characters."""
    return {"char_vocab_size": FIRST + len(characters), "char_specials": SPECIAL_IDS}


def token_vocabulary(config: BiLMConfig, characters: list[str]) -> TokenVocabulary:
    """Text -> ids of a model with `model_fields(characters)` (`config` carries them)."""
    ids = {c: FIRST + i for i, c in enumerate(characters)}
    return TokenVocabulary(config, ids, UNKNOWN, boundary_tokens=(BOS_TOKEN, EOS_TOKEN))


def write_characters(path: str, characters: list[str]) -> None:
    """`characters` as JSON at `path` (local or gs://), whole or not at all."""
    storage.write_text(path, json.dumps({"format": FORMAT, "characters": characters}, ensure_ascii=False) + "\n")


def read_characters(path: str) -> list[str]:
    """The characters `write_characters` wrote.

    Raises:
      ValueError: not such a file (the message names it); OSError: it cannot be read.
    """
    try:
        data = json.loads(storage.read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a JSON file of training characters ({e})") from None
    characters = data.get("characters") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(characters, list) or not all(isinstance(c, str) and len(c) == 1 for c in characters):
        raise ValueError(f'{path}: expected {{"format": "{FORMAT}", "characters": [one character each, ...]}}')
    if len(set(characters)) != len(characters):
        raise ValueError(f"{path}: a character is listed twice")
    return characters
