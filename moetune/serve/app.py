"""The FastAPI app: the routes of routes.py, the error handlers, the middlewares, the lifespan.

Every mistake is answered with an OpenAI error object (the handlers below); auth, body size and
per-status counting are ASGI middlewares (middleware.py), and so is the 415 for a POST body that is
not JSON (content_type.py). `/openapi.json` and `/docs` describe every route with its request and
response models (schemas.py).
"""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from moetune.serve.bodies import ClientGone
from moetune.serve.content_type import JsonOnlyMiddleware
from moetune.serve.middleware import ApiKeyMiddleware, BodyLimitMiddleware, StatusCountMiddleware
from moetune.serve.protocol import APIError
from moetune.serve.routes import Text, router
from moetune.serve.schemas import openapi_document
from moetune.serve.shapes import ChatShape, CompletionShape
from moetune.serve.state import ServerState

log = logging.getLogger("moetune.serve")


def build_app(state: ServerState, tokenizer) -> FastAPI:
    """`tokenizer`: an instance of the model's tokenizer for this (event-loop) thread only — the engine
    thread detokenizes with its own."""
    app = FastAPI(title="moetune serve", version="1", lifespan=_lifespan,
                  description="OpenAI-compatible completions and chat on a moetune engine")
    app.openapi = lambda: openapi_document(app)
    app.state.serve = state
    decode_token = lambda t: tokenizer.decode([t])  # noqa: E731
    app.state.text = Text(tokenizer, CompletionShape(state.model_name, decode_token),
                          ChatShape(state.model_name, decode_token), int(time.time()))
    app.include_router(router)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal)
    # outermost first: count every answer, then refuse big bodies, then check the key, then refuse non-JSON
    app.add_middleware(JsonOnlyMiddleware)
    app.add_middleware(ApiKeyMiddleware, api_key=state.api_key, open_paths=OPEN_PATHS)
    app.add_middleware(BodyLimitMiddleware, max_bytes=state.config.serve.max_body_bytes)
    app.add_middleware(StatusCountMiddleware, counter=state.metrics.requests)
    return app


OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect"})


@asynccontextmanager
async def _lifespan(app: FastAPI):
    state: ServerState = app.state.serve
    state.worker.start()
    yield
    state.draining = True
    if state.recorder.recording:
        await state.recorder.stop()
    state.worker.stop()


async def _api_error(request: Request, exc: APIError):
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _client_gone(request: Request, exc: ClientGone):
    return Response(status_code=499)  # nobody reads it; counted as 499 (nginx's "client closed request")


async def _http_error(request: Request, exc: StarletteHTTPException):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(APIError(exc.status_code, str(exc.detail), kind).body(), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def _internal(request: Request, exc: Exception):
    log.error("internal error answering %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc,
              exc_info=exc)
    return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}", "server_error").body(),
                        status_code=500)
