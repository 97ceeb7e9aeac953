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
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Sequence

import numpy as np

from elmo_jax.features.output_modes import NAMES, OutputMode, output_mode

JSON, NPY, NPZ = "application/json", "application/x-npy", "application/x-npz"
MEDIA_TYPES = (JSON, NPY, NPZ)
NAMED_LAYERS = tuple(name for name in NAMES if name != "mix")  # a request's mix is an object with its scalars
REQUEST_KEYS = ("sentences", "texts", "layers", "float16")


class RequestError(Exception):
    """A request the service refuses: the HTTP status, the field at fault ("" for the whole body) and why."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field, self.message = status, field, message

    def body(self) -> dict:
        return {"error": {"field": self.field, "message": self.message}}


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold: sentences, tokens (all sentences together, and one sentence), UTF-8
    bytes of one token (the model's `max_characters_per_token` - 2), bytes of the body."""

    max_sentences: int = 256
    max_tokens: int = 16384
    max_sentence_tokens: int = 512
    max_token_bytes: int = 48
    max_body_bytes: int = 8 << 20


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
        """Each sentence's answer from its float32 (L+1, n, 2P) layers (the batcher's), through the mode."""
        n_layers, _, dim = layers[0].shape
        mode = self.mode(n_layers, dim)
        return [mode.from_layers(sentence) for sentence in layers]

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

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sentences)


def media_type(accept: str | None) -> str:
    """The answer's media type from an Accept header (JSON when absent or */*); 406 when none is offered."""
    if not accept:
        return JSON
    for part in accept.split(","):
        name = part.split(";")[0].strip().lower()
        if name in MEDIA_TYPES:
            return name
        if name in ("*/*", "application/*"):
            return JSON
    raise RequestError(406, "Accept", f"{accept!r}: this service answers {', '.join(MEDIA_TYPES)}")


def parse_request(body: bytes, accept: str | None, limits: Limits, n_layers: int) -> EmbedRequest:
    """Checks a request body (see the module doc) against `limits`; raises RequestError naming the field:
    400 for what is malformed, 413 for what is over a limit, 406 for an Accept header it cannot answer."""
    answer_type = media_type(accept)
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, "", f"the body has {len(body)} bytes; at most {limits.max_body_bytes}")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, "", f"the body is not JSON ({e})") from None
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
    return EmbedRequest(sentences, output, answer_type)


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
        for j, token in enumerate(sentence):
            size = len(token.encode("utf-8", "surrogatepass"))
            if size > limits.max_token_bytes:
                raise RequestError(
                    400,
                    f"{field}[{i}][{j}]",
                    f"a token of {size} UTF-8 bytes; the model reads at most {limits.max_token_bytes}",
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
    raise RequestError(400, "layers", f"expected one of {NAMED_LAYERS}, an index or a mix, found {_json_type(layers)}")


def _mix(layers: dict, n_layers: int, float16: bool) -> Output:
    unknown = sorted(set(layers) - {"scalars", "gamma"})
    if unknown:
        raise RequestError(400, f"layers.{unknown[0]}", "unknown field; a mix has scalars and gamma")
    scalars, gamma = layers.get("scalars"), layers.get("gamma", 1.0)
    if not isinstance(scalars, list) or len(scalars) != n_layers or not all(_finite_number(s) for s in scalars):
        raise RequestError(400, "layers.scalars", f"expected {n_layers} finite numbers, found {scalars!r}"[:200])
    if not _finite_number(gamma):
        raise RequestError(400, "layers.gamma", f"expected a finite number, found {gamma!r}"[:200])
    return Output("mix", tuple(float(s) for s in scalars), float(gamma), float16)


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value))


def _json_type(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def encode(vectors: Sequence[np.ndarray], request: EmbedRequest) -> tuple[bytes, dict[str, str]]:
    """The answer's bytes and headers (Content-Type included) for each sentence's `vectors` (already the
    requested output, `Output.vectors`)."""
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
