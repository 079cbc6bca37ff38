"""Only JSON reaches /v1/*: a POST whose body is not `application/json` gets 415 before any handler.

A browser sends a cross-origin POST without asking first (no CORS preflight) only when it is a
"simple" request: a `text/plain`, form-encoded or multipart body, or no body. Refusing every body
whose Content-Type is not `application/json` (charset, if given, UTF-8) closes the first three; a
POST without a body (`curl -X POST .../v1/expert_distribution/start`) needs no Content-Type, unless
an `Origin` header names another host than `Host` (a page elsewhere: a browser sends Origin with
every POST). A cross-origin request that does send `application/json` needs a preflight, which this
server never grants (no CORS headers), so the browser does not send it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from moetune.serve.middleware import send_error
from moetune.serve.protocol import APIError

JSON = "application/json"
UTF8 = frozenset({"utf-8", "utf8"})


class JsonOnlyMiddleware:
    """415 for a POST under `prefix` whose body is not JSON (see the module docstring)."""

    def __init__(self, app, prefix: str = "/v1/"):
        self.app, self.prefix = app, prefix

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith(self.prefix):
            problem = refusal(scope["headers"])
            if problem is not None:
                return await send_error(send, APIError(415, problem, code="unsupported_media_type"))
        await self.app(scope, receive, send)


def refusal(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a POST with these headers is refused (None: it may pass)."""
    types = [v.decode("latin-1") for k, v in headers if k.lower() == b"content-type"]
    if len(types) > 1:
        return f"the request has {len(types)} Content-Type headers; send one: 'Content-Type: {JSON}'"
    if types:
        return _not_json(types[0])
    named = {k.lower(): v.decode("latin-1") for k, v in headers}
    if named.get(b"content-length", "0").strip().strip("0") or b"transfer-encoding" in named:  # "0", "00": none
        return f"the request has a body but no Content-Type; send 'Content-Type: {JSON}'"
    origin = named.get(b"origin")
    if origin is not None and urlsplit(origin).netloc.lower() != named.get(b"host", "").lower():
        return (f"a POST from another origin ({origin}) must send 'Content-Type: {JSON}' (this server answers no "
                "CORS preflight)")
    return None


def _not_json(value: str) -> str | None:
    media, *params = (p.strip() for p in value.split(";"))
    if media.lower() != JSON:
        return f"the request body must be JSON: 'Content-Type: {JSON}', got '{value[:100]}'"
    for param in params:
        name, _, val = param.partition("=")
        if name.strip().lower() == "charset" and val.strip().strip('"').lower() not in UTF8:
            return f"JSON request bodies are UTF-8: 'Content-Type: {JSON}; charset=utf-8', got '{value[:100]}'"
    return None
