"""Bounded connections: uvicorn's h11 protocol with a request-head timeout and a connection cap.

uvicorn (0.54, h11) has a keep-alive timeout that starts only after a response, and h11 has no
header timeout at all: a client that opens a connection and sends half a request line is held
forever (20,000 of them held 19,991 file descriptors in the audit). Here:

- **Head timeout** (`SM_SEMIF_HEADER_TIMEOUT`, 10 s): from the moment a connection opens, or its
  last response ends, the next request's line and headers must be complete within this time; if
  not, the connection gets a JSON 408 and is closed. Once the head is in, the body has its own
  timeout (`SM_SEMIF_BODY_TIMEOUT`) and the work its deadline. An idle kept-alive connection is
  closed earlier by uvicorn's keep-alive timeout (`SM_SEMIF_KEEP_ALIVE_TIMEOUT`, 5 s).
- **Connection cap** (`SM_SEMIF_MAX_CONNECTIONS`, 256): a connection that arrives when the cap is
  reached makes room by closing the connection that has waited longest for its request head,
  with a JSON 503 and `Retry-After` - so idle or half-sent connections can never crowd out a new
  client, and `/ping` stays reachable. When every open connection has a request in progress (none
  to close), the new connection is served only for `GET /ping`; anything else gets the JSON 503.
"""
from __future__ import annotations

import asyncio
import http
import json
import logging
import time
from typing import Any

import h11
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("semif.adapter")


def raw_answer(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 response with the adapter's JSON error body, closing the connection."""
    body = json.dumps({"detail": {"error_type": error_type, "message": message}}).encode()
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "content-type: application/json",
             f"content-length: {len(body)}", "connection: close", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ConnectionGuard:
    """Shared by every connection of one server: the cap, the head timeout, and the connections
    waiting for a request head in the order they started waiting (the first is the next to close)."""

    def __init__(self, header_timeout: float, max_connections: int):
        self.header_timeout, self.max_connections = header_timeout, max_connections
        self.waiting: dict[GuardedH11, None] = {}  # insertion-ordered
        self.evicted = 0
        self._warned = 0.0

    def cap_message(self) -> str:
        return (f"{self.max_connections} connections are open (SM_SEMIF_MAX_CONNECTIONS): this one waited longest "
                "for its request, so it was closed to make room - retry after the Retry-After seconds")

    def make_room(self, newcomer: "GuardedH11") -> bool:
        """Close the longest-waiting idle connection; False when there is none to close."""
        victim = next((c for c in self.waiting if c is not newcomer), None)
        if victim is None:
            return False
        victim.refuse(503, "too_many_connections", self.cap_message(), {"retry-after": "1"})
        self.evicted += 1
        now = time.monotonic()
        if now - self._warned > 10:  # a flood of connections must not become a flood of log lines
            self._warned = now
            log.warning("connection cap (%d) reached: closing the connections that wait longest for a request "
                        "(%d so far)", self.max_connections, self.evicted)
        return True


async def _busy(scope: Any, receive: Any, send: Any) -> None:
    """The answer on a connection over the cap when nothing could be closed for it."""
    body = json.dumps({"detail": {"error_type": "too_many_connections", "message": (
        "every connection the adapter accepts (SM_SEMIF_MAX_CONNECTIONS) has a request in progress: "
        "retry after the Retry-After seconds")}}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class GuardedH11(H11Protocol):
    """One connection: uvicorn's h11 protocol plus the head timeout and the cap (see the module)."""

    guard: ConnectionGuard  # set on the class guarded_protocol() makes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._await_head()
        if len(self.connections) > self.guard.max_connections and not self.guard.make_room(self):
            inner: ASGIApp = self.app  # uvicorn's protocol holds the app untyped

            async def over_cap(scope: Any, receive: Any, send: Any) -> None:
                if scope.get("type") == "http" and scope.get("path") == "/ping":
                    return await inner(scope, receive, send)
                return await _busy(scope, receive, send)

            self.app = over_cap

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
            self._head_arrived()  # the body and the work have their own timeouts

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_head()  # the next request on this kept-alive connection

    def _await_head(self) -> None:
        self._head_arrived()
        self._head_timer = self.loop.call_later(self.guard.header_timeout, self._head_timeout)
        self.guard.waiting[self] = None

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.guard.waiting.pop(self, None)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE:
            self.refuse(408, "header_timeout", f"the request line and headers did not arrive within "
                        f"{self.guard.header_timeout:g} s (SM_SEMIF_HEADER_TIMEOUT): send the whole request head at once")

    def refuse(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> None:
        """Answer with a JSON error and close, outside any request cycle (none has started)."""
        self._head_arrived()
        if not self.transport.is_closing():
            self.transport.write(raw_answer(status, error_type, message, headers))
            self.transport.close()


def guarded_protocol(*, header_timeout: float, max_connections: int) -> type[GuardedH11]:
    """The protocol class for uvicorn.Config(http=...): one guard per server."""
    guard = ConnectionGuard(header_timeout, max_connections)
    return type("GuardedH11Server", (GuardedH11,), {"guard": guard})
