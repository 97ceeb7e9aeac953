"""The bidirectional LM batch stream: bilm-tf's windowing, resumption, and sharding over processes."""

import numpy as np
import pytest

from elmo_jax.data.batch_stream import BiLMBatchStream, merge_states
from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.model.chars import BOS_CHAR, EOS_CHAR, token_to_raw_ids

# ids: <S>=0 </S>=1 <UNK>=2 a=3 b=4 c=5; "d" and "e" are out of vocabulary.
SENTENCES = ["a b", "c", "a d e"]


@pytest.fixture()
def vocab(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("<S>\n</S>\n<UNK>\na\nb\nc\n", encoding="utf-8")
    return Vocab.load(str(path))


def take(stream, n):
    return [next(stream) for _ in range(n)]


def test_forward_windows_match_hand_computed_example(vocab):
    """Rows read positions r, r+B, ...: row 0 gets s0, s2, s1(epoch 1); row 1 gets s1, s0(epoch 1), s2."""
    stream = BiLMBatchStream(SENTENCES, vocab, batch_size=2, unroll_steps=3, seed=None)
    w = [b["forward"] for b in take(stream, 3)]
    # Row 0: <S> a b | </S> ; <S> a d | e ; e -> </S>, <S> c -> </S>
    np.testing.assert_array_equal(w[0]["token_ids"][0], [0, 3, 4])
    np.testing.assert_array_equal(w[0]["targets"][0], [3, 4, 1])
    np.testing.assert_array_equal(w[1]["token_ids"][0], [0, 3, 2])  # d is <UNK> as an input id ...
    np.testing.assert_array_equal(w[1]["targets"][0], [3, 2, 2])
    np.testing.assert_array_equal(w[2]["token_ids"][0], [2, 0, 5])  # a window crossing a sentence boundary
    np.testing.assert_array_equal(w[2]["targets"][0], [1, 5, 1])
    # Row 1: <S> c, then s0 begins in the same window.
    np.testing.assert_array_equal(w[0]["token_ids"][1], [0, 5, 0])
    np.testing.assert_array_equal(w[0]["targets"][1], [5, 1, 3])
    np.testing.assert_array_equal(w[1]["token_ids"][1], [3, 4, 0])
    np.testing.assert_array_equal(w[1]["targets"][1], [4, 1, 3])
    # ... but its characters are its own; <S> has the boundary characters.
    np.testing.assert_array_equal(w[1]["char_ids"][0, 2], token_to_raw_ids("d"))
    np.testing.assert_array_equal(w[0]["char_ids"][0, 0, :3], [258, BOS_CHAR, 259])
    assert all(x["mask"].all() for x in w)
    np.testing.assert_array_equal(w[0]["carry"], [False, False])
    np.testing.assert_array_equal(w[1]["carry"], [True, True])


def test_backward_windows_read_reversed_sentences(vocab):
    """bilm-tf encodes a reversed sentence as </S> wn .. w1 <S>: targets are the previous words."""
    stream = BiLMBatchStream(SENTENCES, vocab, batch_size=2, unroll_steps=3, seed=None)
    w = [b["backward"] for b in take(stream, 2)]
    np.testing.assert_array_equal(w[0]["token_ids"][0], [1, 4, 3])  # </S> b a
    np.testing.assert_array_equal(w[0]["targets"][0], [4, 3, 0])  # b a <S>
    np.testing.assert_array_equal(w[1]["token_ids"][0], [1, 2, 2])  # </S> e d  (s2 reversed)
    np.testing.assert_array_equal(w[1]["targets"][0], [2, 2, 3])
    np.testing.assert_array_equal(w[0]["char_ids"][0, 0, :3], [258, EOS_CHAR, 259])
    np.testing.assert_array_equal(w[1]["char_ids"][0, 1], token_to_raw_ids("e"))


def test_shuffled_directions_are_independent_and_seeded(vocab):
    sentences = [f"a b c {'a ' * (i % 5)}".strip() + f" w{i}" for i in range(200)]
    a = take(BiLMBatchStream(sentences, vocab, batch_size=4, unroll_steps=7, seed=3), 5)
    b = take(BiLMBatchStream(sentences, vocab, batch_size=4, unroll_steps=7, seed=3), 5)
    c = take(BiLMBatchStream(sentences, vocab, batch_size=4, unroll_steps=7, seed=4), 5)
    for x, y in zip(a, b):
        for d in ("forward", "backward"):
            for k in x[d]:
                np.testing.assert_array_equal(x[d][k], y[d][k])
    assert any(not np.array_equal(x["forward"]["char_ids"], y["forward"]["char_ids"]) for x, y in zip(a, c))
    # The backward stream is its own shuffle, not the forward sentences mirrored.
    fwd_first = a[0]["forward"]["char_ids"][:, 1]
    bwd_last_word = a[0]["backward"]["char_ids"][:, 1]
    assert not np.array_equal(fwd_first, bwd_last_word)


def test_restore_continues_bit_for_bit(vocab):
    sentences = [" ".join(f"t{(i * 7 + j) % 13}" for j in range(1 + i % 9)) for i in range(57)]
    make = lambda: BiLMBatchStream(sentences, vocab, batch_size=6, unroll_steps=5, seed=11)
    reference = take(make(), 40)  # crosses epochs: 57 sentences, ~6 tokens each, 6 rows
    first = make()
    take(first, 17)
    state = first.get_state()
    resumed = make()
    resumed.set_state(state)
    for x, y in zip(reference[17:], take(resumed, 23)):
        for d in ("forward", "backward"):
            for k in x[d]:
                np.testing.assert_array_equal(x[d][k], y[d][k], err_msg=f"{d}/{k}")
    assert resumed.epoch >= 1


@pytest.mark.parametrize("n_processes", [1, 2, 4])
def test_process_shares_reassemble_the_global_stream(vocab, n_processes):
    sentences = [" ".join(f"t{(i * 5 + j) % 17}" for j in range(1 + i % 7)) for i in range(41)]
    kwargs = dict(batch_size=8, unroll_steps=4, seed=5)
    global_windows = take(BiLMBatchStream(sentences, vocab, **kwargs), 12)
    shares = [
        BiLMBatchStream(sentences, vocab, process_index=p, process_count=n_processes, **kwargs)
        for p in range(n_processes)
    ]
    share_windows = [take(s, 12) for s in shares]
    for step in range(12):
        for d in ("forward", "backward"):
            for k in global_windows[step][d]:
                joined = np.concatenate([share_windows[p][step][d][k] for p in range(n_processes)])
                np.testing.assert_array_equal(joined, global_windows[step][d][k])
    # A state merged from all processes restores into a single process.
    single = BiLMBatchStream(sentences, vocab, **kwargs)
    single.set_state(merge_states([s.get_state() for s in shares]))
    expected = take_after(sentences, vocab, kwargs, 12)
    got = next(single)
    for d in ("forward", "backward"):
        for k in expected[d]:
            np.testing.assert_array_equal(got[d][k], expected[d][k])


def take_after(sentences, vocab, kwargs, n):
    """The window after the first n of a fresh single-process stream."""
    stream = BiLMBatchStream(sentences, vocab, **kwargs)
    take(stream, n)
    return next(stream)


def test_finite_pass_covers_every_token_once_then_stops(vocab):
    sentences = ["a b c", "a", "b c a b", "c c"]
    stream = BiLMBatchStream(sentences, vocab, batch_size=3, unroll_steps=4, seed=None, repeat=False)
    windows = list(stream)
    n_targets = sum(int(w["forward"]["mask"].sum()) for w in windows)
    assert n_targets == sum(len(s.split()) + 1 for s in sentences)  # each word and </S>
    assert sum(int(w["backward"]["mask"].sum()) for w in windows) == n_targets
    last = windows[-1]["forward"]
    assert not last["mask"].all()
    assert (last["targets"][~last["mask"]] == 0).all() and (last["char_ids"][~last["mask"]] == 0).all()


def test_bad_settings_are_reported(vocab):
    with pytest.raises(ValueError, match="not divisible by the process count 3"):
        BiLMBatchStream(SENTENCES, vocab, batch_size=8, unroll_steps=4, process_count=3)
    with pytest.raises(ValueError, match="empty"):
        BiLMBatchStream([], vocab, batch_size=2, unroll_steps=4)
    stream = BiLMBatchStream(SENTENCES, vocab, batch_size=2, unroll_steps=3, seed=1)
    other = BiLMBatchStream(SENTENCES, vocab, batch_size=2, unroll_steps=4, seed=1)
    with pytest.raises(ValueError, match="unroll_steps"):
        other.set_state(stream.get_state())


def test_words_past_the_char_cache_limit_encode_the_same(vocab, monkeypatch):
    """The per-word character cache is bounded; words beyond it are encoded on the spot, identically."""
    sentences = ["a bb ccc", "dddd a eeeee ffffff", "c b a"] * 3
    cached = take(BiLMBatchStream(sentences, vocab, batch_size=2, unroll_steps=7, seed=None), 5)
    monkeypatch.setattr("elmo_jax.data.batch_stream.CHAR_CACHE_LIMIT", 2)
    uncached = take(BiLMBatchStream(sentences, vocab, batch_size=2, unroll_steps=7, seed=None), 5)
    for x, y in zip(cached, uncached):
        for d in ("forward", "backward"):
            for k in x[d]:
                np.testing.assert_array_equal(x[d][k], y[d][k])
    np.testing.assert_array_equal(cached[0]["forward"]["char_ids"][0, 2], token_to_raw_ids("bb"))  # <S> a bb
