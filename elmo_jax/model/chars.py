"""Tokens to character ids, exactly as bilm-tf trains on them and AllenNLP feeds them.

A token becomes C = `max_characters_per_token` slots: `[BOW, its first C-2 UTF-8 bytes, EOW, PAD, ...]`
(truncation is by bytes, so a multi-byte character may be cut). The literal tokens `<S>` and `</S>` map
to the sentence-boundary characters, as in both original implementations.

*Raw* ids (0..260) are what the training data uses and what index the 261-row `char_embed` matrix.
*Shifted* ids (raw + 1, 1..261) are what `batch_to_ids` returns and `embed` consumes: 0 then marks a
padding token (all C slots zero), which lets a padded batch carry its own mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BOS_CHAR = 256  # beginning of sentence
EOS_CHAR = 257  # end of sentence
BOW_CHAR = 258  # beginning of word
EOW_CHAR = 259  # end of word
PAD_CHAR = 260  # padding within a token

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"

DEFAULT_MAX_CHARS = 50


def _check_max_chars(max_characters_per_token: int) -> None:
    if not isinstance(max_characters_per_token, (int, np.integer)) or max_characters_per_token < 3:
        raise ValueError(f"max_characters_per_token must be an integer >= 3, found {max_characters_per_token!r}")


def boundary_char_ids(char: int, max_characters_per_token: int = DEFAULT_MAX_CHARS) -> np.ndarray:
    """Raw ids (C,) of a sentence-boundary token: [BOW, char, EOW, PAD, ...]."""
    ids = np.full((max_characters_per_token,), PAD_CHAR, dtype=np.int32)
    ids[:3] = (BOW_CHAR, char, EOW_CHAR)
    return ids


def token_to_raw_ids(token: str, max_characters_per_token: int = DEFAULT_MAX_CHARS) -> np.ndarray:
    """Raw (unshifted) character ids (C,) int32 of one token."""
    _check_max_chars(max_characters_per_token)
    if not isinstance(token, str):
        raise ValueError(f"a token must be a str, found {type(token).__name__}: {token!r}")
    if token == BOS_TOKEN:
        return boundary_char_ids(BOS_CHAR, max_characters_per_token)
    if token == EOS_TOKEN:
        return boundary_char_ids(EOS_CHAR, max_characters_per_token)
    # "ignore" drops unencodable code points (lone surrogates), as bilm-tf and AllenNLP do.
    data = token.encode("utf-8", errors="ignore")[: max_characters_per_token - 2]
    ids = np.full((max_characters_per_token,), PAD_CHAR, dtype=np.int32)
    ids[0] = BOW_CHAR
    ids[1 : 1 + len(data)] = np.frombuffer(data, dtype=np.uint8)
    ids[1 + len(data)] = EOW_CHAR
    return ids


def tokens_to_raw_ids(tokens: Sequence[str], max_characters_per_token: int = DEFAULT_MAX_CHARS) -> np.ndarray:
    """Raw character ids (N, C) int32 of a token sequence, for training streams (no padding tokens)."""
    check_sentence(tokens, 0)
    out = np.empty((len(tokens), max_characters_per_token), dtype=np.int32)
    for i, token in enumerate(tokens):
        out[i] = token_to_raw_ids(token, max_characters_per_token)
    return out


def batch_to_ids(sentences: Sequence[Sequence[str]], max_characters_per_token: int = DEFAULT_MAX_CHARS) -> np.ndarray:
    """Shifted character ids of a batch of tokenized sentences, as AllenNLP's `batch_to_ids`.

    Args:
      sentences: B sentences, each a sequence of str tokens (an empty sentence is allowed).
      max_characters_per_token: C.

    Returns:
      int32 array (B, T, C), T = the longest sentence's length: raw ids + 1, with all-zero rows for
      padding tokens.
    """
    _check_max_chars(max_characters_per_token)
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise ValueError(
            f"sentences must be a list of tokenized sentences (lists of str), found {type(sentences).__name__}"
        )
    if len(sentences) == 0:
        raise ValueError("sentences is empty: batch_to_ids needs at least one sentence")
    for b, sentence in enumerate(sentences):
        check_sentence(sentence, b)
    max_len = max(len(s) for s in sentences)
    out = np.zeros((len(sentences), max_len, max_characters_per_token), dtype=np.int32)
    for b, sentence in enumerate(sentences):
        for t, token in enumerate(sentence):
            out[b, t] = token_to_raw_ids(token, max_characters_per_token) + 1
    return out


def check_sentence(sentence, index: int) -> Sequence[str]:
    """`sentence` (the `index`-th of a batch) when it is a sequence of str tokens; else a ValueError naming
    the sentence (and the token) and what was found."""
    if isinstance(sentence, str) or not isinstance(sentence, Sequence):
        raise ValueError(
            f"sentence {index} must be a list of str tokens, found {type(sentence).__name__}"
            + (" (split the string into tokens first)" if isinstance(sentence, str) else "")
        )
    for t, token in enumerate(sentence):
        if not isinstance(token, str):
            raise ValueError(f"sentence {index}, token {t}: expected str, found {type(token).__name__} {token!r}")
    return sentence
