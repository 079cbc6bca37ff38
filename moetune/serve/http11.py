"""uvicorn's h11 protocol with the request head guarded: a size limit however the head arrives, a
time limit, and a cap on the slow heads one address may hold.

- **Size.** A request line + headers over `HeadLimits.max_bytes` (16 KiB) gets 431. h11 checks only
  a head still incomplete in its buffer (`max_incomplete_event_size`), so a 100 KB head arriving
  in one read was parsed and served; here the bytes a complete head took are counted too (h11's
  `trailing_data` is what is left after it), so the limit holds however the head is split.
- **Time.** A head not completed within `HeadLimits.timeout_s` of the connection opening (or, on a
  kept-alive connection, of its first byte) gets 408 and the connection closes: a slow-header
  client no longer holds a socket for ever. (An idle kept-alive connection is uvicorn's
  `timeout_keep_alive`, as before.)
- **Many slow heads.** One address may hold at most `HeadLimits.per_client` heads that are still
  incomplete GRACE_S after they began; a head crossing GRACE_S beyond that gets 408 at once. A burst
  of fast clients from one address (a load generator) is never refused: their heads complete
  within GRACE_S.

uvicorn answered every protocol error with a 400 and closed the socket while the client was still
sending, so the client saw a connection reset rather than an answer. Here a refusal is an OpenAI
error object written by hand (h11's state machine may be in ERROR), and the close lingers: the
write side is shut, what the client still sends is read and dropped for up to LINGER_S, so the
answer reaches it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEADER_BYTES = 16 * 1024  # request line + headers (h11's default); more gets 431
LINGER_S = 2.0
GRACE_S = 1.0  # a head incomplete this long counts as slow (at most half the timeout)
REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large"}


@dataclass(frozen=True)
class HeadLimits:
    max_bytes: int = MAX_HEADER_BYTES
    timeout_s: float = 10.0  # serve.head_timeout_s
    per_client: int = 256  # serve.slow_heads_per_client

    @property
    def grace_s(self) -> float:
        return min(GRACE_S, self.timeout_s / 2)


@dataclass
class SlowHeads:
    """Per client address, the heads incomplete for over the grace (one per server; event loop only)."""

    by_addr: dict[str, int] = field(default_factory=dict)

    def admit(self, addr: str, cap: int) -> bool:
        held = self.by_addr.get(addr, 0)
        if held >= cap:
            return False
        self.by_addr[addr] = held + 1
        return True

    def release(self, addr: str) -> None:
        held = self.by_addr.get(addr, 0) - 1
        if held > 0:
            self.by_addr[addr] = held
        else:
            self.by_addr.pop(addr, None)


class HeadGuardProtocol(H11Protocol):
    """Built by uvicorn per connection, with `limits` and the server's `slow` bound in
    (`functools.partial`, serve/server.py `uvicorn_config`)."""

    def __init__(self, *args, limits: HeadLimits, slow: SlowHeads, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits, self.slow = limits, slow
        self._error: h11.RemoteProtocolError | None = None
        self._lingering = False
        self._fed = 0  # bytes handed to h11 on this connection
        self._mark = 0  # of which consumed when the previous message ended (the next head starts there)
        self._awaiting_head = True  # between two requests (or before the first)
        self._timer = None  # the head's grace, then timeout, timer while a head is open
        self._counted = False  # this head counts against its address's slow heads
        parse = self.conn.next_event

        def next_event():
            try:
                event = parse()
            except h11.RemoteProtocolError as exc:
                self._error = exc
                raise
            if isinstance(event, h11.Request):
                self._head_done()
                self._check_size()
            elif isinstance(event, h11.EndOfMessage):
                self._mark = self._consumed()
            return event

        self.conn.next_event = next_event

    # the head's clock ------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_begin()  # a new connection's head is due from the moment it opens

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the answer is sent: drop the rest of the request
        if self._awaiting_head and self._timer is None:
            self._head_begin()  # the first byte of the next head on a kept-alive connection
        self._fed += len(data)
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._awaiting_head = True  # the timer starts with the next request's first byte
        super().on_response_complete()  # (a whole pipelined head already buffered is taken here)
        waiting = self._awaiting_head and self._timer is None and not self.transport.is_closing()
        if waiting and self.conn.trailing_data[0]:
            self._head_begin()  # part of a pipelined head is buffered: its clock runs

    def connection_lost(self, exc) -> None:
        self._head_done()
        super().connection_lost(exc)

    def _head_begin(self) -> None:
        self._timer = self.loop.call_later(self.limits.grace_s, self._grace_over)

    def _head_done(self) -> None:
        self._awaiting_head = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counted:
            self._counted = False
            self.slow.release(self._addr)

    def _grace_over(self) -> None:
        if not self.slow.admit(self._addr, self.limits.per_client):
            self._timer = None
            self._refuse(408, "request_timeout", f"too many slow request heads from {self._addr} (at most "
                         f"{self.limits.per_client} may take over {self.limits.grace_s:g} s); send the head at once")
            return
        self._counted = True
        self._timer = self.loop.call_later(self.limits.timeout_s - self.limits.grace_s, self._timed_out)

    def _timed_out(self) -> None:
        self._timer = None
        self._refuse(408, "request_timeout",
                     f"the request head was not completed within {self.limits.timeout_s:g} s (serve.head_timeout_s)")

    @property
    def _addr(self) -> str:
        return self.client[0] if self.client else "?"

    # the head's size -------------------------------------------------------------------------------
    def _consumed(self) -> int:
        return self._fed - len(self.conn.trailing_data[0])

    def _check_size(self) -> None:
        size, self._mark = self._consumed() - self._mark, self._consumed()
        if size > self.limits.max_bytes:  # answered by send_400_response, as h11's own 431
            self._error = h11.RemoteProtocolError(f"request head of {size} bytes", error_status_hint=431)
            raise self._error

    # answers written by hand -----------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        if self._error is None or self._error.error_status_hint != 431:
            self._head_done()
            return super().send_400_response(msg)
        self._refuse(431, "request_header_fields_too_large",
                     f"the request line and headers are over the server's limit of {self.limits.max_bytes} bytes")

    def _refuse(self, status: int, code: str, text: str) -> None:
        """Answer `status` with an OpenAI error object, then close (lingering: see the module doc)."""
        self._head_done()
        if self._lingering or self.transport.is_closing():
            return
        body = json.dumps({"error": {"message": text, "type": "invalid_request_error", "param": None,
                                     "code": code}}).encode()
        head = (f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)
