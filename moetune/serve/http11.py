"""uvicorn's h11 protocol, answering an oversized request head with 431 instead of a reset.

h11 refuses a request line + headers over its incomplete-event limit (`MAX_HEADER_BYTES`) with a
RemoteProtocolError whose status hint is 431; uvicorn answered every protocol error with a 400
and closed the socket while the client was still sending, so the client saw a connection reset
(a 1 MB header) rather than an answer. Here the hint is kept, the answer is an OpenAI error object,
and the close lingers: the write side is shut, what the client still sends is read and dropped for
up to `LINGER_S`, so the answer reaches it.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEADER_BYTES = 16 * 1024  # request line + headers (h11's default); more gets 431
LINGER_S = 2.0


class HeaderLimitProtocol(H11Protocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._error: h11.RemoteProtocolError | None = None
        self._lingering = False
        parse = self.conn.next_event

        def next_event():
            try:
                return parse()
            except h11.RemoteProtocolError as exc:
                self._error = exc
                raise

        self.conn.next_event = next_event

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the answer is sent: drop the rest of the request
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        if self._error is None or self._error.error_status_hint != 431:
            return super().send_400_response(msg)
        text = f"the request line and headers are over the server's limit of {MAX_HEADER_BYTES} bytes"
        body = json.dumps({"error": {"message": text, "type": "invalid_request_error", "param": None,
                                     "code": "request_header_fields_too_large"}}).encode()
        head = (f"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)  # h11's state machine is in ERROR: written by hand
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)
