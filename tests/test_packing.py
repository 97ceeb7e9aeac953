"""Several sentences per batch row (`features/packing.py`, `model.bilm.packed_layers`): what
`embed_sentences` runs when its batches hold rows of 32 steps on every device.

References: AllenNLP's own biLM activations of the fixture sentences (tests/fixtures/allennlp_tiny; 1e-5,
as tests/test_parity_allennlp.py), and for the pooled mode the NumPy formula on them. The packing itself
(every sentence once, in a row that holds it, few shapes, little padding, and only the shapes the
packer names) is checked on lengths alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import elmo_jax
from elmo_jax.features import batch_runner
from elmo_jax.features.length_buckets import Piece
from elmo_jax.features.packing import MIN_ROW, PackedBatch, RowPacker, fill_rows, row_length
from elmo_jax.model.chars import BOS_CHAR, EOS_CHAR
from tests.reference.elmo_equations import np_sentence_mean

ATOL = 1e-5
S, GAMMA = np.array([0.5, -1.0, 2.0]), 0.7


def lognormal_lengths(n: int, seed: int = 0, longest: int = 60) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(2.7, 0.6, n).astype(int), 1, longest)


def fake_pieces(lengths, S: int = 16) -> list[Piece]:
    """Pieces whose every token's ids name the sentence and the token (line * 1000 + offset), so a
    batch's chars say where each token went."""
    C = 4
    return [
        Piece(line, 0, np.full((n, C), 0, np.int32) + (line * 1000 + np.arange(n))[:, None], S)
        for line, n in enumerate(lengths)
    ]


def test_fill_rows_places_every_sentence_once_in_a_row_that_holds_it():
    rng = np.random.default_rng(1)
    steps = list(lognormal_lengths(3000) + 2) + list(rng.integers(60, 700, 20) + 2)
    rows = fill_rows(steps)
    assert sorted(i for row in rows for i in row) == list(range(len(steps)))
    for row in rows:
        assert steps[row[0]] == max(steps[i] for i in row)  # the longest first: it sets the row length
        assert sum(steps[i] for i in row) <= row_length(steps[row[0]])
    used = sum(row_length(steps[row[0]]) for row in rows)
    assert used / sum(steps) < 1.02, used / sum(steps)
    assert fill_rows([]) == []


@pytest.mark.parametrize("n", [7, 5000])
def test_batches_hold_every_piece_once_in_few_shapes_with_little_padding(n):
    """Ids land where `places` says, between their own <S> and </S>, with `starts` and `segments`
    marking them; rows split over 8 devices; the shapes are a few, and so is the padding."""
    lengths = lognormal_lengths(n)
    pieces = fake_pieces(lengths)
    packer = RowPacker(4096, 4, row_multiple=8)
    batches = []
    for piece in pieces:
        batches += packer.add(piece)
    assert n < 1000 or batches, "full batches are handed out before the end"
    batches += packer.flush()
    assert packer.waiting == 0
    seen = []
    for batch in batches:
        assert isinstance(batch, PackedBatch) and batch.chars.shape[0] % 8 == 0
        rows, T2, _ = batch.shape
        assert T2 >= MIN_ROW and rows * T2 <= 4096
        for (row, start, k), piece in zip(batch.places, batch.pieces):
            m = piece.n_tokens
            np.testing.assert_array_equal(batch.chars[row, start : start + m], piece.chars)
            assert batch.chars[row, start - 1, 1] == BOS_CHAR + 1 and batch.chars[row, start + m, 1] == EOS_CHAR + 1
            assert batch.starts[row, start - 1] and not batch.starts[row, start : start + m + 1].any()
            assert (batch.segments[row, start : start + m] == k).all()
            seen.append(piece.line)
        occupied = batch.starts.any(axis=1).sum()
        assert not batch.chars[occupied:].any()  # empty rows only after the used ones
    assert sorted(seen) == list(range(n))
    slots = sum(b.token_slots for b in batches)
    shapes = {b.shape for b in batches}
    if n > 1000:
        assert slots / lengths.sum() < 1.03 and len(shapes) <= 4, (slots / lengths.sum(), shapes)


def test_a_partly_filled_batch_rounds_its_rows_to_a_power_of_two_or_a_tail_step():
    # 4,096 steps in rows of 64: a full batch has 64 rows; by default a tail step is 8 rows, with
    # tail_steps=16 it is 4 (worked out by hand: min(next power of two, next multiple of the step)).
    needed = (1, 3, 5, 10, 17, 63)
    assert [RowPacker(4096, 4).tail_rows(n, 64) for n in needed] == [1, 4, 8, 16, 24, 64]
    assert [RowPacker(4096, 4, tail_steps=16).tail_rows(n, 64) for n in needed] == [1, 4, 8, 12, 20, 64]
    # ... and to the devices: 12 rows over 8 devices are 16.
    assert RowPacker(4096, 4, row_multiple=8, tail_steps=16).tail_rows(10, 64) == 16


def packed_shapes(packer: RowPacker, lengths, widths) -> list[tuple[int, int, int]]:
    """The shapes of the batches `packer` hands out for sentences of `lengths` tokens and width buckets
    `widths`, added one by one and flushed (what one merged batch of the service is)."""
    batches = []
    for n, S in zip(lengths, widths):
        batches += packer.add(Piece(0, 0, np.zeros((int(n), 4), np.int32), int(S)))
    return [batch.shape for batch in [*batches, *packer.flush()]]


def test_the_packer_names_every_shape_it_hands_out():
    """`RowPacker.shapes` (what the service's warm-up compiles): by hand for one packer (1,024-step
    batches, tail_steps 4, sentences of up to 60 tokens: rows of 32 and 64 steps, a partly filled
    batch's rows rounded to a power of two or a multiple of 8 (32-step rows) or 4 (64-step rows), one row
    alone shortened to 8 or 16 steps); each shape's sentences, packed alone, make one batch of it; and
    the batches of random sentences, long and short, on 1 and 6 devices, have no other shape."""
    named = RowPacker(1024, 4, tail_steps=4).shapes(60)
    expected = {(r, 32) for r in (1, 2, 4, 8, 16, 24, 32)} | {(r, 64) for r in (1, 2, 4, 8, 12, 16)} | {(1, 8), (1, 16)}
    assert set(named) == expected
    rng = np.random.default_rng(3)
    for row_multiple, tail_steps, max_tokens in [(1, 4, 60), (6, 8, 126), (1, 16, 5)]:
        shapes = RowPacker(1024, 4, row_multiple=row_multiple, tail_steps=tail_steps).shapes(max_tokens)
        for shape, lengths in shapes.items():
            assert max(lengths) <= max_tokens
            packer = RowPacker(1024, 4, row_multiple=row_multiple, tail_steps=tail_steps)
            assert packed_shapes(packer, lengths, [8] * len(lengths)) == [(*shape, 8)]
        packer = RowPacker(1024, 4, row_multiple=row_multiple, tail_steps=tail_steps)
        for _ in range(60):
            k = int(rng.integers(1, 300))
            short = rng.integers(1, min(max_tokens, 8) + 1, k)
            lengths = np.where(rng.random(k) < 0.5, short, rng.integers(1, max_tokens + 1, k))
            for rows, T2, S in packed_shapes(packer, lengths, rng.choice([8, 16, 24], k, p=[0.7, 0.25, 0.05])):
                assert (rows, T2) in shapes and S in (8, 16, 24), (row_multiple, max_tokens, rows, T2)


def test_the_embedder_hands_its_tail_steps_to_its_packer(tiny_params):
    assert elmo_jax.SentenceEmbedder(tiny_params, tail_steps=16)._batcher().tail_steps == 16
    with pytest.raises(ValueError, match="tail_steps must be a positive integer, found 0"):
        elmo_jax.SentenceEmbedder(tiny_params, tail_steps=0)


def test_a_small_width_group_joins_a_wider_one_and_a_large_one_keeps_its_own():
    pieces = fake_pieces([10] * 20, S=8) + fake_pieces([10] * 2000, S=16) + fake_pieces([10] * 30, S=24)
    packer = RowPacker(1024, 4)
    batches = [b for p in pieces for b in packer.add(p)] + list(packer.flush())
    widths = {}
    for batch in batches:
        for piece in batch.pieces:
            widths.setdefault(piece.S, set()).add(batch.S)
    assert widths == {8: {16}, 16: {16}, 24: {24}}


@pytest.fixture(scope="module")
def fixture_sentences(load_batch):
    """Every fixture sentence (unicode, 48/49-byte tokens, literal <S>, an empty token and an empty
    sentence) and AllenNLP's (L+1, n, D) activations of each."""
    sentences, expected = [], []
    for name in ("main", "edge"):
        batch = load_batch(name)
        for b, sentence in enumerate(batch.sentences):
            sentences.append(sentence)
            expected.append(batch.arrays["activations"][:, b, : len(sentence)].astype(np.float64))
    return sentences, expected


@pytest.mark.parametrize("devices,batch_tokens", [([0], 64), (None, 256)], ids=["one_device", "eight_devices"])
def test_packed_rows_equal_allennlp(tiny_params, fixture_sentences, devices, batch_tokens):
    """Both directions of every layer, sentence by sentence, with the others in the same rows."""
    sentences, expected = fixture_sentences
    embedder = elmo_jax.SentenceEmbedder(tiny_params, batch_tokens=batch_tokens, devices=devices)
    got = embedder.embed(sentences * 3)  # more sentences than a row holds: several per row, several rows
    assert all(shape[0] == "packed" for shape in embedder.runner.shapes)
    assert embedder.stats["batches"] < len(sentences)
    for b, vectors in enumerate(got):
        reference = expected[b % len(sentences)]
        assert vectors.dtype == np.float32 and vectors.shape == reference.shape, b
        np.testing.assert_allclose(vectors, reference, rtol=0, atol=ATOL, err_msg=f"sentence {b}")


def test_packed_top_layer_and_sentence_mean_equal_their_formulas(tiny_params, fixture_sentences):
    sentences, expected = fixture_sentences
    top = elmo_jax.embed_sentences(tiny_params, sentences, layers="top", batch_tokens=64, devices=[0])
    means = elmo_jax.embed_sentences(
        tiny_params, sentences, layers="sentence_mean", mix_scalars=tuple(S), gamma=GAMMA, batch_tokens=64, devices=[0]
    )
    for b, reference in enumerate(expected):
        np.testing.assert_allclose(top[b], reference[-1], rtol=0, atol=ATOL, err_msg=f"sentence {b}")
        np.testing.assert_allclose(means[b], np_sentence_mean(reference, S, GAMMA), rtol=0, atol=ATOL)


def test_a_second_call_compiles_and_copies_nothing(tiny_params, fixture_sentences):
    """A new `embed_sentences` call (a new SentenceEmbedder) finds its programs and the weights on the
    devices where the first left them."""
    sentences, _ = fixture_sentences
    first = elmo_jax.SentenceEmbedder(tiny_params, layers="top", batch_tokens=64, devices=[0])
    first.embed(sentences)
    program = batch_runner._packed_program(first.runner.mesh, "top", "float32")
    compiled = program._cache_size()
    second = elmo_jax.SentenceEmbedder(tiny_params, layers="top", batch_tokens=64, devices=[0])
    second.embed(sentences)
    assert second.runner.shapes == first.runner.shapes
    assert batch_runner._packed_program(second.runner.mesh, "top", "float32") is program
    assert program._cache_size() == compiled
    assert second.runner._weights is first.runner._weights
