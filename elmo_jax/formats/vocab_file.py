"""Word vocabularies in the bilm-tf file format.

File format: UTF-8, one token per line; the line order gives the ids. `<S>`, `</S>` and `<UNK>` must
be present; bilm-tf writes them first (ids 0, 1, 2) followed by the words in descending frequency,
which the log-uniform negative sampler of the training softmax relies on. Files written by bilm-tf's
own tooling may contain a line `!!!MAXTERMID`; it is not a token, takes no id and is skipped.

Loading is as lenient as bilm-tf's `Vocabulary` where that is harmless: blank lines and repeated tokens
are accepted, and skipped here (they take no id; one warning per file counts them and names the first
of each). bilm-tf gives each of them an id of its own: a blank line's entry is a word no text contains,
and a repeated token is looked up at its last line, leaving the rows of its earlier lines unused. So
past the first skipped line the ids here are smaller than bilm-tf's; nothing depends on that, since
bilm-tf's published weights hold no softmax. Loading stays strict where the result would be wrong: a
missing `<S>`, `</S>` or `<UNK>` (bilm-tf's training refuses that too), a line holding two tokens (e.g.
a "word count" file, whose words would never match), invalid UTF-8, an empty file.

A literal `<S>`, `</S>` or `<UNK>` in a sentence maps to the reserved id when encoded, as in bilm-tf.
Building a vocabulary from a corpus is `elmo_jax.data.vocab_builder`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence

import numpy as np
from absl import logging

from elmo_jax import storage
from elmo_jax.formats.output_paths import Artifact
from elmo_jax.formats.text_lines import line_text

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIALS = (BOS, EOS, UNK)
MAX_TERM_ID = "!!!MAXTERMID"  # bilm-tf bookkeeping line, not a token


class Vocab:
    """An ordered word list with O(1) lookups; ids are positions in `words`.

    Attributes:
      words: the tokens in id order (V entries).
      bos_id, eos_id, unk_id: the ids of `<S>`, `</S>`, `<UNK>`.
    """

    def __init__(self, words: Sequence[str], *, source: str = "<vocab>", line_numbers: Sequence[int] | None = None):
        """Checks and indexes `words`.

        Args:
          words: the tokens in id order.
          source: names the origin in error messages (a file path when loaded).
          line_numbers: the file line of each word, for error messages; default 1..V.

        Raises:
          ValueError: an empty list, an empty token or one with whitespace inside, a duplicate
            (both places named), or a missing `<S>`/`</S>`/`<UNK>` (which one is named).
        """
        lines = list(line_numbers) if line_numbers is not None else list(range(1, len(words) + 1))
        if not words:
            raise ValueError(f"{source}: no tokens; expected one token per line, including {', '.join(SPECIALS)}")
        self._word_to_id: dict[str, int] = {}
        for index, (word, line) in enumerate(zip(words, lines)):
            if not isinstance(word, str) or not word or len(word.split()) != 1 or word != word.strip():
                raise ValueError(f"{source}:{line}: expected one token without whitespace, found {word!r}")
            first = self._word_to_id.setdefault(word, index)
            if first != index:
                raise ValueError(f"{source}:{line}: duplicate token {word!r}, first on line {lines[first]}")
        missing = [special for special in SPECIALS if special not in self._word_to_id]
        if missing:
            raise ValueError(
                f"{source}: missing {', '.join(missing)}; a vocabulary must contain "
                f"{', '.join(SPECIALS)} (bilm-tf writes them as the first three lines)"
            )
        self.words: list[str] = list(words)
        self.bos_id, self.eos_id, self.unk_id = (self._word_to_id[s] for s in SPECIALS)
        self.skipped_lines: dict[str, int] = {"blank": 0, "duplicate": 0}  # lines `load` skipped

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocab:
        """Reads a bilm-tf vocabulary file.

        Surrounding whitespace on a line is ignored, as in bilm-tf; a UTF-8 byte-order mark at the start
        of the file is removed, as the corpus reader does. Blank lines and repeated tokens are skipped
        (the first line of a token gives its id) with one warning per file that counts them; the counts
        are in `skipped_lines`.

        Raises:
          FileNotFoundError, IsADirectoryError: no such file.
          ValueError: the file, line and problem: invalid UTF-8, a line with whitespace inside its
            token, no token at all, or a missing `<S>`, `</S>` or `<UNK>`.
        """
        path = os.fspath(path)
        words, lines, skipped = _read_words(path)
        vocab = cls(words, source=path, line_numbers=lines)
        vocab.skipped_lines = {kind: len(where) for kind, where in skipped.items()}
        if any(skipped.values()):
            _warn_once(path, skipped)
        return vocab

    def save(self, path: str | os.PathLike) -> None:
        """Writes one token per line; an existing file is only ever replaced by a complete new one (a local
        file is staged and renamed, an object in a bucket is one upload)."""
        storage.write_bytes(path, "".join(word + "\n" for word in self.words).encode("utf-8"))

    def sha256(self) -> str:
        """A digest of the words in id order: two vocabularies give the same ids exactly when it matches."""
        return hashlib.sha256("\n".join(self.words).encode("utf-8")).hexdigest()

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self._word_to_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.words == other.words

    def __repr__(self) -> str:
        return f"Vocab({len(self)} words: {' '.join(self.words[:6])}{' ...' if len(self) > 6 else ''})"

    def word_to_id(self, word: str) -> int:
        """The id of `word`; `unk_id` for a word not in the vocabulary."""
        return self._word_to_id.get(word, self.unk_id)

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Ids of `tokens` (T,) int32, OOV -> `unk_id`. No `<S>`/`</S>` are added."""
        lookup, unk = self._word_to_id.get, self.unk_id
        return np.fromiter((lookup(token, unk) for token in tokens), dtype=np.int32)


def _read_words(path: str) -> tuple[list[str], list[int], dict[str, list[tuple[int, str, int]]]]:
    """(words, their line numbers, skipped lines by kind: "blank" and "duplicate" -> [(line, word,
    line of its first occurrence)])."""
    if storage.isdir(path):
        raise IsADirectoryError(f"vocabulary {path} is a directory, expected a file with one token per line")
    if not storage.exists(path):
        raise FileNotFoundError(f"vocabulary file {path} does not exist")
    words, lines, first_line = [], [], {}
    skipped: dict[str, list[tuple[int, str, int]]] = {"blank": [], "duplicate": []}
    with storage.open_file(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:  # the text-file rule (`text_lines`): a BOM at the start is no part of <S>, "\r\n" ends a line
                word = line_text(raw, number).strip()
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if word == MAX_TERM_ID:
                continue
            if not word:
                skipped["blank"].append((number, word, number))
            elif word in first_line:
                skipped["duplicate"].append((number, word, first_line[word]))
            else:
                first_line[word] = number
                words.append(word)
                lines.append(number)
    return words, lines, skipped


_WARNED: set[tuple[str, int, int]] = set()  # (file, size, mtime) already reported in this process


def _warn_once(path: str, skipped: dict[str, list[tuple[int, str, int]]]) -> None:
    """One warning per file (a run loads its vocabulary several times) counting the skipped lines."""
    key = storage.version(path)
    if key in _WARNED:
        return
    _WARNED.add(key)
    parts = []
    if skipped["duplicate"]:
        line, word, first = skipped["duplicate"][0]
        parts.append(
            f"{len(skipped['duplicate'])} repeated token(s) (the first: {word!r} on line {line}, first on line {first})"
        )
    if skipped["blank"]:
        parts.append(f"{len(skipped['blank'])} blank line(s) (the first: line {skipped['blank'][0][0]})")
    logging.warning(
        "%s: skipped %s; bilm-tf accepts such files too. Each token keeps the id of its first line, counted "
        "over the lines kept",
        path,
        " and ".join(parts),
    )


def _is_vocabulary(path: str) -> bool:
    try:
        words, lines, _ = _read_words(path)
        Vocab(words, source=path, line_numbers=lines)
    except (OSError, ValueError):
        return False
    return True


VOCABULARY = Artifact("a bilm-tf vocabulary file", is_directory=False, recognizes=_is_vocabulary)
