"""The service's requests and batches under what a careless or hostile client sends (issue #50): bodies
nested deeper than JSON parsing can recurse, numbers larger than float64 or than Python parses, mixes and
float16 answers that would hold non-finite values, a batcher that meets an error of its own, a batching
window that cannot be waited for, and SIGTERM during the warm-up. Each answer is a JSON refusal naming
its field (or a 500/503 saying why), never a plain-text 500, a hang or a non-JSON literal.

In-process where the behaviour allows (`parse_request`, the batcher, the app on uvicorn in a thread with
a stand-in embedder: nothing compiled); one real process for SIGTERM, which only a process's main thread
receives.
"""

from __future__ import annotations

import json

import pytest

from elmo_jax.serving import DynamicBatcher, Limits, make_app
from elmo_jax.serving.embed_requests import RequestError, parse_request
from tests.support.service_client import ConstantEmbedder, request, running

LIMITS = Limits(max_sentences=6, max_tokens=60, max_sentence_tokens=24, max_token_bytes=48, max_body_bytes=1 << 20)


def refusal(body: bytes) -> RequestError:
    """The RequestError `parse_request` raises for `body` (a model of 3 layers)."""
    with pytest.raises(RequestError) as caught:
        parse_request(body, None, LIMITS, 3)
    return caught.value


def strict_json(data: bytes):
    """`json.loads` that refuses what RFC 8259 does not allow: NaN, Infinity and -Infinity."""

    def refuse(name):
        raise AssertionError(f"{name} in the answer: not JSON")

    return json.loads(data, parse_constant=refuse)


def test_nesting_is_bounded_before_json_parsing_recurses():
    """100,000 nested arrays (json.loads recursed into a RecursionError before: a plain-text 500) and an
    object nested 17 deep are refused with 400 naming the bound; brackets inside strings (escaped quotes
    among them) are not nesting."""
    for body, depth in [(b"[" * 100_000 + b"]" * 100_000, 100_000), (b'{"a":' * 17 + b"1" + b"}" * 17, 17)]:
        error = refusal(body)
        assert (error.status, error.field) == (400, ""), error
        assert f"nested {depth} deep; at most 16" in error.message, error.message
    text = " ".join(["[" * 40] * 20 + ['\\"', "{" * 40])  # 840 brackets, an escaped quote among them
    parsed = parse_request(json.dumps({"texts": [text]}).encode(), None, LIMITS, 3)
    assert parsed.sentences == [text.split()]


def test_numbers_beyond_float64_are_refused_naming_their_field():
    """A 400-digit integer as a mix scalar or gamma (a TypeError in the finite check before: a plain-text
    500), a 5000-digit one (more than Python parses, sys.get_int_max_str_digits(): refused before as "not
    JSON", naming no field), 1e400 and NaN: 422 naming the field. Where a number is not what the field
    takes, a huge one is refused like any other number (400)."""
    huge, larger = "9" * 400, "7" * 5000
    mix = '{"sentences": [["a"]], "layers": {"scalars": [0, %s, 0], "gamma": %s}}'
    cases = [  # body, status, field, words of the message
        (mix % (huge, "1"), 422, "layers.scalars[1]", "a 400-digit integer"),
        (mix % ("0", huge), 422, "layers.gamma", "a 400-digit integer"),
        (mix % ("0", "-" + larger), 422, "layers.gamma", "a 5000-digit integer"),
        (mix % ("0", "1e400"), 422, "layers.gamma", "inf"),
        (mix % ("NaN", "1"), 422, "layers.scalars[1]", "nan"),
        ('{"sentences": [["a"]], "layers": ' + huge + "}", 400, "layers", "a 400-digit integer"),
        ('{"sentences": [["a"]], "float16": ' + larger + "}", 400, "float16", "found a number"),
        ('{"sentences": [["a", ' + larger + "]]}", 400, "sentences[0][1]", "found a number"),
    ]
    for body, status, field, words in cases:
        error = refusal(body.encode())
        assert (error.status, error.field) == (status, field) and words in error.message, (body[:80], error)
    # Within float64's range a number is taken, however it is written.
    big = parse_request((mix % ("1" + "0" * 300, "1.5e300")).encode(), None, LIMITS, 3).output
    assert big.scalars[1] == 1e300 and big.gamma == 1.5e300


def test_answers_are_finite_json_or_a_refusal_naming_the_field():
    """Through the app: a mix whose gamma overflows float32 (1e308) and a float16 answer past 65504 were
    answered 200 with `Infinity` literals before (not JSON); now 422 naming layers.gamma and float16. A
    model whose layers are NaN: a 500 saying so, as JSON. Every answer is RFC 8259 JSON, counted in
    /metrics."""

    def app_of(value):
        batcher = DynamicBatcher(ConstantEmbedder(value), max_wait_s=0)
        return make_app(batcher, limits=LIMITS, n_layers=3)

    with running(app_of(70000.0)) as port:
        cases = [  # request, status, field, words of the message
            ({"layers": {"scalars": [0, 0, 0], "gamma": 1e30}}, 200, None, None),
            ({"layers": {"scalars": [0, 0, 0], "gamma": 1e308}}, 422, "layers.gamma", "gamma 1e+308"),
            ({"layers": "top", "float16": True}, 422, "float16", "65504"),
            ({"layers": "sentence_mean", "float16": True}, 422, "float16", "65504"),
            ({"layers": "top"}, 200, None, None),
        ]
        for extra, status, field, words in cases:
            got, headers, data = request(port, "POST", "/v1/embed", {"sentences": [["a", "b"]], **extra})
            answer = strict_json(data)
            assert got == status and headers["content-type"] == "application/json", (extra, data[:200])
            if field is not None:
                assert answer["error"]["field"] == field and words in answer["error"]["message"], (extra, answer)
        metrics = request(port, "GET", "/metrics")[2].decode()
        assert 'elmo_requests_total{code="422"} 3.0' in metrics and 'elmo_requests_total{code="200"} 2.0' in metrics
    with running(app_of(float("nan"))) as port:
        got, _, data = request(port, "POST", "/v1/embed", {"sentences": [["a"]], "layers": "top"})
        assert got == 500 and "not finite" in strict_json(data)["error"]["message"], data
