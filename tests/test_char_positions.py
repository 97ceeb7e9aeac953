"""The char CNN computes only the character positions a batch uses; results must not change.

Words are short and C = 50: `embed` looks at the first S positions (S = the longest token's content,
rounded up to a multiple of 8) plus one all-PAD window, instead of all 50. These tests run that path
against AllenNLP's activations and against the full computation.
"""

import jax
import numpy as np

import elmo_jax
from elmo_jax.model.char_cnn import content_width, token_embedding
from elmo_jax.model.precision import ComputeOptions
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms

SHORT_ROWS = [0, 1, 6, 7]  # "The quick brown fox ...", "Elmo", "Hello !", "In 1872 , the committee ..."


def test_short_token_rows_use_fewer_positions_and_match_allennlp(tiny_params, load_batch):
    batch = load_batch("main")
    ids = batch.arrays["char_ids"][SHORT_ROWS]
    assert content_width(ids) == 11  # BOW + "committee" + EOW
    layers, mask = elmo_jax.embed(tiny_params, ids)
    expected = batch.arrays["activations"][:, SHORT_ROWS]
    expected_mask = batch.arrays["mask"][SHORT_ROWS]
    np.testing.assert_array_equal(np.asarray(mask), expected_mask)
    got = np.asarray(layers).transpose(1, 0, 2, 3)
    np.testing.assert_allclose(got[:, expected_mask], expected[:, expected_mask], atol=1e-5, rtol=0)
    assert np.all(got[:, ~expected_mask] == 0.0)


def test_trimmed_positions_equal_the_full_computation(tiny_params):
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghij"), size=rng.integers(0, 12))) for _ in range(300)]
    ids = elmo_jax.batch_to_ids([words])[0]  # (N, 50), tokens of 0..11 bytes
    width = content_width(ids)
    assert width == 13
    full = token_embedding(tiny_params.weights, tiny_params.config, ids)
    for positions in (width, 16, 40):
        trimmed = token_embedding(
            tiny_params.weights, tiny_params.config, ids, ComputeOptions(content_positions=positions)
        )
        assert_close_up_to_order(trimmed, full, char_cnn_terms(tiny_params.config))


def test_content_width_ignores_padding_tokens_and_counts_every_other_id():
    ids = np.zeros((2, 3, 50), np.int32)
    ids[0, 0] = elmo_jax.model.chars.token_to_raw_ids("abc") + 1  # BOW a b c EOW -> 5
    assert content_width(ids) == 5
    ids[1, 0, :] = 261  # a (strange) token of nothing but PAD counts as having no content
    ids[1, 0, 20] = 7  # ... until some other id appears at position 20
    assert content_width(ids) == 21


def test_tanh_and_no_highway_trimmed_equal_full():
    config = elmo_jax.BiLMConfig(
        char_embed_dim=3,
        filters=((1, 2), (4, 3), (6, 5)),
        n_highway=0,
        activation="tanh",
        lstm_dim=8,
        projection_dim=4,
        n_layers=1,
    )
    params = elmo_jax.init_params(config, jax.random.key(1))
    ids = elmo_jax.batch_to_ids([["a", "bb", "ccccccc", "", "d" * 30]])[0]
    full = token_embedding(params.weights, config, ids)
    trimmed = token_embedding(params.weights, config, ids, ComputeOptions(content_positions=content_width(ids)))
    assert_close_up_to_order(trimmed, full, char_cnn_terms(config))
