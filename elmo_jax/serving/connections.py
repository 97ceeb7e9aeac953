"""The service's connections: uvicorn's h11 protocol with the bounds uvicorn does not have.

uvicorn (0.55) bounds a request head's size (h11's incomplete-event limit) and closes a connection left
idle after an answer (`timeout_keep_alive`), and nothing else: a client that connects and sends one
header line a second is kept for as long as it does so, each such connection holding a file descriptor.
Its `limit_concurrency` counts those connections but answers 503 only to a request whose head has
arrived, so it neither frees them nor keeps them out (issue #50: 22,000 connections trickling header
lines took all 20,000 descriptors of the process and /healthz failed). `GuardedH11Protocol` is uvicorn's
`H11Protocol` with three bounds, per connection:

- its request head must arrive within `header_timeout_s` of the connection's opening or of its previous
  answer, else a 408;
- a request body within `body_timeout_s` of its head: /v1/embed's handler answers 408 itself (its own
  deadline, counted with the requests); a body no handler reads (a request answered without it) is cut
  off here one second later; an answer the client leaves unread for as long (the socket's buffer full)
  is dropped;
- at most `max_connections` are open: one more takes the place of the connection that has waited
  longest for a request head (an idle keep-alive one, or a slow client), which gets a 503; when none is
  waiting (every connection is in a request), the new one gets the 503. So slow clients cannot hold more
  than the cap, and cannot keep a new client out for long: each newcomer pushes the oldest of them out.

A refusal here is JSON like the app's (`{"error": {"field": "", "message": ...}}`), written on the
socket directly with `Connection: close` (there is no request for the app to answer), and counted by
reason (`ConnectionGuard.refusals`; the app's /metrics shows them as `elmo_connections_refused_total`).
It uses uvicorn's H11Protocol hooks (`connection_made`, `handle_events`, `on_response_complete`,
`send_400_response`, `pause_writing`, its `cycle`) and h11's public states; pyproject names the uvicorn
versions tested.

    connections = ConnectionGuard(max_connections=1024, header_timeout_s=10, body_timeout_s=60)
    uvicorn.Config(app, http=connections.protocol, h11_max_incomplete_event_size=MAX_HEAD_BYTES)
"""

from __future__ import annotations

import collections
import functools
import http
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from elmo_jax.serving.embed_requests import RequestError
from elmo_jax.serving.http_headers import MAX_HEAD_BYTES

REASONS = ("header_timeout", "body_timeout", "answer_unread", "over_capacity", "head_too_large", "bad_request")
HANDLER_GRACE_S = 1.0  # what a handler reading a late body gets to answer its 408 before the server cuts it off
RETRY_AFTER_S = 1


class ConnectionGuard:
    """The bounds of every connection of one server (see the module doc) and the count of what they
    refused: give `protocol` to uvicorn (`uvicorn.Config(http=...)`).

    Attributes:
      refusals: connections refused or cut off, by reason (`REASONS`).
      on_refusal: called with the reason of each (the app's metrics), or None.
    """

    def __init__(self, max_connections: int, header_timeout_s: float, body_timeout_s: float):
        self.max_connections, self.header_timeout_s, self.body_timeout_s = (
            max_connections,
            header_timeout_s,
            body_timeout_s,
        )
        self.refusals: collections.Counter = collections.Counter({reason: 0 for reason in REASONS})
        self.on_refusal = None
        self._open: set[GuardedH11Protocol] = set()
        # Connections waiting for a request head, in the order they began to (a dict keeps its order).
        self._waiting: dict[GuardedH11Protocol, None] = {}

    @property
    def protocol(self):
        """The protocol factory for uvicorn's `Config(http=...)`."""
        return functools.partial(GuardedH11Protocol, guard=self)

    @property
    def open_connections(self) -> int:
        """Connections open and not being closed."""
        return len(self._open)

    def opened(self, connection: GuardedH11Protocol) -> None:
        """A new connection (already waiting for its head): over the cap, the one that has waited longest
        for a head gives way, the new one itself when it is the only one waiting."""
        self._open.add(connection)
        if len(self._open) > self.max_connections:
            oldest = next(iter(self._waiting), connection)
            oldest.refuse(
                503,
                "over_capacity",
                f"too many connections (--max_connections={self.max_connections}); retry",
                answer=True,
                headers=(f"retry-after: {RETRY_AFTER_S}",),
            )

    def waiting(self, connection: GuardedH11Protocol, waits: bool) -> None:
        self._waiting.pop(connection, None)
        if waits:
            self._waiting[connection] = None

    def closed(self, connection: GuardedH11Protocol) -> None:
        self._open.discard(connection)
        self._waiting.pop(connection, None)

    def count(self, reason: str) -> None:
        self.refusals[reason] += 1
        if self.on_refusal is not None:
            self.on_refusal(reason)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a `ConnectionGuard` (see the module doc). A connection is in one
    phase at a time, from h11's state of the client: waiting for a request head (IDLE), receiving a body
    (SEND_BODY), or neither (the app has the request, or the connection is closing); each phase with a
    deadline has one timer."""

    def __init__(self, *args, guard: ConnectionGuard, **kwargs):
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.head_limit = self.config.h11_max_incomplete_event_size or MAX_HEAD_BYTES  # None: h11's default
        self.phase: str | None = None
        self.deadline = None  # the phase's timer
        self.unread = None  # the timer of an answer the client does not take
        self.graced = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.follow_phase()
        self.guard.opened(self)

    def connection_lost(self, exc) -> None:
        self.enter(None)
        self.stop_unread_timer()
        self.guard.closed(self)
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self.follow_phase()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.follow_phase()

    def send_400_response(self, msg: str) -> None:
        """What h11 cannot parse: a head over the limit (431) or a malformed one (400), as JSON."""
        if len(self.conn.trailing_data[0]) > self.head_limit:
            self.refuse(431, "head_too_large", f"the request head is over {self.head_limit} bytes", answer=True)
        else:
            self.refuse(400, "bad_request", "not an HTTP/1.1 request h11 can parse", answer=True)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.unread is None:
            self.unread = self.loop.call_later(self.guard.body_timeout_s, self.answer_unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.stop_unread_timer()

    def stop_unread_timer(self) -> None:
        if self.unread is not None:
            self.unread.cancel()
            self.unread = None

    def follow_phase(self) -> None:
        """The phase from h11's state of the client, its timer started when it changes."""
        state = self.conn.their_state
        closing = self.transport is None or self.transport.is_closing()
        phase = None if closing else "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase != self.phase:
            self.enter(phase)

    def enter(self, phase: str | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.phase = phase
        self.guard.waiting(self, phase == "head")
        if phase == "head":
            self.deadline = self.loop.call_later(self.guard.header_timeout_s, self.head_late)
        elif phase == "body":
            self.graced = False
            self.deadline = self.loop.call_later(self.guard.body_timeout_s, self.body_late)

    def head_late(self) -> None:
        self.deadline = None
        timeout = self.guard.header_timeout_s
        self.refuse(408, "header_timeout", f"the request head did not arrive within {timeout:g} s", answer=True)

    def body_late(self) -> None:
        self.deadline = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not self.graced:
            # A handler reading this body answers 408 itself (counted with its route): it gets that chance.
            self.graced = True
            self.deadline = self.loop.call_later(HANDLER_GRACE_S, self.body_late)
            return
        timeout = self.guard.body_timeout_s
        answer = cycle is None or not cycle.response_started  # a request already answered gets no other answer
        self.refuse(408, "body_timeout", f"the request body did not arrive within {timeout:g} s", answer=answer)

    def answer_unread(self) -> None:
        self.unread = None
        self.refuse(0, "answer_unread", "", answer=False)

    def refuse(self, status: int, reason: str, message: str, *, answer: bool, headers=()) -> None:
        """Closes the connection, counted by `reason`; with `answer`, a JSON `status` saying `message` first."""
        if self.transport.is_closing():
            return
        self.guard.count(reason)
        self.enter(None)
        self.guard.closed(self)
        if answer:
            self.transport.write(refusal_bytes(status, message, headers))
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # what the client does not read must not hold the descriptor
        else:
            self.transport.close()


def refusal_bytes(status: int, message: str, headers=()) -> bytes:
    """A whole HTTP/1.1 response: the JSON refusal (`RequestError.body`), then the connection closes."""
    body = json.dumps(RequestError(status, "", message).body()).encode()
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
