"""A precomputed char-CNN layer for a vocabulary: bilm-tf's `dump_token_embeddings`, AllenNLP's `vocab_to_cache`.

The char CNN (convolutions over 50 character slots, highway, projection) is a large share of the
biLM's work at inference, yet its output depends on the token alone. `build_token_cache` runs it
once per vocabulary word; `embed.embed_tokens` then looks known words up and runs the char CNN only
for the words the cache does not hold, so every token gets exactly the vector the char path would
give it, known or not.

    cache = build_token_cache(params, vocab.words)          # (V, P) float32 on the host
    save_token_cache(cache, "vocab_embedding.hdf5")          # bilm-tf's layout + the tokens
    cache = load_token_cache("vocab_embedding.hdf5", params=params)
    layers, mask = elmo_jax.embed_tokens(params, cache, [["The", "bank", "."]])

File (HDF5): dataset `embedding` float32 (V, P), row i the vector of token i (bilm-tf's name and
layout, so its `vocab_embedding.hdf5` loads given the vocab file it was dumped from); dataset
`tokens` (V,) UTF-8 strings; attributes `max_characters_per_token` and `char_cnn_sha256`, a digest
of the char-CNN weights that built it, checked when the cache is loaded for a model.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Sequence

import h5py
import jax
import numpy as np

from elmo_jax.formats.hdf5_writing import hdf5_writer
from elmo_jax.model.char_cnn import content_bucket, token_embedding
from elmo_jax.model.chars import BOS_TOKEN, EOS_TOKEN, PAD_CHAR, token_bytes, tokens_to_raw_ids
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.params import BiLMParams, iter_flat
from elmo_jax.model.precision import ComputeOptions
from elmo_jax.storage import atomic

FORMAT = "elmo_jax.token_cache/1"
DEFAULT_BATCH_SIZE = 1024  # tokens per char-CNN call while building
# XLA:CPU computes products with few rows by another kernel, which rounds differently (1 ulp) from
# the one it uses for many; the cache is built in large chunks, so uncached words get as many rows.
MIN_OOV_ROWS = 64  # also the least rows of a chunk while building
SPOT_CHECK_ROWS = 16  # rows recomputed when a file carries no digest (a bilm-tf dump)
SPOT_CHECK_ATOL = 1e-4  # bilm-tf's TF float32 kernels round differently; a wrong model is off by far more


@dataclasses.dataclass(frozen=True, eq=False)
class TokenCache:
    """The char-CNN output of every token of a vocabulary.

    Attributes:
      tokens: the V tokens, row order.
      embeddings: float32 (V, P) NumPy array, row i the char-CNN vector of tokens[i].
      max_characters_per_token: C the vectors were computed with (tokens longer than C - 2 bytes are cut).
      char_cnn_sha256: digest of the char-CNN weights (see `char_cnn_digest`), or "" when unknown.
      index: token -> row.
    """

    tokens: tuple[str, ...]
    embeddings: np.ndarray
    max_characters_per_token: int
    char_cnn_sha256: str = ""
    index: dict[str, int] = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        if self.embeddings.ndim != 2 or self.embeddings.shape[0] != len(self.tokens):
            raise ValueError(
                f"TokenCache: embeddings must be (V, P) with V = {len(self.tokens)} tokens, "
                f"found {self.embeddings.shape}"
            )
        index: dict[str, int] = {}
        for row, token in enumerate(self.tokens):
            first = index.setdefault(token, row)
            if first != row:
                raise ValueError(f"TokenCache: duplicate token {token!r} at rows {first} and {row}")
        object.__setattr__(self, "index", index)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def dim(self) -> int:
        """P, the width of each vector."""
        return int(self.embeddings.shape[1])


def char_cnn_digest(params: BiLMParams) -> str:
    """SHA-256 of the char-CNN weights (everything before the LSTMs) and C: what a cache depends on."""
    digest = hashlib.sha256(f"C={params.config.max_characters_per_token}".encode())
    for path, value in sorted(iter_flat(params.weights)):
        if not path.startswith("RNN_"):
            array = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
            digest.update(f"{path}{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


@functools.partial(jax.jit, static_argnames=("content_positions",))
def _char_cnn(params: BiLMParams, char_ids: jax.Array, content_positions: int) -> jax.Array:
    """(N, C) shifted ids -> float32 (N, P), in float32."""
    return token_embedding(params.weights, params.config, char_ids, ComputeOptions(content_positions=content_positions))


def token_vectors(params: BiLMParams, char_ids: np.ndarray, *, batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
    """The char-CNN vectors (N, P) of real tokens' shifted ids (N, C), computed in float32 in chunks.

    Tokens are sorted by their character content so that each chunk computes only the positions its
    longest token needs (`content_bucket`); every chunk is padded to `batch_size` rows (at least
    `MIN_OOV_ROWS`), so XLA compiles at most one program per bucket (C/8 of them).
    """
    C = params.config.max_characters_per_token
    N = char_ids.shape[0]
    out = np.zeros((N, params.config.projection_dim), np.float32)
    content = np.sum((char_ids != 0) & (char_ids != PAD_CHAR + 1), axis=1)  # BOW, bytes, EOW
    order = np.argsort(content, kind="stable")
    for start in range(0, N, batch_size):
        rows = order[start : start + batch_size]
        chunk = np.zeros((max(batch_size, MIN_OOV_ROWS), C), np.int32)  # all-zero padding tokens fill it
        chunk[: len(rows)] = char_ids[rows]
        vectors = _char_cnn(params, chunk, content_positions=content_bucket(chunk, C))
        out[rows] = np.asarray(vectors)[: len(rows)]
    return out


def check_bytes_model(config: BiLMConfig, what: str) -> None:
    """Raises ValueError for a model with its own vocabulary (`vocabulary.TokenVocabulary`): `what` (the
    token cache) keeps char CNN vectors of UTF-8 byte ids, and such a model reads other ids (and a word
    embedding, for ELMoForManyLangs' models)."""
    if config.char_vocab_size or config.has_words:
        raise ValueError(
            f"{what}: the token cache is for models that read UTF-8 bytes; this model has its own character "
            "vocabulary (ELMoForManyLangs'), so embed without a token cache"
        )


def build_token_cache(params: BiLMParams, tokens: Sequence[str], *, batch_size: int = DEFAULT_BATCH_SIZE) -> TokenCache:
    """Runs the char CNN once for every token (plus `<S>` and `</S>` if missing).

    Args:
      params: the biLM whose char CNN the cache stands for.
      tokens: the vocabulary (e.g. `Vocab.load(path).words`); order is kept, duplicates are an error.
      batch_size: tokens per char-CNN call (memory: batch_size x C x n_filters floats).

    Returns:
      A `TokenCache` with float32 (V, P) vectors equal to what `embed`'s char CNN computes.
    """
    if not isinstance(params, BiLMParams):
        raise ValueError(f"params must be BiLMParams, found {type(params).__name__}")
    check_bytes_model(params.config, "build_token_cache")
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise ValueError(f"tokens must be a sequence of str (a vocabulary), found {type(tokens).__name__}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, found {batch_size!r}")
    tokens = list(tokens)
    rows: dict[str, int] = {}
    for row, token in enumerate(tokens):  # before any compute
        if rows.setdefault(token, row) != row:
            raise ValueError(f"tokens: duplicate token {token!r} at positions {rows[token]} and {row}")
    tokens += [t for t in (BOS_TOKEN, EOS_TOKEN) if t not in rows]
    C = params.config.max_characters_per_token
    char_ids = tokens_to_raw_ids(tokens, C) + 1  # (V, C) shifted; checks every token is a str
    vectors = token_vectors(params, char_ids, batch_size=batch_size)
    return TokenCache(tuple(tokens), vectors, C, char_cnn_digest(params))


def save_token_cache(cache: TokenCache, path: str | os.PathLike) -> None:
    """Writes `cache` as HDF5 (see the module docstring); an existing file is only replaced by a complete one."""
    for row, token in enumerate(cache.tokens):
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"token cache row {row}: token {token!r} cannot be written as UTF-8") from None

    def write(f):
        with hdf5_writer(f) as h5:
            h5.create_dataset("embedding", data=np.asarray(cache.embeddings, np.float32))
            h5.create_dataset("tokens", data=list(cache.tokens), dtype=h5py.string_dtype("utf-8"))
            h5.attrs["format"] = FORMAT
            h5.attrs["max_characters_per_token"] = cache.max_characters_per_token
            h5.attrs["char_cnn_sha256"] = cache.char_cnn_sha256

    atomic.write(path, write)


def load_token_cache(
    path: str | os.PathLike, *, params: BiLMParams | None = None, vocab_file: str | os.PathLike | None = None
) -> TokenCache:
    """Reads a cache written by `save_token_cache` or bilm-tf's `dump_token_embeddings`.

    Args:
      path: the HDF5 file.
      params: when given, the cache is checked against this model: width P, C, and the char-CNN
        digest (or, for a file without one, a recomputation of its first rows).
      vocab_file: the bilm-tf vocabulary the file's rows follow; required when the file has no
        `tokens` dataset (bilm-tf's dumps), checked against it otherwise.

    Raises:
      FileNotFoundError, ValueError: naming the file and what was expected.
    """
    path = os.fspath(path)
    embeddings, tokens, C, digest = _read_cache_file(
        path, params.config.max_characters_per_token if params is not None else 50
    )
    tokens = _resolve_tokens(path, tokens, vocab_file)
    if len(tokens) != embeddings.shape[0]:
        raise ValueError(
            f"{path}: 'embedding' has {embeddings.shape[0]} rows but there are {len(tokens)} tokens"
            + (f" in {os.fspath(vocab_file)}" if vocab_file is not None else "")
        )
    cache = TokenCache(tuple(tokens), embeddings, C, digest)
    if params is not None:
        check_token_cache(cache, params, source=path)
    return cache


def _read_cache_file(path: str, default_c: int) -> tuple[np.ndarray, list[str] | None, int, str]:
    """(float32 embeddings (V, P), the file's tokens or None, C, the char CNN's digest or "") of a token
    cache file, checked for its layout; `default_c` where the file does not say C (bilm-tf's dumps)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: token cache file not found")
    if os.path.isdir(path) or not h5py.is_hdf5(path):
        raise ValueError(
            f"{path}: not an HDF5 file (expected a token cache from save_token_cache or "
            "bilm-tf's dump_token_embeddings)"
        )
    try:
        with h5py.File(path, "r") as h5:
            if "embedding" not in h5 or not isinstance(h5["embedding"], h5py.Dataset):
                raise ValueError(f"{path}: missing dataset 'embedding' (expected float32 (V, P))")
            dataset = h5["embedding"]
            if dataset.ndim != 2 or not np.issubdtype(dataset.dtype, np.floating):
                raise ValueError(
                    f"{path}: dataset 'embedding' must be float (V, P), found {dataset.dtype} {dataset.shape}"
                )
            embeddings = np.asarray(dataset[...], np.float32)
            tokens = [t.decode("utf-8") for t in h5["tokens"][...]] if "tokens" in h5 else None
            C = int(h5.attrs.get("max_characters_per_token", default_c))
            digest = str(h5.attrs.get("char_cnn_sha256", ""))
    except OSError as e:
        raise ValueError(f"{path}: cannot read the token cache ({e})") from None
    return embeddings, tokens, C, digest


def _resolve_tokens(path: str, stored: list[str] | None, vocab_file) -> list[str]:
    if vocab_file is None:
        if stored is None:
            raise ValueError(
                f"{path}: no 'tokens' dataset (a bilm-tf vocab_embedding.hdf5?); pass the vocabulary "
                "file it was dumped from as vocab_file"
            )
        return stored
    from elmo_jax.formats.vocab_file import Vocab

    words = Vocab.load(vocab_file).words
    if stored is not None and stored != words:
        first = next((i for i, (a, b) in enumerate(zip(stored, words)) if a != b), min(len(stored), len(words)))
        raise ValueError(f"{path}: its tokens differ from {os.fspath(vocab_file)} (first at row {first})")
    return words


def check_token_cache(
    cache: TokenCache, params: BiLMParams, *, source: str = "token cache", weights: bool = True
) -> None:
    """Raises ValueError unless `cache` was computed by `params`'s char CNN.

    Checks the width P and C, then with `weights` the digest (or, without one, a spot check of the
    first rows against the char CNN).
    """
    config = params.config
    if cache.dim != config.projection_dim:
        raise ValueError(
            f"{source}: vectors are {cache.dim} wide, the model's token layer is "
            f"{config.projection_dim} (lstm.projection_dim); the cache is for another model"
        )
    if cache.max_characters_per_token != config.max_characters_per_token:
        raise ValueError(
            f"{source}: built with max_characters_per_token {cache.max_characters_per_token}, the "
            f"model uses {config.max_characters_per_token}"
        )
    if not weights:
        return
    if cache.char_cnn_sha256:
        if cache.char_cnn_sha256 != char_cnn_digest(params):
            raise ValueError(
                f"{source}: built from different char-CNN weights than this model's (digest "
                "mismatch); rebuild it with build_token_cache"
            )
        return
    rows = list(range(min(SPOT_CHECK_ROWS, len(cache))))
    expected = token_vectors(
        params,
        tokens_to_raw_ids([cache.tokens[i] for i in rows], cache.max_characters_per_token) + 1,
        batch_size=max(len(rows), 1),
    )
    error = float(np.max(np.abs(expected - cache.embeddings[rows]))) if rows else 0.0
    if error > SPOT_CHECK_ATOL:
        raise ValueError(
            f"{source}: its first {len(rows)} rows differ from this model's char CNN by up to "
            f"{error:.3g}; the cache is for other weights or another vocabulary order"
        )


@dataclasses.dataclass(frozen=True)
class CachedBatch:
    """A batch of sentences split into cached vectors and the tokens the char CNN must still compute.

    Attributes:
      known: float32 (B, T2, P) cached vectors; zeros where a token is computed (or padding).
      oov_index: int32 (B, T2), row of `oov_chars` for a token not in the cache and for `<S>`/`</S>`,
        -1 elsewhere.
      oov_chars: int32 (U, C) shifted ids of `<S>`, `</S>` and the distinct uncached tokens, padded with
        all-zero rows to a power of two of at least `MIN_OOV_ROWS` (so a stream of batches compiles a
        handful of shapes).
      n_oov: how many rows of `oov_chars` are real tokens.
      mask: bool (B, T2), each row's tokens and both boundaries.
      content_positions: `char_cnn.content_bucket` of the whole batch, so the uncached tokens are
        computed exactly as `embed` computes them in this batch.
    """

    known: np.ndarray
    oov_index: np.ndarray
    oov_chars: np.ndarray
    n_oov: int
    mask: np.ndarray
    content_positions: int


def lookup(cache: TokenCache, sentences: Sequence[Sequence[str]]) -> CachedBatch:
    """Looks every token of a batch of tokenized sentences up in `cache`, boundaries added (host-side)."""
    rows = lookup_rows(cache, sentences)
    known = np.where((rows.mask & (rows.oov_index < 0))[..., None], cache.embeddings[rows.rows], np.float32(0.0))
    return CachedBatch(
        known.astype(np.float32, copy=False),
        rows.oov_index,
        rows.oov_chars,
        rows.n_oov,
        rows.mask,
        rows.content_positions,
    )


@dataclasses.dataclass(frozen=True)
class CachedRows:
    """`CachedBatch` with the cache's row numbers in place of the vectors, for a caller that keeps the
    cache's (V, P) table on the device and gathers there.

    Attributes:
      rows: int32 (B, T2), the cache row of each known token (0 elsewhere; `oov_index` and `mask` say
        which entries are cached tokens).
      oov_index, oov_chars, n_oov, mask, content_positions: as in `CachedBatch`.
    """

    rows: np.ndarray
    oov_index: np.ndarray
    oov_chars: np.ndarray
    n_oov: int
    mask: np.ndarray
    content_positions: int


def lookup_rows(cache: TokenCache, sentences: Sequence[Sequence[str]], length: int | None = None) -> CachedRows:
    """`lookup` without gathering the vectors: row numbers into `cache.embeddings`.

    Args:
      cache: the token cache.
      sentences: B tokenized sentences (empty ones are padding rows: `<S>` `</S>` only).
      length: pad to T2 = length + 2 (at least the longest sentence); None: the longest sentence.
    """
    if isinstance(sentences, str) or not isinstance(sentences, Sequence) or len(sentences) == 0:
        raise ValueError(
            f"sentences must be a non-empty list of tokenized sentences (lists of str), found {sentences!r:.60}"
        )
    for b, sentence in enumerate(sentences):
        if isinstance(sentence, str) or not isinstance(sentence, Sequence):
            raise ValueError(f"sentence {b} must be a list of str tokens, found {type(sentence).__name__}")
    B, T2 = len(sentences), max(max(len(s) for s in sentences), length or 0) + 2
    if T2 == 2 and length is None:
        raise ValueError(f"sentences: all {B} sentences are empty; need at least one token")
    rows = np.zeros((B, T2), np.int32)
    oov_index = np.full((B, T2), -1, np.int32)
    mask = np.zeros((B, T2), bool)
    # The boundaries are always computed with the batch: two rows among at least MIN_OOV_ROWS cost
    # nothing, and they then round exactly as in `embed`, where the batch's longest token decides
    # whether the char CNN's all-PAD window comes from a separate one-row product (1 ulp apart).
    oov: dict[str, int] = {BOS_TOKEN: 0, EOS_TOKEN: 1}
    index, longest = cache.index, 1  # UTF-8 bytes of the longest token
    for b, sentence in enumerate(sentences):
        oov_index[b, 0] = 0
        oov_index[b, len(sentence) + 1] = 1
        for t, token in enumerate(sentence, start=1):
            if not isinstance(token, str):
                raise ValueError(f"sentence {b}, token {t - 1}: expected str, found {type(token).__name__} {token!r}")
            row = index.get(token) if token not in (BOS_TOKEN, EOS_TOKEN) else None
            if row is not None:
                rows[b, t] = row
            else:
                oov_index[b, t] = oov.setdefault(token, len(oov))
            if 4 * len(token) > longest:  # UTF-8 takes at most 4 bytes per character
                longest = max(longest, len(token_bytes(token)))
        mask[b, : len(sentence) + 2] = True
    n_rows = max(1 << max(len(oov) - 1, 0).bit_length(), MIN_OOV_ROWS)  # a power of two
    oov_chars = np.zeros((n_rows, cache.max_characters_per_token), np.int32)
    oov_chars[: len(oov)] = tokens_to_raw_ids(list(oov), cache.max_characters_per_token) + 1
    C = cache.max_characters_per_token
    width = max(min(longest, C - 2) + 2, 3)  # BOW, bytes, EOW, as `char_cnn.content_width`
    content_positions = min(-(-width // 8) * 8, C)  # as `char_cnn.content_bucket`
    return CachedRows(rows, oov_index, oov_chars, len(oov), mask, content_positions)
