"""`elmo_jax.Embedder`, the drop-in for AllenNLP's `ElmoEmbedder` (elmo_jax/embedder.py).

References: AllenNLP's own activations of the fixture sentences (tests/fixtures/allennlp_tiny: (L+1, n, D)
per sentence, 1e-5 as tests/test_parity_allennlp.py), and `elmo_jax.embed`, the functional API, for
`batch_to_embeddings`, which AllenNLP computes with the same padded batch.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import elmo_jax

ATOL = 1e-5


@pytest.fixture(scope="module")
def main_batch(load_batch):
    """The fixture's main sentences (no empty token: they can be a line of a text file) and AllenNLP's
    activations of each, (L+1, n, D)."""
    batch = load_batch("main")
    expected = [batch.arrays["activations"][:, b, : len(s)] for b, s in enumerate(batch.sentences)]
    return batch.sentences, expected


@pytest.fixture(scope="module")
def embedder(fixture_dir):
    """AllenNLP's positional form: ElmoEmbedder(options_file, weight_file); one device."""
    return elmo_jax.Embedder(fixture_dir / "options.json", fixture_dir / "weights.hdf5", cuda_device=0)


def test_embed_sentence_and_embed_batch_equal_allennlp(embedder, main_batch):
    sentences, expected = main_batch
    first = embedder.embed_sentence(sentences[0])
    assert first.dtype == np.float32 and first.shape == expected[0].shape  # (L+1, n, 2P): (3, 10, 32)
    np.testing.assert_allclose(first, expected[0], rtol=0, atol=ATOL)
    batch = embedder.embed_batch(sentences)
    assert isinstance(batch, list) and len(batch) == len(sentences)
    for b, (got, reference) in enumerate(zip(batch, expected, strict=True)):
        assert got.shape == reference.shape, b
        np.testing.assert_allclose(got, reference, rtol=0, atol=ATOL, err_msg=f"sentence {b}")


def test_embed_sentences_is_a_generator_in_input_order_on_every_device(fixture_dir, tiny_params, main_batch):
    """A generator in, a generator out (AllenNLP's embed_sentences), on all 8 test devices; `params=`
    takes a model already loaded; batch_size is accepted and changes nothing."""
    sentences, expected = main_batch
    every_device = elmo_jax.Embedder(params=tiny_params)
    out = every_device.embed_sentences((s for s in sentences * 4), batch_size=2)
    assert not isinstance(out, list)
    got = list(out)
    assert len(got) == 4 * len(sentences)
    for b, vectors in enumerate(got):
        np.testing.assert_allclose(vectors, expected[b % len(sentences)], rtol=0, atol=ATOL, err_msg=f"{b}")
    keywords = elmo_jax.Embedder(options_file=fixture_dir / "options.json", weight_file=fixture_dir / "weights.hdf5")
    np.testing.assert_array_equal(keywords.embed_sentence(sentences[1]), every_device.embed_sentence(sentences[1]))


def test_batch_to_embeddings_is_the_functional_api_as_numpy(embedder, tiny_params, main_batch):
    sentences, expected = main_batch
    layers, mask = embedder.batch_to_embeddings(sentences)
    want_layers, want_mask = elmo_jax.embed(tiny_params, elmo_jax.batch_to_ids(sentences))
    assert isinstance(layers, np.ndarray) and isinstance(mask, np.ndarray)
    T = max(map(len, sentences))
    assert layers.shape == (len(sentences), 3, T, 32) and mask.shape == (len(sentences), T)
    np.testing.assert_array_equal(layers, np.asarray(want_layers))
    np.testing.assert_array_equal(mask, np.asarray(want_mask))
    for b, reference in enumerate(expected):
        n = len(sentences[b])
        assert mask[b].sum() == n
        np.testing.assert_allclose(layers[b, :, :n], reference, rtol=0, atol=ATOL, err_msg=f"sentence {b}")
        assert not layers[b, :, n:].any()  # zeros at padding, as AllenNLP's


@pytest.mark.slow
def test_embed_file_writes_allennlp_layout(embedder, main_batch, tmp_path):
    """Datasets named by line index, (3, n, D) with output_format "all", (n, D) with "average"; an open
    file is accepted as AllenNLP passes one; use_sentence_keys is refused in one sentence."""
    sentences, expected = main_batch
    text = tmp_path / "input.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
    with open(text, encoding="utf-8") as opened:
        counts = embedder.embed_file(opened, tmp_path / "all.hdf5")
    assert counts["sentences"] == len(sentences)
    with h5py.File(tmp_path / "all.hdf5", "r") as f:
        for b, reference in enumerate(expected):
            np.testing.assert_allclose(f[str(b)][()], reference, rtol=0, atol=ATOL, err_msg=f"line {b}")
        assert "sentence_to_index" in f
    embedder.embed_file(text, tmp_path / "average.hdf5", output_format="average", forget_sentences=True)
    with h5py.File(tmp_path / "average.hdf5", "r") as f:
        assert "sentence_to_index" not in f
        np.testing.assert_allclose(f["0"][()], expected[0].mean(axis=0), rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="use_sentence_keys"):
        embedder.embed_file(text, tmp_path / "keys.hdf5", use_sentence_keys=True)
    assert not (tmp_path / "keys.hdf5").exists()


def test_arguments_that_cannot_go_together_are_refused(fixture_dir, tiny_params):
    with pytest.raises(ValueError, match="not both"):
        elmo_jax.Embedder(fixture_dir / "options.json", params=tiny_params)
    with pytest.raises(ValueError, match="cuda_device"):
        elmo_jax.Embedder(params=tiny_params, cuda_device=-2)
    with pytest.raises(ValueError, match="together"):
        elmo_jax.Embedder(options_file=fixture_dir / "options.json")
