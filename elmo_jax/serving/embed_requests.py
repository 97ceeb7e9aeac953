"""The embedding service's requests and answers, apart from any HTTP server: a JSON body checked against
the service's limits (every refusal names the field), the output each request asks for computed from
the biLM's layers, and the answer encoded as JSON, .npy or .npz (docs/SERVING.md is the reference).

    {"sentences": [["The", "bank", "."], ["Hello", "!"]],      # or "texts": ["The bank .", "Hello !"]
     "layers": "all",             # "all", "top", "average", "sentence_mean", a layer index 0..L,
                                  # or {"scalars": [s_0, .., s_L], "gamma": 1.0} (gamma * sum softmax(s)_j h_j)
     "float16": false}

The outputs are the library's output modes (`features/output_modes.py`, what `embed_sentences(...,
layers=...)` gives): the batches keep every layer, and each sentence's (L+1, n, 2P) layers become the
mode's vectors on the host (`OutputMode.from_layers`). Per sentence of n tokens (2P: the biLM's output
width; L+1 = 3 layers for ELMo): "all" (L+1, n, 2P); "top", "average", an index, a mix (n, 2P);
"sentence_mean" (2P,), the mean over the sentence's tokens of output_modes' default mix, which is the
layers' average (a request cannot give sentence_mean a mix; zeros for an empty sentence). JSON:
`{"embeddings": [nested lists per sentence], "shapes": [...], "layers": ..., "dtype": "float32"}`;
`Accept: application/x-npz`: one array per sentence, named by its index ("0", "1", ...);
`Accept: application/x-npy`: one array of all sentences, padded with zeros to the longest
((S, L+1, T, 2P), (S, T, 2P) or (S, 2P)), the lengths in the `X-Sentence-Lengths` header.

A token over the model's C-2 UTF-8 bytes (48) is cut to them, never refused, as in the library and
`embed_file` (docs/ELMO.md, "Long tokens"): `EmbedRequest.truncated_tokens` counts a request's, and
its answer says how many in the `X-Truncated-Tokens` header when there are any.

Whatever the body, parsing raises RequestError alone: nesting is bounded before `json.loads` recurses
(`MAX_NESTING`: the brackets are counted first, those in strings too, which is cheap; only a count over
the bound is made again without the strings, the slower scan; and a body whose strings' closing
brackets hide deeper nesting from the first count is refused by the parser's own recursion bound), an
integer longer than float64 can hold is never built (Python refuses to parse more than
`sys.get_int_max_str_digits()` digits, and NumPy cannot test a Python int beyond int64), and an answer
that would hold a non-finite value (a gamma that overflows float32, a float16 answer past 65504) is
refused naming its field: JSON (RFC 8259) has no literal for one.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from elmo_jax.features.output_modes import NAMES, OutputMode, output_mode
from elmo_jax.model.chars import DEFAULT_MAX_CHARS, count_truncated

JSON, NPY, NPZ = "application/json", "application/x-npy", "application/x-npz"
MEDIA_TYPES = (JSON, NPY, NPZ)
NAMED_LAYERS = tuple(name for name in NAMES if name != "mix")  # a request's mix is an object with its scalars
REQUEST_KEYS = ("sentences", "texts", "layers", "float16")
# Arrays and objects nested in a body at most: a request needs 3 ({"sentences": [["a"]]}); json.loads
# recurses once per level, and past the interpreter's recursion limit it raises RecursionError.
MAX_NESTING = 16
# Digits of a JSON integer that may stand for a float64 (whose largest is 1.8e308, 309 digits); longer
# ones are kept as `_LongInteger`, so their digits are never parsed.
MAX_INTEGER_DIGITS = 309
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes included
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_SCAN_BYTES = 1 << 20
_NESTING_STEP = np.zeros(256, np.int8)
_NESTING_STEP[list(b"[{")], _NESTING_STEP[list(b"]}")] = 1, -1


class RequestError(Exception):
    """A request the service refuses: the HTTP status, the field at fault ("" for the whole body) and why."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field, self.message = status, field, message

    def body(self) -> dict:
        return {"error": {"field": self.field, "message": self.message}}


@dataclasses.dataclass(frozen=True)
class _LongInteger:
    """A JSON integer of more than MAX_INTEGER_DIGITS digits, held by its length alone: no float64 can
    hold it, so no field can take it."""

    digits: int

    def __repr__(self) -> str:
        return f"a {self.digits}-digit integer"


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold: sentences, tokens (all sentences together, and one sentence), bytes of
    the body (which bounds a token's length too); and the model's `max_characters_per_token` C, which
    says which tokens are cut (over C-2 UTF-8 bytes) and counted, never refused, or the model's
    `vocabulary` (`model.vocabulary.TokenVocabulary`), which says it for any model."""

    max_sentences: int = 256
    max_tokens: int = 16384
    max_sentence_tokens: int = 512
    max_body_bytes: int = 8 << 20
    max_characters_per_token: int = DEFAULT_MAX_CHARS
    vocabulary: Any = None

    def count_truncated(self, sentences) -> int:
        """The tokens of `sentences` the model cuts."""
        if self.vocabulary is not None:
            return self.vocabulary.count_truncated(sentences)
        return count_truncated(sentences, self.max_characters_per_token)


@dataclasses.dataclass(frozen=True)
class Output:
    """What a request asks for (see the module doc): `layers` a name of `NAMED_LAYERS`, a layer index, or
    "mix" with its `scalars` and `gamma`; the output mode (`output_modes`) is made from it once the
    layers' sizes are known."""

    layers: str | int = "all"
    scalars: tuple[float, ...] | None = None
    gamma: float = 1.0
    float16: bool = False

    def mode(self, n_layers: int, dim: int) -> OutputMode:
        """The output mode for a biLM of `n_layers` (L+1) layers of width `dim` (2P)."""
        return output_mode(self.layers, n_layers, dim, self.scalars, self.gamma, self.float16)

    def vectors(self, layers: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each sentence's answer from its float32 (L+1, n, 2P) layers (the batcher's), through the mode.
        Raises RequestError when an answer holds a value that is not finite: 422 naming `float16` (past
        65504) or `layers.gamma` (past float32's 3.4e38), 500 when the model's layers themselves are not."""
        n_layers, _, dim = layers[0].shape
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, by its field
            mode = self.mode(n_layers, dim)
            answers = [mode.from_layers(sentence) for sentence in layers]
        for i, (sentence, answer) in enumerate(zip(layers, answers)):
            if not np.isfinite(answer).all():
                raise self._not_finite(i, sentence)
        return answers

    def _not_finite(self, i: int, layers: np.ndarray) -> RequestError:
        """Why sentence i's answer, from its (L+1, n, 2P) `layers`, holds a value that is not finite."""
        if not np.isfinite(layers).all():
            return RequestError(500, "", f"the model's layers for sentence {i} are not finite (NaN or infinity)")
        with np.errstate(over="ignore", invalid="ignore"):
            wide = dataclasses.replace(self, float16=False).mode(*layers.shape[::2]).from_layers(layers)
        if np.isfinite(wide).all():
            return RequestError(
                422,
                "float16",
                f"sentence {i}'s vectors reach {np.abs(wide).max():.6g}, past float16's largest value, "
                f"{FLOAT16_MAX:g}: ask for float32 (float16 false)",
            )
        if self.layers == "mix":
            return RequestError(
                422, "layers.gamma", f"gamma {self.gamma:g} takes sentence {i}'s vectors past float32's range (3.4e38)"
            )
        return RequestError(500, "", f"the vectors of sentence {i} are not finite")

    def describe(self):
        """The "layers" value as the answer repeats it."""
        if self.layers == "mix":
            return {"scalars": list(self.scalars), "gamma": self.gamma}
        return self.layers


@dataclasses.dataclass(frozen=True)
class EmbedRequest:
    sentences: list[list[str]]
    output: Output
    media_type: str
    truncated_tokens: int = 0  # tokens cut to the model's C-2 UTF-8 bytes (`chars.count_truncated`)

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sentences)


def parse_request(body: bytes, answer_type: str | None, limits: Limits, n_layers: int) -> EmbedRequest:
    """Checks a request body (see the module doc) against `limits`; raises RequestError naming the field:
    400 for what is malformed, 413 for what is over a limit. `answer_type` is the answer's media type,
    already chosen from the Accept header (`http_headers.answer_type`); None: JSON."""
    answer_type = answer_type or JSON
    if answer_type not in MEDIA_TYPES:
        raise ValueError(f"answer_type: expected one of {', '.join(MEDIA_TYPES)}, found {answer_type!r}")
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, "", f"the body has {len(body)} bytes; at most {limits.max_body_bytes}")
    data = _json(body)
    if not isinstance(data, dict):
        raise RequestError(400, "", f"the body must be a JSON object, found {_json_type(data)}")
    unknown = sorted(set(data) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(400, unknown[0], f"unknown field; the fields are {', '.join(REQUEST_KEYS)}")
    sentences = _sentences(data, limits)
    float16 = data.get("float16", False)
    if not isinstance(float16, bool):
        raise RequestError(400, "float16", f"expected true or false, found {_json_type(float16)}")
    output = _output(data.get("layers", "all"), n_layers, float16)
    return EmbedRequest(sentences, output, answer_type, limits.count_truncated(sentences))


def _json(body: bytes):
    """The body's JSON value, its nesting checked first (400 beyond MAX_NESTING), integers longer than
    MAX_INTEGER_DIGITS held as `_LongInteger`."""
    if _depth(body.translate(None, _NOT_BRACKETS)) > MAX_NESTING:  # counted with the strings' brackets: cheap
        depth = _depth(_STRING.sub(b"", body).translate(None, _NOT_BRACKETS))  # without them: what nests
        if depth > MAX_NESTING:
            raise RequestError(400, "", f"arrays and objects nested {depth} deep; at most {MAX_NESTING}")
    try:
        return json.loads(body, parse_int=_integer)
    except RecursionError:  # deeper than the count found: strings' closing brackets hid opening ones
        raise RequestError(400, "", f"arrays and objects nested too deep to parse; at most {MAX_NESTING}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, "", f"the body is not JSON ({e})"[:300]) from None


def _depth(brackets: bytes) -> int:
    """How deep the arrays and objects of a sequence of `[]{}` nest: a scan that does not recurse, a MiB
    at a time (a body of brackets alone costs 5 MiB of arrays, not 8 bytes per bracket)."""
    depth = deepest = 0
    for start in range(0, len(brackets), _SCAN_BYTES):
        chunk = np.frombuffer(brackets, np.uint8, min(_SCAN_BYTES, len(brackets) - start), start)
        levels = np.cumsum(_NESTING_STEP[chunk], dtype=np.int32) + depth
        deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def _integer(text: str):
    """json.loads' integers: an int, or a `_LongInteger` past MAX_INTEGER_DIGITS (never parsed)."""
    digits = len(text) - text.startswith("-")
    return int(text) if digits <= MAX_INTEGER_DIGITS else _LongInteger(digits)


def _sentences(data: dict, limits: Limits) -> list[list[str]]:
    if ("sentences" in data) == ("texts" in data):
        raise RequestError(400, "sentences", 'give either "sentences" (lists of tokens) or "texts" (strings)')
    field = "sentences" if "sentences" in data else "texts"
    value = data[field]
    if not isinstance(value, list):
        raise RequestError(400, field, f"expected a list, found {_json_type(value)}")
    if not value:
        raise RequestError(400, field, "no sentences: the list is empty")
    if len(value) > limits.max_sentences:
        raise RequestError(413, field, f"{len(value)} sentences; at most {limits.max_sentences} per request")
    sentences = [_sentence(item, f"{field}[{i}]", field == "texts") for i, item in enumerate(value)]
    total = 0
    for i, sentence in enumerate(sentences):
        if len(sentence) > limits.max_sentence_tokens:
            raise RequestError(
                413, f"{field}[{i}]", f"{len(sentence)} tokens; at most {limits.max_sentence_tokens} per sentence"
            )
        total += len(sentence)
    if total > limits.max_tokens:
        raise RequestError(413, field, f"{total} tokens; at most {limits.max_tokens} per request")
    return sentences


def _sentence(item, field: str, text: bool) -> list[str]:
    if text:
        if not isinstance(item, str):
            raise RequestError(400, field, f"expected a string, found {_json_type(item)}")
        return item.split()
    if not isinstance(item, list):
        hint = ' (a string: use "texts" or split it into tokens)' if isinstance(item, str) else ""
        raise RequestError(400, field, f"expected a list of token strings, found {_json_type(item)}{hint}")
    for j, token in enumerate(item):
        if not isinstance(token, str):
            raise RequestError(400, f"{field}[{j}]", f"expected a string token, found {_json_type(token)}")
    return item


def _output(layers, n_layers: int, float16: bool) -> Output:
    if isinstance(layers, bool):  # a JSON true is not a layer index
        raise RequestError(400, "layers", f"expected one of {NAMED_LAYERS}, an index or a mix, found a boolean")
    if isinstance(layers, int):
        if not 0 <= layers < n_layers:
            raise RequestError(400, "layers", f"layer {layers}: the model has layers 0 to {n_layers - 1}")
        return Output(layers, float16=float16)
    if isinstance(layers, str):
        if layers not in NAMED_LAYERS:
            raise RequestError(400, "layers", f"{layers!r}: expected one of {NAMED_LAYERS}, an index or a mix")
        return Output(layers, float16=float16)
    if isinstance(layers, dict):
        return _mix(layers, n_layers, float16)
    if isinstance(layers, _LongInteger):
        raise RequestError(400, "layers", f"{layers!r}: the model has layers 0 to {n_layers - 1}")
    raise RequestError(400, "layers", f"expected one of {NAMED_LAYERS}, an index or a mix, found {_json_type(layers)}")


def _mix(layers: dict, n_layers: int, float16: bool) -> Output:
    unknown = sorted(set(layers) - {"scalars", "gamma"})
    if unknown:
        raise RequestError(400, f"layers.{unknown[0]}", "unknown field; a mix has scalars and gamma")
    scalars, gamma = layers.get("scalars"), layers.get("gamma", 1.0)
    if not isinstance(scalars, list) or len(scalars) != n_layers:
        raise RequestError(400, "layers.scalars", f"expected {n_layers} finite numbers, found {scalars!r}"[:200])
    scalars = tuple(_finite_number(s, f"layers.scalars[{i}]") for i, s in enumerate(scalars))
    return Output("mix", scalars, _finite_number(gamma, "layers.gamma"), float16)


def _finite_number(value, field: str) -> float:
    """A mix's number as a float: 400 for what is not a number, 422 for a number no float64 holds (NaN,
    an infinity, a `_LongInteger`, an integer past 1.8e308), each naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, _LongInteger)):
        raise RequestError(400, field, f"expected a finite number, found {_json_type(value)}")
    largest = sys.float_info.max
    if isinstance(value, _LongInteger) or not -largest <= value <= largest:  # NaN compares false
        raise RequestError(422, field, f"{value!r} is not a finite number float64 can hold (|x| <= {largest:.4g})")
    return float(value)


def _json_type(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def encode(vectors: Sequence[np.ndarray], request: EmbedRequest) -> tuple[bytes, dict[str, str]]:
    """The answer's bytes and headers (Content-Type included; `X-Truncated-Tokens` when a token was cut)
    for each sentence's `vectors` (already the requested output, `Output.vectors`)."""
    data, headers = _encoded(vectors, request)
    if request.truncated_tokens:
        headers["X-Truncated-Tokens"] = str(request.truncated_tokens)
    return data, headers


def _encoded(vectors: Sequence[np.ndarray], request: EmbedRequest) -> tuple[bytes, dict[str, str]]:
    """`encode` less the truncation header."""
    if request.media_type == NPZ:
        buffer = io.BytesIO()
        np.savez(buffer, **{str(i): v for i, v in enumerate(vectors)})
        return buffer.getvalue(), {"Content-Type": NPZ}
    if request.media_type == NPY:
        lengths = [len(s) for s in request.sentences]
        buffer = io.BytesIO()
        np.save(buffer, _padded(vectors))
        return buffer.getvalue(), {"Content-Type": NPY, "X-Sentence-Lengths": ",".join(map(str, lengths))}
    answer = {
        "embeddings": [v.tolist() for v in vectors],
        "shapes": [list(v.shape) for v in vectors],
        "layers": request.output.describe(),
        "dtype": "float16" if request.output.float16 else "float32",
    }
    return json.dumps(answer, separators=(",", ":")).encode("utf-8"), {"Content-Type": JSON}


def _padded(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """All sentences in one array, zeros past each one's end (see the module doc): the sentences' answers
    differ in their token axis alone, so each is placed in the corner of the largest shape."""
    shape = np.max([v.shape for v in vectors], axis=0)
    out = np.zeros((len(vectors), *shape), vectors[0].dtype)
    for i, v in enumerate(vectors):
        out[(i, *(slice(0, size) for size in v.shape))] = v
    return out
