"""Fresh-state sentences in training: the stream marks them, the LSTM zeroes its state there.

`embed` always reads `<S>` from a zero state, but a bilm-tf stream carries the state forever, so a model
would see that only once; the stream can pick sentences (by a hash of seed, direction and position) to
be read from a zero state instead.
"""

import jax
import numpy as np
import pytest

import elmo_jax
from elmo_jax.data.batch_stream import BiLMBatchStream
from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.model.lstm import zero_state
from elmo_jax.training.lm import lm_outputs
from tests.support.models import randomize
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms, lstm_terms

SENTENCES = [" ".join(f"w{(i * 3 + j) % 7}" for j in range(1 + i % 5)) for i in range(40)]


@pytest.fixture()
def vocab(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("<S>\n</S>\n<UNK>\n" + "".join(f"w{i}\n" for i in range(7)), encoding="utf-8")
    return Vocab.load(str(path))


def windows(vocab, p, n=20, seed=3, **kwargs):
    stream = BiLMBatchStream(SENTENCES, vocab, batch_size=4, unroll_steps=6, seed=seed, reset_probability=p, **kwargs)
    return [next(stream) for _ in range(n)]


def test_resets_fall_on_sentence_starts_with_the_asked_probability(vocab):
    never, always, some = windows(vocab, 0.0), windows(vocab, 1.0), windows(vocab, 0.3, n=200)
    assert not any(w[d]["reset"].any() for w in never for d in ("forward", "backward"))
    for w in always:  # every sentence start (input <S> forward, </S> backward) and nothing else
        np.testing.assert_array_equal(w["forward"]["reset"], w["forward"]["token_ids"] == vocab.bos_id)
        np.testing.assert_array_equal(w["backward"]["reset"], w["backward"]["token_ids"] == vocab.eos_id)
    starts = sum(int((w["forward"]["token_ids"] == vocab.bos_id).sum()) for w in some)
    resets = sum(int(w["forward"]["reset"].sum()) for w in some)
    assert abs(resets / starts - 0.3) < 4 * np.sqrt(0.3 * 0.7 / starts)  # binomial, 4 sigma


def test_resets_are_deterministic_and_independent_of_the_process_layout(vocab):
    one = windows(vocab, 0.5)
    again = windows(vocab, 0.5)
    halves = [windows(vocab, 0.5, process_index=p, process_count=2) for p in range(2)]
    for i in range(len(one)):
        for d in ("forward", "backward"):
            np.testing.assert_array_equal(one[i][d]["reset"], again[i][d]["reset"])
            joined = np.concatenate([halves[0][i][d]["reset"], halves[1][i][d]["reset"]])
            np.testing.assert_array_equal(joined, one[i][d]["reset"])


@pytest.mark.slow
def test_lstm_reset_equals_reading_from_a_zero_state():
    """Outputs after a reset position equal a fresh run over the tokens from that position on."""
    config = elmo_jax.BiLMConfig(
        char_embed_dim=4, filters=((1, 4), (2, 8)), n_highway=1, lstm_dim=12, projection_dim=6, n_layers=2
    )
    params = elmo_jax.init_params(config, jax.random.key(0))
    rng = np.random.default_rng(0)
    D, B, T = 2, 3, 7
    chars = rng.integers(1, 255, size=(D, B, T, 50)).astype(np.int32)
    mask = np.ones((D, B, T), bool)
    state = zero_state(config, B)
    state = state._replace(c=state.c + 0.5, h=state.h - 0.25)  # a non-zero carried state
    resets = np.zeros((D, B, T), bool)
    resets[0, 1, 3] = resets[1, 2, 5] = True
    out, _ = lm_outputs(params, chars, mask, state, resets=resets)
    fresh, _ = lm_outputs(params, chars[:, :, 3:], mask[:, :, 3:], zero_state(config, B))
    # Shorter sequences: the char CNN's and the LSTM's sums may be ordered otherwise.
    terms = char_cnn_terms(config) + lstm_terms(config, T)
    assert_close_up_to_order(np.asarray(out)[0, 1, 3:], np.asarray(fresh)[0, 1], terms)
    fresh, _ = lm_outputs(params, chars[:, :, 5:], mask[:, :, 5:], zero_state(config, B))
    assert_close_up_to_order(np.asarray(out)[1, 2, 5:], np.asarray(fresh)[1, 2], terms)
    unreset, _ = lm_outputs(params, chars, mask, state)  # other rows are untouched by the resets
    np.testing.assert_array_equal(np.asarray(out)[0, 0], np.asarray(unreset)[0, 0])
    assert np.abs(np.asarray(out)[0, 1, 3:] - np.asarray(unreset)[0, 1, 3:]).max() > 1e-3


def test_heldout_from_zero_state_reads_each_sentence_alone(corpus):
    """`heldout_perplexity(..., from_zero_state=True)` with 3 rows, each reading 4 sentences, scores like 12
    rows reading one sentence each from a zero state; carrying the state across sentences scores otherwise."""
    from configs import tiny
    from elmo_jax.training import settings
    from elmo_jax.training.heldout import heldout_perplexity
    from elmo_jax.training.train_step import init_train_state

    sentences = corpus["heldout_sentences"][:12]
    words = sorted({w for s in sentences for w in s.split()})
    vocab = Vocab(["<S>", "</S>", "<UNK>", *words])
    config = tiny.get_config()
    cfg = settings.step_config(config, len(vocab))
    # Random weights on the shapes of a fresh state (running the initialisers costs seconds of compilation).
    shapes = jax.eval_shape(lambda: init_train_state(jax.random.key(0), cfg, settings.optimizer(config), 12)).params
    bilm = randomize(elmo_jax.BiLMParams(weights=shapes["bilm"], config=cfg.model), seed=1).weights
    rng = np.random.default_rng(2)
    softmax = {
        k: jax.numpy.asarray(rng.normal(0.0, 1.0, v.shape), jax.numpy.float32) for k, v in shapes["softmax"].items()
    }
    params = {"bilm": bilm, "softmax": softmax}
    alone = heldout_perplexity(params, cfg, sentences, vocab, 12)
    zero = heldout_perplexity(params, cfg, sentences, vocab, 3, from_zero_state=True)
    carried = heldout_perplexity(params, cfg, sentences, vocab, 3)
    assert zero["tokens"] == alone["tokens"] == carried["tokens"]
    for key in ("forward_perplexity", "backward_perplexity"):
        assert zero[key] == pytest.approx(alone[key], rel=1e-5)
        assert abs(carried[key] - alone[key]) > 1e-4 * alone[key]


def test_a_direction_worse_than_a_uniform_guess_is_warned_about(caplog):
    """Perplexity above the vocabulary size (worse than guessing uniformly) is what a sampled-softmax
    model with saturated outputs shows only under the full softmax (bench/RESULTS.md, "State resets"):
    one warning per such direction, naming it, the figure and the vocabulary size; none at or below V."""
    from elmo_jax.training.heldout import warn_if_worse_than_uniform

    with caplog.at_level("WARNING"):
        warned = warn_if_worse_than_uniform({"forward_perplexity": 1.83e10, "backward_perplexity": 252.9}, 14682)
    assert len(warned) == 1 and warned[0].startswith("heldout forward perplexity 1.83e+10 is worse than a uniform")
    assert "14682 words" in warned[0] and "state_reset_probability=0" in warned[0]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == warned
    assert warn_if_worse_than_uniform({"forward_perplexity": 14682.0, "backward_perplexity": 14681.9}, 14682) == []
    both = warn_if_worse_than_uniform({"forward_perplexity": 2e4, "backward_perplexity": 3e4}, 14682)
    assert [w.split()[1] for w in both] == ["forward", "backward"]
