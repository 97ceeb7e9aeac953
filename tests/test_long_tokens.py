"""One rule for a token longer than the model reads (docs/ELMO.md, "Long tokens"): the library, the file
pipeline and the service all cut it to its first C-2 = 48 UTF-8 bytes, as bilm-tf trained the published
models and AllenNLP reads them, and each says how many it cut.

References: the character ids of each token written out by hand from its bytes ([BOW 258, bytes, EOW
259, PAD 260...] + 1, the cut token's bytes sliced here: the multi-byte token is cut inside a character,
so no str holds it), embedded in one padded batch by `embed`; the three paths batch it otherwise (packed
rows, length buckets), so each is compared with a bound derived from float32 rounding
(tests/support/tolerance.py), and so the three are equal to twice that bound. The counts are those of
the sentences below, by hand: 2 of 6 tokens cut.

Before the rule the service refused the request (400, "a token of 60 UTF-8 bytes"), and neither the
library nor `embed_file` counted what they cut.
"""

from __future__ import annotations

import io
import logging

import h5py
import numpy as np
import pytest

import elmo_jax
from elmo_jax.features.sentences import SentenceEmbedder
from elmo_jax.files import file_embedding as ef
from elmo_jax.formats import vector_spool
from elmo_jax.serving import DynamicBatcher, Limits, make_app
from tests.support.embed_files import as_left_by_a_dead_process, staging_dirs
from tests.support.service_client import request, running
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms, lstm_terms

LONG = "x" * 60  # 60 bytes: keeps its first 48
MULTI = "a" + "ü" * 30  # 61 bytes, "ü" two each: its first 48 end with the first byte of the 24th "ü"
SENTENCE = ["the", LONG, "bank", MULTI, "of", "."]


def note(tokens: int) -> str:
    """The warning's words for SENTENCE's 2 cut tokens among `tokens`."""
    return f"2 of {tokens} tokens are longer than the model's 48 UTF-8 bytes and were cut to 48"


def hand_ids(data: bytes, C: int = 50) -> np.ndarray:
    """Shifted ids (C,) of a token whose bytes are `data` (at most C-2), by docs/ELMO.md's "Characters"."""
    raw = np.full(C, 260, np.int32)
    raw[0], raw[1 : 1 + len(data)], raw[1 + len(data)] = 258, list(data), 259
    return raw + 1


@pytest.fixture(scope="module")
def reference(tiny_params) -> np.ndarray:
    """float64 (L+1, 6, 2P) layers of SENTENCE with its long tokens cut by hand."""
    cut = [token.encode("utf-8")[:48] for token in SENTENCE]
    assert cut[1] == b"x" * 48 and cut[3] == b"a" + "ü".encode() * 23 + b"\xc3"  # cut mid-character
    layers, _ = elmo_jax.embed(tiny_params, np.stack([hand_ids(data) for data in cut])[None])
    return np.asarray(layers, np.float64)[0]


def assert_reference(vectors, reference, config, what: str) -> None:
    terms = char_cnn_terms(config) + lstm_terms(config, len(SENTENCE) + 2)
    assert vectors.shape == reference.shape, what
    assert_close_up_to_order(vectors, reference, terms, what)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "UTF-8 bytes" in r.getMessage()]


def test_the_library_cuts_and_warns_once_per_call(tiny_params, reference, caplog):
    """`batch_to_ids`, `embed_sentences` and `stream_sentences` (once it ends) each log the count once;
    `stats` keeps it; the vectors are those of the tokens cut by hand."""
    with caplog.at_level(logging.WARNING):
        chars = elmo_jax.batch_to_ids([SENTENCE, ["a"]])
        assert len(warnings_of(caplog)) == 1 and note(7) in warnings_of(caplog)[0]
        caplog.clear()
        embedder = SentenceEmbedder(tiny_params, layers="all", batch_tokens=256)
        (vectors,) = embedder.embed([SENTENCE])
        assert len(warnings_of(caplog)) == 1 and note(6) in warnings_of(caplog)[0]
        assert 'docs/ELMO.md, "Long tokens"' in warnings_of(caplog)[0]
        assert embedder.stats["truncated_tokens"] == 2
        caplog.clear()
        streamed = elmo_jax.stream_sentences(tiny_params, [SENTENCE, ["the"]], layers="all", batch_tokens=256)
        assert next(streamed).shape == vectors.shape and warnings_of(caplog) == []  # said at the end
        assert len(list(streamed)) == 1 and len(warnings_of(caplog)) == 1 and note(7) in warnings_of(caplog)[0]
        caplog.clear()
        embedder.embed([["the", "bank"]])  # nothing cut: nothing said
        assert warnings_of(caplog) == []
    np.testing.assert_array_equal(chars[0, :6], np.stack([hand_ids(t.encode()[:48]) for t in SENTENCE]))
    assert_reference(vectors, reference, tiny_params.config, "embed_sentences")


def test_the_file_pipeline_cuts_and_counts(tiny_params, reference, tmp_path, caplog):
    """`embed_file` writes the vectors of the tokens cut by hand, counts them, and its summary says so."""
    source = tmp_path / "in.txt"
    source.write_text(" ".join(SENTENCE) + "\nthe bank\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        counts = ef.embed_file(tiny_params, str(source), str(tmp_path / "out.hdf5"), ef.Options(layers="all"))
    assert counts["truncated_tokens"] == 2
    assert len(warnings_of(caplog)) == 1 and note(8) in warnings_of(caplog)[0]
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        vectors = f["0"][...]
    assert_reference(vectors, reference, tiny_params.config, "embed_file")


def test_a_resumed_run_counts_the_whole_input(tiny_params, tmp_path, monkeypatch):
    """A run stopped after one batch and continued counts the cut tokens of the lines the stopped run
    embedded too: each of 40 lines holds MULTI (all in one width bucket, so the stopped run's batch holds
    some of them); the continued run embeds only the others. Fails with the stopped run's lines uncounted."""
    source = tmp_path / "in.txt"
    source.write_text(f"the {MULTI} .\n" * 40, encoding="utf-8")
    options, append = ef.Options(layers="top", batch_tokens=64), vector_spool.Spool.append

    def stop_after_one(spool, pieces, arrays):
        append(spool, pieces, arrays)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(vector_spool.Spool, "append", stop_after_one)
        with pytest.raises(KeyboardInterrupt):
            ef.embed_file(tiny_params, str(source), str(tmp_path / "out.hdf5"), options)
    (staging,) = staging_dirs(tmp_path)
    as_left_by_a_dead_process(staging)
    counts = ef.embed_file(tiny_params, str(source), str(tmp_path / "out.hdf5"), options)
    assert 0 < counts["resumed_lines"] < 40
    assert counts["truncated_tokens"] == 40


def test_the_service_cuts_counts_and_tells_the_client(tiny_params, reference):
    """The request is answered (it was refused 400), with `X-Truncated-Tokens: 2` and the vectors of the
    tokens cut by hand; /metrics counts them; an answer with none cut has no such header."""
    assert tiny_params.config.max_characters_per_token == 50  # C of Limits() by default
    embedder = SentenceEmbedder(tiny_params, layers="all", batch_tokens=256)
    batcher = DynamicBatcher(embedder, max_wait_s=0.001)
    app = make_app(batcher, limits=Limits(), n_layers=3, auth_token=None)
    with running(app) as port:
        assert batcher.ready.wait(60)  # no warm-up: at once
        status, headers, data = request(
            port, "POST", "/v1/embed", {"sentences": [SENTENCE]}, {"Accept": "application/x-npz"}
        )
        assert status == 200, data[:300]
        assert headers.get("x-truncated-tokens") == "2"
        status, plain, _ = request(port, "POST", "/v1/embed", {"texts": ["the bank"]})
        assert status == 200 and "x-truncated-tokens" not in plain
        status, _, metrics = request(port, "GET", "/metrics")
    assert "elmo_truncated_tokens_total 2.0" in metrics.decode()
    vectors = np.load(io.BytesIO(data))["0"]
    assert_reference(vectors, reference, tiny_params.config, "the service")
