"""Tokens to character ids, exactly as bilm-tf trains on them and AllenNLP feeds them.

A token becomes C = `max_characters_per_token` slots: `[BOW, its first C-2 UTF-8 bytes, EOW, PAD, ...]`
(truncation is by bytes, so a multi-byte character may be cut). The literal tokens `<S>` and `</S>` map
to the sentence-boundary characters, as in both original implementations.

Long tokens: this module owns the one rule every path follows (docs/ELMO.md, "Long tokens"). A token of
more than `max_token_bytes` (C-2) UTF-8 bytes is cut to its first C-2, as bilm-tf trained the published
models and AllenNLP reads them, and never silently: `count_truncated` counts the cut tokens of a batch
(cheaply: a token of at most (C-2)/4 characters is never encoded to be measured) and
`truncation_note` / `warn_truncated` say it in the one sentence the library, `embed_file` and the
service share. `batch_to_ids` logs it once per call; the per-token functions (`token_to_raw_ids`,
`tokens_to_raw_ids`, for training streams) leave the counting to their callers.

*Raw* ids (0..260) are what the training data uses and what index the 261-row `char_embed` matrix.
*Shifted* ids (raw + 1, 1..261) are what `batch_to_ids` returns and `embed` consumes: 0 then marks a
padding token (all C slots zero), which lets a padded batch carry its own mask.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from absl import logging

BOS_CHAR = 256  # beginning of sentence
EOS_CHAR = 257  # end of sentence
BOW_CHAR = 258  # beginning of word
EOW_CHAR = 259  # end of word
PAD_CHAR = 260  # padding within a token

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"

DEFAULT_MAX_CHARS = 50
LONG_TOKENS_DOC = 'docs/ELMO.md, "Long tokens"'


def _check_max_chars(max_characters_per_token: int) -> None:
    if not isinstance(max_characters_per_token, (int, np.integer)) or max_characters_per_token < 3:
        raise ValueError(f"max_characters_per_token must be an integer >= 3, found {max_characters_per_token!r}")


def boundary_char_ids(char: int, max_characters_per_token: int = DEFAULT_MAX_CHARS) -> np.ndarray:
    """Raw ids (C,) of a sentence-boundary token: [BOW, char, EOW, PAD, ...]."""
    ids = np.full((max_characters_per_token,), PAD_CHAR, dtype=np.int32)
    ids[:3] = (BOW_CHAR, char, EOW_CHAR)
    return ids


def max_token_bytes(max_characters_per_token: int = DEFAULT_MAX_CHARS) -> int:
    """UTF-8 bytes of a token the model reads: C less the begin- and end-of-word marks (48 for C = 50)."""
    return max_characters_per_token - 2


def token_bytes(token: str) -> bytes:
    """A token's UTF-8 bytes before the cut; "ignore" drops unencodable code points (lone surrogates), as
    bilm-tf and AllenNLP do."""
    return token.encode("utf-8", errors="ignore")


def is_truncated(token: str, max_characters_per_token: int = DEFAULT_MAX_CHARS) -> bool:
    """Whether `token` is cut: over `max_token_bytes` UTF-8 bytes (`<S>` and `</S>` never are)."""
    limit = max_characters_per_token - 2
    # UTF-8 takes at most 4 bytes a character: a token of at most limit / 4 characters is not encoded.
    return 4 * len(token) > limit and len(token_bytes(token)) > limit and token not in (BOS_TOKEN, EOS_TOKEN)


def count_truncated(sentences: Iterable[Sequence[str]], max_characters_per_token: int = DEFAULT_MAX_CHARS) -> int:
    """How many tokens of `sentences` (lists of str) are over `max_token_bytes` and cut."""
    short = (max_characters_per_token - 2) // 4  # characters a token may have and never be cut
    return sum(
        is_truncated(token, max_characters_per_token)
        for sentence in sentences
        for token in sentence
        if len(token) > short
    )


def truncation_note(truncated: int, tokens: int, max_characters_per_token: int = DEFAULT_MAX_CHARS) -> str:
    """The one sentence that says `truncated` of `tokens` tokens were cut."""
    limit = max_token_bytes(max_characters_per_token)
    return (
        f"{truncated:,} of {tokens:,} tokens are longer than the model's {limit} UTF-8 bytes and were cut to "
        f"{limit} ({LONG_TOKENS_DOC})"
    )


def warn_truncated(truncated: int, tokens: int, max_characters_per_token: int = DEFAULT_MAX_CHARS) -> None:
    """Logs `truncation_note` as a warning when any token was cut; nothing otherwise."""
    if truncated:
        logging.warning("%s", truncation_note(truncated, tokens, max_characters_per_token))


def token_to_raw_ids(token: str, max_characters_per_token: int = DEFAULT_MAX_CHARS) -> np.ndarray:
    """Raw (unshifted) character ids (C,) int32 of one token, cut to its first C-2 UTF-8 bytes, silently:
    the caller counts the cut ones (`elmo_jax.model.chars.is_truncated`)."""
    _check_max_chars(max_characters_per_token)
    if not isinstance(token, str):
        raise ValueError(f"a token must be a str, found {type(token).__name__}: {token!r}")
    if token == BOS_TOKEN:
        return boundary_char_ids(BOS_CHAR, max_characters_per_token)
    if token == EOS_TOKEN:
        return boundary_char_ids(EOS_CHAR, max_characters_per_token)
    data = token_bytes(token)[: max_characters_per_token - 2]
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
      padding tokens. Tokens over C-2 UTF-8 bytes are cut to C-2, and one warning says how many
      (docs/ELMO.md, "Long tokens").
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
    # Only a token whose ids end in EOW has C-2 bytes or more: the rest are never measured again.
    maybe_cut = np.argwhere(out[:, :, -1] == EOW_CHAR + 1)
    truncated = sum(is_truncated(sentences[b][t], max_characters_per_token) for b, t in maybe_cut.tolist())
    warn_truncated(truncated, sum(map(len, sentences)), max_characters_per_token)
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
