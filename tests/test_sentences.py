"""`embed_sentences` / `SentenceEmbedder`: in-memory sentences in, one array per sentence out, batched by
bucket over the 8 test devices.

References: AllenNLP's own biLM activations of the fixture sentences (tests/fixtures/allennlp_tiny), and
for the reduced modes NumPy re-derivations on them (tests/reference/elmo_equations.py). Different batch
shapes round float32 sums differently (~1e-7), so the project's float32 tolerance applies.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import elmo_jax
from elmo_jax.features import batch_runner
from tests.reference.elmo_equations import np_scalar_mix, np_sentence_mean
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms, lstm_terms

ATOL = 1e-5
# Fixture sentences of at most 8 short tokens: one (length, width) bucket, so one program per mode.
SHORT = [("main", 1), ("main", 6), ("edge", 0), ("edge", 2), ("edge", 4)]
S, GAMMA = np.array([0.5, -1.0, 2.0]), 0.7


def allennlp_layers(batch, b):
    """(L+1, n, D) AllenNLP activations of fixture sentence b."""
    n = len(batch.sentences[b])
    return batch.arrays["activations"][:, b, :n].astype(np.float64)


@pytest.fixture(scope="module")
def short(load_batch):
    """(sentences, AllenNLP layers) of the short fixture sentences (one empty)."""
    batches = {name: load_batch(name) for name in ("main", "edge")}
    return (
        [batches[name].sentences[b] for name, b in SHORT],
        [allennlp_layers(batches[name], b) for name, b in SHORT],
    )


def test_every_layer_equals_allennlp_on_all_devices(tiny_params, load_batch):
    """All fixture sentences (unicode, 48/49-byte tokens, literal <S>, an empty token and an empty
    sentence) in one call, on 8 devices: AllenNLP's activations, in input order."""
    sentences, expected = [], []
    for name in ("main", "edge"):
        batch = load_batch(name)
        sentences += batch.sentences
        expected += [allennlp_layers(batch, b) for b in range(len(batch.sentences))]
    embedder = elmo_jax.SentenceEmbedder(tiny_params, batch_tokens=64)
    got = embedder.embed(sentences)
    assert len(got) == len(sentences) and embedder.runner.row_multiple == 8
    for b, (vectors, reference) in enumerate(zip(got, expected)):
        assert vectors.dtype == np.float32 and vectors.shape == reference.shape, b
        np.testing.assert_allclose(vectors, reference, rtol=0, atol=ATOL, err_msg=f"sentence {b}")
    assert embedder.stats["sentences"] == 13 and embedder.stats["compiled_shapes"] <= embedder.stats["batches"]


@pytest.mark.parametrize("layers", ["top", "average", "mix", "sentence_mean"])
def test_each_output_mode_equals_its_numpy_formula(tiny_params, short, layers):
    sentences, layer_refs = short
    mix = dict(mix_scalars=tuple(S), gamma=GAMMA) if layers in ("mix", "sentence_mean") else {}
    got = elmo_jax.embed_sentences(tiny_params, sentences, layers=layers, batch_tokens=64, **mix)
    for vectors, reference in zip(got, layer_refs):
        expected = {
            "top": lambda x: x[-1],
            "average": lambda x: x.mean(axis=0),
            "mix": lambda x: np_scalar_mix(x, S, GAMMA),
            "sentence_mean": lambda x: np_sentence_mean(x, S, GAMMA),
        }[layers](reference)
        assert vectors.shape == expected.shape
        np.testing.assert_allclose(vectors, expected, rtol=0, atol=ATOL)
    assert np.all(got[3] == 0.0)  # the empty sentence: (0, D), or zeros for the mean


def test_a_layer_index_is_that_layer(tiny_params, short):
    """layers=j (an int, `output_modes.LayerIndex`): AllenNLP's layer j of each sentence; one program
    serves every index (the index travels as data); an index past L, or a bool, is refused."""
    sentences, layer_refs = short
    compiled = []
    for j in range(3):
        embedder = elmo_jax.SentenceEmbedder(tiny_params, layers=j, batch_tokens=64)
        for vectors, reference in zip(embedder.embed(sentences), layer_refs):
            assert vectors.dtype == np.float32 and vectors.shape == reference[j].shape
            np.testing.assert_allclose(vectors, reference[j], rtol=0, atol=ATOL)
        compiled.append(batch_runner._chars_program(embedder.runner.mesh, "index", "float32")._cache_size())
    assert compiled[0] == compiled[1] == compiled[2]
    for bad, message in ((3, "--layers=3: a layer index of this model is 0 to 2"), (True, "--layers must be one of")):
        with pytest.raises(ValueError, match=message):
            elmo_jax.embed_sentences(tiny_params, [["ok"]], layers=bad)


def test_sentence_mean_defaults_to_the_average_of_the_layers(tiny_params, short):
    sentences, layer_refs = short
    got = elmo_jax.embed_sentences(tiny_params, sentences, layers="sentence_mean", float16=True, batch_tokens=64)
    for vectors, reference in zip(got, layer_refs):
        assert vectors.dtype == np.float16 and vectors.shape == (32,)
        expected = np_sentence_mean(reference, np.zeros(3), 1.0)
        np.testing.assert_allclose(vectors.astype(np.float32), expected, rtol=2**-10, atol=1e-4)


def test_one_device_equals_eight(tiny_params, short):
    sentences, _ = short
    one = elmo_jax.embed_sentences(tiny_params, sentences, layers="top", batch_tokens=64, devices=[0])
    eight = elmo_jax.embed_sentences(tiny_params, sentences, layers="top", batch_tokens=64)
    for a, b in zip(one, eight):  # other batch shapes: the char CNN's and the LSTM's sums may be reordered
        terms = char_cnn_terms(tiny_params.config) + lstm_terms(tiny_params.config, len(b) + 2)
        assert_close_up_to_order(a, b, terms)


def test_programs_are_bounded_by_the_buckets(tiny_params):
    """Forty sentences of 1-8 short words are one bucket: one program, which a second embedder with
    other sentences of that bucket reuses (a loop over `embed` would compile one per length)."""
    rng = np.random.default_rng(0)
    words = ["the", "bank", "of", "a", "river", "ran", "dry"]
    first = [list(rng.choice(words, n)) for n in rng.integers(1, 9, 40)]
    embedder = elmo_jax.SentenceEmbedder(tiny_params, layers="top", batch_tokens=64)
    embedder.embed(first)
    assert embedder.stats["compiled_shapes"] == 1 and embedder.stats["batches"] == 5
    program = batch_runner._chars_program(embedder.runner.mesh, "top", "float32")
    compiled = program._cache_size()
    second = elmo_jax.SentenceEmbedder(tiny_params, layers="top", batch_tokens=64)
    second.embed([list(rng.choice(words, n)) for n in (1, 2, 3, 5, 8)])
    assert program._cache_size() == compiled


def test_stream_keeps_input_order_with_a_small_window(tiny_params, short):
    sentences, _ = short
    sentences = sentences * 4
    expected = elmo_jax.embed_sentences(tiny_params, sentences, layers="top", batch_tokens=64)
    embedder = elmo_jax.SentenceEmbedder(tiny_params, layers="top", batch_tokens=64)
    got = list(embedder.stream((s for s in sentences), window=3))
    assert len(got) == len(sentences) and embedder.stats["forced_flushes"] > 0
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    streamed = list(elmo_jax.stream_sentences(tiny_params, iter(sentences), layers="top", batch_tokens=64))
    assert all(np.array_equal(a, b) for a, b in zip(streamed, expected))


def test_token_cache_gives_the_same_vectors(tiny_params, short):
    sentences, _ = short
    words = sorted({w for s in sentences for w in s})
    cache = elmo_jax.build_token_cache(tiny_params, words[::2])  # half cached, half through the char CNN
    plain = elmo_jax.embed_sentences(tiny_params, sentences, layers="top", batch_tokens=64)
    cached = elmo_jax.embed_sentences(tiny_params, sentences, layers="top", batch_tokens=64, token_cache=cache)
    for a, b in zip(plain, cached):  # the cached tokens' char CNN ran in another batch
        assert_close_up_to_order(a, b, char_cnn_terms(tiny_params.config))


def test_bad_input_is_named(tiny_params):
    cases = [
        (dict(sentences="the bank ."), "list of tokenized sentences"),
        (dict(sentences=[["ok"], "the bank"]), "sentence 1 must be a list of str tokens, found str (split"),
        (dict(sentences=[["ok", 3]]), "sentence 0, token 1: expected str, found int"),
        (dict(sentences=[["ok"]], layers="first"), "--layers must be one of"),
        (dict(sentences=[["ok"]], layers="top", mix_scalars=(1.0, 2.0, 3.0)), "--mix_scalars goes with"),
        (dict(sentences=[["ok"]], layers="mix", mix_scalars=(1.0,)), "expected 3 values"),
        (dict(sentences=[["ok"]], devices=[8]), "--devices: 8 is not a local device index"),
        (dict(sentences=[["ok"]], devices=[0, 0]), "listed twice"),
        (dict(sentences=[["ok"]], batch_tokens=0), "batch_tokens must be a positive integer"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(ValueError, match=expected.replace("(", r"\(")):
            elmo_jax.embed_sentences(tiny_params, **kwargs)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        elmo_jax.SentenceEmbedder(tiny_params).stream([["ok"]], window=0)
    assert len(jax.local_devices()) == 8


def test_no_sentences_or_only_empty_ones_need_no_program(tiny_params):
    embedder = elmo_jax.SentenceEmbedder(tiny_params, layers="sentence_mean")
    assert embedder.embed([]) == []
    got = embedder.embed([[], []])
    assert [v.shape for v in got] == [(32,), (32,)] and all(np.all(v == 0.0) for v in got)
    assert embedder.stats["batches"] == 0 and embedder.stats["compiled_shapes"] == 0
    assert elmo_jax.embed_sentences(tiny_params, [[]])[0].shape == (3, 0, 32)
