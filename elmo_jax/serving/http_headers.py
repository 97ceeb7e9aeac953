"""The embedding service's rules for a request's headers, apart from any server: the answer's media type
from `Accept` (its q-values), the `Content-Type` a body must have, the `Host` a service on loopback
answers, and how much of what a client sent a refusal may quote (docs/SERVING.md, "Refusals").

    answer_type("application/json;q=0, application/x-npy")    # "application/x-npy"
    check_content_type("text/plain")                            # RequestError 415
    misdirected("evil.example:8080", {"127.0.0.1:8080", ...})  # RequestError 421 (DNS rebinding)

Why the last two: a web page may send a form, text or an untyped body to any address without asking
first (a CORS "simple request"), and with DNS rebinding (its own name made to resolve to 127.0.0.1) read
the answers. A JSON Content-Type makes the browser ask first, which this service never allows; a Host
that is not a loopback name shows the request came through such a name.
"""

from __future__ import annotations

from collections.abc import Collection

from elmo_jax.serving.embed_requests import JSON, MEDIA_TYPES, RequestError

QUOTED_CHARS = 200
# A request line and its headers at most. The server's parser (h11) refuses a head that grows past it
# before it is complete; one that arrives whole in a single read (up to 64 KiB) is refused here.
MAX_HEAD_BYTES = 16 * 1024


def quoted(text: str, limit: int = QUOTED_CHARS) -> str:
    """`text` as a refusal may repeat it: at most `limit` characters, the rest said by its length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def answer_type(accept: str | None) -> str:
    """The answer's media type for an Accept header: of the service's types (`MEDIA_TYPES`: JSON, .npy,
    .npz), the one with the highest q-value, where each type takes the q of the most specific range that
    names it (`application/x-npy` over `application/*` over `*/*`, RFC 9110 12.5.1) and q=0 means "not
    this one"; on a tie the type a more specific range names, then JSON, .npy, .npz. JSON when there is
    no header. RequestError 406 when no type is acceptable."""
    if accept is None or not accept.strip():
        return JSON
    ranges = [_media_range(part) for part in accept.split(",") if part.strip()]
    candidates = []
    for order, offered in enumerate(MEDIA_TYPES):
        matches = [(_specificity(name, offered), q) for name, q in ranges if _specificity(name, offered) is not None]
        if matches:
            specificity, q = max(matches)
            if q > 0:
                candidates.append((q, specificity, -order, offered))
    if not candidates:
        raise RequestError(406, "Accept", f"{quoted(accept)!r}: this service answers {', '.join(MEDIA_TYPES)}")
    return max(candidates)[-1]


def _media_range(part: str) -> tuple[str, float]:
    """(media range, q) of one element of an Accept header; a q that is not a number from 0 to 1 makes
    the range not acceptable."""
    name, *parameters = part.split(";")
    q = 1.0
    for parameter in parameters:
        key, _, value = parameter.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                q = 0.0
            q = q if 0 <= q <= 1 else 0.0  # NaN too
    return name.strip().lower(), q


def _specificity(media_range: str, offered: str) -> int | None:
    """How specifically `media_range` names `offered` (2 by its name, 1 `application/*`, 0 `*/*`), None
    when it does not."""
    if media_range == offered:
        return 2
    if media_range == offered.split("/")[0] + "/*":
        return 1
    return 0 if media_range == "*/*" else None


def check_content_type(content_type: str | None) -> None:
    """A body is read only when it says it is JSON (`application/json`, parameters such as charset
    allowed): RequestError 415 otherwise, no Content-Type included."""
    if (content_type or "").split(";")[0].strip().lower() == JSON:
        return
    given = f"Content-Type {quoted(content_type)!r}" if content_type else "no Content-Type"
    raise RequestError(415, "Content-Type", f"{given}: the body must be JSON, sent with Content-Type: {JSON}")


def head_too_large(scope: dict) -> RequestError | None:
    """A 431 for an ASGI request whose request line and headers hold over `MAX_HEAD_BYTES`, else None."""
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    size += sum(len(name) + len(value) + 4 for name, value in scope["headers"])  # ": " and CRLF
    if size <= MAX_HEAD_BYTES:
        return None
    return RequestError(431, "", f"the request head is over {MAX_HEAD_BYTES} bytes")


def misdirected(host: str | None, allowed: Collection[str] | None) -> RequestError | None:
    """A 421 for a request whose Host is not one of `allowed` (lower case; a service on loopback: its
    loopback names with its port, `service.host_names`), returned; None when the request may be
    answered: a Host allowed, any Host when `allowed` is None (a service beyond loopback: its token
    guards it), or no Host (HTTP/1.0: no browser sends that)."""
    if host is None or allowed is None or host.strip().lower() in allowed:
        return None
    return RequestError(
        421,
        "Host",
        f"{quoted(host)!r}: this service listens on loopback and answers only requests to "
        f"{' or '.join(sorted(allowed))} (another name that resolves to it is how a web page would reach it)",
    )
