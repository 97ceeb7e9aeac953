"""Model FLOP counts against numbers worked out by hand from the published architecture."""

import dataclasses

from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.flops import char_cnn_flops_per_token, lstm_flops_per_token, train_flops

ORIGINAL = BiLMConfig.preset("original")  # 2x4096_512_2048cnn_2xhighway
# Per token, 2 FLOPs per multiply-add, every convolution start of the 50 character slots:
# convolutions sum_w 2*w*16*n*(50-w+1) = 17,616,896; 2 highway layers of two 2048x2048 products
# = 33,554,432; projection 2048->512 = 2,097,152.
ORIGINAL_CHAR_CNN = 17_616_896 + 33_554_432 + 2_097_152
# One cell: [x; h] (1024) -> 4 gates of 4096, then 4096 -> 512; 2 layers x 2 directions.
ORIGINAL_LSTM = 4 * (2 * 1024 * 16384 + 2 * 4096 * 512)


def test_forward_counts_of_the_original_model():
    assert char_cnn_flops_per_token(ORIGINAL) == ORIGINAL_CHAR_CNN
    assert lstm_flops_per_token(ORIGINAL) == ORIGINAL_LSTM


def test_train_step_is_three_forwards_of_both_directions_and_the_softmax():
    B, T = 3, 5
    sampled = 2 * 512 * (8192 + 1)  # the true logit and 8192 candidates, per target and direction
    expected = 3 * (2 * B * T * (ORIGINAL_CHAR_CNN + sampled) + B * T * ORIGINAL_LSTM)
    assert train_flops(ORIGINAL, B, T, vocab_size=793_471, n_negative_samples=8192) == expected
    full = 3 * (2 * B * T * (ORIGINAL_CHAR_CNN + 2 * 512 * 1000) + B * T * ORIGINAL_LSTM)
    assert train_flops(ORIGINAL, B, T, vocab_size=1000, n_negative_samples=None) == full


def test_sampled_softmax_never_counts_more_candidates_than_the_vocabulary():
    small = dataclasses.replace(ORIGINAL, lstm_dim=1024, projection_dim=128, n_highway=1)
    capped = train_flops(small, 2, 4, vocab_size=500, n_negative_samples=8192)
    assert capped == train_flops(small, 2, 4, vocab_size=500, n_negative_samples=500)


def test_elmoformanylangs_shaped_models_count_the_word_columns_and_the_output_projection():
    """The released ELMoForManyLangs architecture (docs/MANY_LANGUAGES.md): the original model's char CNN
    with char_dim 50 and a 100-wide word vector joined before the projection ((100 + 2048) -> 512); its
    'lstm' encoder, one plain layer of 4096 cells whose [x; h] is 512 + 4096 wide, projected after."""
    efml = dataclasses.replace(
        ORIGINAL,
        char_embed_dim=50,
        char_vocab_size=100,
        char_specials=(0, 1, 2, 3, 4),
        word_vocab_size=50,
        word_dim=100,
        word_specials=(2, 3),
    )
    convolutions = sum(2 * w * 50 * n * (50 - w + 1) for w, n in ORIGINAL.filters)
    assert char_cnn_flops_per_token(efml) == convolutions + 33_554_432 + 2 * 2148 * 512
    assert lstm_flops_per_token(efml) == ORIGINAL_LSTM
    lstm = dataclasses.replace(efml, n_layers=1, cell_clip=None, proj_clip=None, lstm_output_projection=True)
    assert lstm_flops_per_token(lstm) == 2 * (2 * (512 + 4096) * 16384 + 2 * 4096 * 512)
