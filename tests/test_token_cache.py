"""Token-embedding cache: cached vocabulary + exact char-CNN fallback gives `embed`'s outputs (to the
rounding of the char CNN's sums, tests/support/tolerance.py).

References: `embed` on `batch_to_ids` (the char path, itself checked against AllenNLP in
test_parity_allennlp.py) and the AllenNLP fixture activations; the cache file is checked against
h5py reads of what bilm-tf's `dump_token_embeddings` writes (dataset "embedding", rows in vocab order).
"""

from __future__ import annotations

import h5py
import jax
import numpy as np
import pytest

import elmo_jax
from elmo_jax.features import token_cache as tc
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms, order_tolerance

PARITY_ATOL = 1e-5  # against AllenNLP's own code, as in test_parity_allennlp.py

# A small random biLM with the demo's char CNN shape (several filter widths, highway, projection).
SMALL = elmo_jax.BiLMConfig(
    char_embed_dim=8, filters=((1, 16), (2, 16), (3, 32), (4, 64)), n_highway=1, lstm_dim=48, projection_dim=24
)


@pytest.fixture(scope="module")
def small_params():
    return elmo_jax.init_params(SMALL, jax.random.key(3))


def _words(rng, n, alphabet="abcdefghijklmnopqrstuvwxyzé"):
    words = ["".join(rng.choice(list(alphabet), rng.integers(1, 9))) for _ in range(n)]
    return list(dict.fromkeys(words))  # distinct, in order


def _assert_same(params, cache, sentences, **kwargs):
    expected = elmo_jax.embed(params, elmo_jax.batch_to_ids(sentences), **kwargs)
    got = elmo_jax.embed_tokens(params, cache, sentences, **kwargs)
    assert len(got) == len(expected)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(expected[1]))
    # The cache computed each token's char CNN in another batch: those sums only may be ordered otherwise.
    assert_close_up_to_order(got[0], expected[0], char_cnn_terms(params.config))
    mask = np.asarray(got[1])
    layers = np.asarray(got[0])
    assert np.all(np.moveaxis(layers, 1, 2)[~mask] == 0.0), "padding must be exact zeros"
    return got, expected


@pytest.mark.parametrize("coverage", ["all", "half", "boundaries only"])
def test_fixture_model_cache_equals_char_path_and_allennlp(tiny_params, load_batch, coverage):
    """All words cached, half of them (the rest through the char CNN), or none: same layers as `embed`
    (to rounding) and as AllenNLP (1e-5), for the fixture's unicode, 48/49-byte, literal <S>/</S> and
    empty-token batch."""
    for name in ("main", "edge"):
        batch = load_batch(name)
        words = sorted({w for s in batch.sentences for w in s})
        vocab = {"all": words, "half": words[::2], "boundaries only": []}[coverage]
        cache = tc.build_token_cache(tiny_params, vocab)
        (layers, mask), _ = _assert_same(tiny_params, cache, batch.sentences)
        T = layers.shape[2]
        expected = batch.arrays["activations"][:, :, :T].transpose(1, 0, 2, 3)
        np.testing.assert_array_equal(np.asarray(mask), batch.arrays["mask"][:, :T])
        np.testing.assert_allclose(np.asarray(layers), expected, atol=PARITY_ATOL, rtol=0)


@pytest.mark.slow
def test_random_model_oov_boundaries_padding_state(small_params):
    """Random init: OOV words, literal <S>/</S> inside a sentence, an empty sentence, padding rows, a
    token longer than C, `keep_boundaries` and carried state all match the char path."""
    rng = np.random.default_rng(0)
    vocab = _words(rng, 150)
    cache = tc.build_token_cache(small_params, vocab, batch_size=16)  # many chunks, a partial last one
    sentences = [
        list(rng.choice(vocab, 12)) + ["unseen", "wörd"],
        ["<S>", vocab[3], "</S>", "x" * 70],
        [],
        _words(rng, 9),
        [vocab[0]],
    ]
    sentences += [list(rng.choice(vocab + _words(rng, 20), int(n))) for n in rng.integers(1, 15, size=6)]
    _assert_same(small_params, cache, sentences)
    _assert_same(small_params, cache, sentences, keep_boundaries=True)
    (_, _, state), (_, _, expected_state) = _assert_same(small_params, cache, sentences, return_state=True)
    for got, want in zip(state, expected_state):
        assert_close_up_to_order(got, want, char_cnn_terms(SMALL))
    _assert_same(small_params, cache, sentences, initial_state=expected_state)


def test_cache_rows_are_char_cnn_vectors(small_params):
    """Row i is layer 0 of `embed` for token i alone in a sentence; <S>/</S> are appended when missing,
    the given order is kept and the row lookup follows it."""
    rng = np.random.default_rng(1)
    vocab = _words(rng, 70)
    cache = tc.build_token_cache(small_params, vocab)
    assert cache.tokens == tuple(vocab) + ("<S>", "</S>")
    assert cache.embeddings.shape == (len(vocab) + 2, SMALL.projection_dim) and cache.embeddings.dtype == np.float32
    layers, _ = elmo_jax.embed(small_params, elmo_jax.batch_to_ids([[w] for w in vocab]))
    np.testing.assert_allclose(
        cache.embeddings[: len(vocab)],
        np.asarray(layers)[:, 0, 0, : SMALL.projection_dim],
        atol=order_tolerance(cache.embeddings[: len(vocab)], char_cnn_terms(SMALL)),
        rtol=0,
    )
    bos, _ = elmo_jax.embed(small_params, elmo_jax.batch_to_ids([["<S>"]]))
    assert_close_up_to_order(cache.embeddings[cache.index["<S>"]], np.asarray(bos)[0, 0, 0, :24], char_cnn_terms(SMALL))
    with pytest.raises(ValueError, match=r"duplicate token .a. at positions 0 and 2"):
        tc.build_token_cache(small_params, ["a", "b", "a"])


def test_save_load_roundtrip_and_bilm_tf_layout(small_params, tmp_path):
    """The file holds bilm-tf's "embedding" dataset in row order; it loads back equal, and a bilm-tf dump
    (no tokens, no digest) loads with its vocab file and a spot check against the model."""
    cache = tc.build_token_cache(small_params, ["<S>", "</S>", "<UNK>", "the", "bank", "river"])
    path = tmp_path / "vocab_embedding.hdf5"
    tc.save_token_cache(cache, path)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["embedding"][...], cache.embeddings)
        assert [t.decode() for t in f["tokens"][...]] == list(cache.tokens)
    loaded = tc.load_token_cache(path, params=small_params)
    assert loaded.tokens == cache.tokens and loaded.char_cnn_sha256 == cache.char_cnn_sha256
    np.testing.assert_array_equal(loaded.embeddings, cache.embeddings)

    bilm_tf = tmp_path / "bilm_tf_dump.hdf5"  # what dump_token_embeddings writes: one dataset
    with h5py.File(bilm_tf, "w") as f:
        f.create_dataset("embedding", data=cache.embeddings)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(cache.tokens) + "\n", encoding="utf-8")
    foreign = tc.load_token_cache(bilm_tf, params=small_params, vocab_file=vocab_file)
    assert foreign.tokens == cache.tokens and foreign.char_cnn_sha256 == ""
    sentences = [["the", "bank", "of", "the", "river"]]
    _assert_same(small_params, foreign, sentences)


def test_load_errors_name_the_problem(small_params, tiny_params, tmp_path):
    cache = tc.build_token_cache(small_params, ["<S>", "</S>", "<UNK>", "a", "b"])
    path = tmp_path / "cache.hdf5"
    tc.save_token_cache(cache, path)
    with pytest.raises(FileNotFoundError, match="missing.hdf5: token cache file not found"):
        tc.load_token_cache(tmp_path / "missing.hdf5")
    (tmp_path / "text.hdf5").write_text("not hdf5")
    with pytest.raises(ValueError, match="text.hdf5: not an HDF5 file"):
        tc.load_token_cache(tmp_path / "text.hdf5")
    with pytest.raises(ValueError, match=r"vectors are 24 wide, the model's token layer is 16"):
        tc.load_token_cache(path, params=tiny_params)
    other = elmo_jax.init_params(SMALL, jax.random.key(4))
    with pytest.raises(ValueError, match="different char-CNN weights"):
        tc.load_token_cache(path, params=other)
    with pytest.raises(ValueError, match="vectors are 24 wide"):
        elmo_jax.embed_tokens(tiny_params, cache, [["a"]])

    dump = tmp_path / "dump.hdf5"
    with h5py.File(dump, "w") as f:
        f.create_dataset("embedding", data=cache.embeddings)
    with pytest.raises(ValueError, match=r"dump.hdf5: no 'tokens' dataset .* pass the vocabulary file"):
        tc.load_token_cache(dump)
    short_vocab = tmp_path / "short.txt"
    short_vocab.write_text("<S>\n</S>\n<UNK>\na\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"'embedding' has 5 rows but there are 4 tokens in .*short.txt"):
        tc.load_token_cache(dump, vocab_file=short_vocab)
    swapped = tmp_path / "swapped.txt"
    swapped.write_text("<S>\n</S>\n<UNK>\nb\na\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"first 5 rows differ from this model's char CNN"):
        tc.load_token_cache(dump, params=small_params, vocab_file=swapped)
    with pytest.raises(ValueError, match=r"its tokens differ from .*swapped.txt \(first at row 3\)"):
        tc.load_token_cache(path, vocab_file=swapped)
    with h5py.File(tmp_path / "empty.hdf5", "w"):
        pass
    with pytest.raises(ValueError, match="missing dataset 'embedding'"):
        tc.load_token_cache(tmp_path / "empty.hdf5")


def test_save_is_atomic_and_bad_input_is_refused(small_params, tmp_path):
    """A failed save leaves the old file; bad sentences and types are refused before any compute."""
    cache = tc.build_token_cache(small_params, ["a"])
    path = tmp_path / "cache.hdf5"
    tc.save_token_cache(cache, path)
    before = path.read_bytes()
    bad = tc.TokenCache(("a", "\ud800"), np.zeros((2, 24), np.float32), 50)
    with pytest.raises(ValueError, match="row 1: token .* cannot be written as UTF-8"):
        tc.save_token_cache(bad, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.hdf5"]
    with pytest.raises(ValueError, match="sentence 1 must be a list of str tokens, found str"):
        elmo_jax.embed_tokens(small_params, cache, [["a"], "a b"])
    with pytest.raises(ValueError, match="sentence 0, token 1: expected str, found int 3"):
        elmo_jax.embed_tokens(small_params, cache, [["a", 3]])
    with pytest.raises(ValueError, match="all 2 sentences are empty"):
        elmo_jax.embed_tokens(small_params, cache, [[], []])
    with pytest.raises(ValueError, match="cache must be a TokenCache"):
        elmo_jax.embed_tokens(small_params, cache.embeddings, [["a"]])
