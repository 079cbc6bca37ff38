"""ASGI middlewares: count answers by endpoint and status, cap request bodies, check the API key.

Pure ASGI (no BaseHTTPMiddleware) so that streaming responses and client disconnects pass through
untouched.
"""

from __future__ import annotations

import hmac
import json

from moetune.serve.protocol import APIError

COUNTED = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
           "/v1/expert_distribution/start", "/v1/expert_distribution/stop", "/v1/expert_distribution/dump",
           "/openapi.json", "/docs"}


async def send_error(send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class StatusCountMiddleware:
    def __init__(self, app, counter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = []

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            path = scope["path"] if scope["path"] in COUNTED else "other"
            self.counter.labels(path, str(status[0]) if status else "500").inc()  # raised: the 500 is sent outside


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = APIError(413, f"the request body is over the server's limit of {self.max_bytes} bytes",
                           code="request_too_large")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, too_big)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise too_big  # read by the handler's request.body() → the APIError handler
            return message

        await self.app(scope, limited_receive, send)


class ApiKeyMiddleware:
    """`open_paths` need no key (like vLLM: probes, scrapers and the API description). More than one
    Authorization header is refused (400) rather than one of them picked."""

    def __init__(self, app, api_key: str | None, open_paths: frozenset[str]):
        self.app, self.open_paths = app, open_paths
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if self.key is None or scope["type"] != "http" or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        given_all = [value for name, value in scope["headers"] if name == b"authorization"]
        if len(given_all) > 1:  # which one counts would be the server's guess (a proxy may add its own)
            error = APIError(400, f"{len(given_all)} Authorization headers; send exactly one "
                             "('Authorization: Bearer <key>')", code="duplicate_authorization")
            return await send_error(send, error)
        scheme, _, token = (given_all[0] if given_all else b"").partition(b" ")
        given = token.strip() if scheme.lower() == b"bearer" else b""
        if not hmac.compare_digest(given, self.key):  # constant time in the key's content
            error = APIError(401, "missing or invalid API key; send 'Authorization: Bearer <key>'",
                             code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await send_error(send, error)
        await self.app(scope, receive, send)
