"""The FastAPI app: OpenAI-compatible routes, /health, /metrics, expert-distribution recording.

Bodies are parsed here (JSON, then the pydantic models of protocol.py) so that every mistake is a
400 with an OpenAI error object; auth, body size and per-status counting are ASGI middlewares
(middleware.py).
"""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from moetune.engine.sampling import SamplingParams
from moetune.errors import RequestError
from moetune.serve.generation import Job, respond
from moetune.serve.middleware import ApiKeyMiddleware, BodyLimitMiddleware, StatusCountMiddleware
from moetune.serve.protocol import APIError, ChatRequest, CompletionRequest, RecordRequest, validation_message
from moetune.serve.shapes import ChatShape, CompletionShape
from moetune.serve.state import ServerState
from moetune.serve.tenants import TENANT_HEADER


def build_app(state: ServerState, tokenizer) -> FastAPI:
    """`tokenizer`: an instance of the model's tokenizer for this (event-loop) thread only — the engine
    thread detokenizes with its own."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.worker.start()
        yield
        state.draining = True
        if state.recorder.recording:
            await state.recorder.stop()
        state.worker.stop()

    app = FastAPI(title="moetune serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    created = int(time.time())
    decode_token = lambda t: tokenizer.decode([t])  # noqa: E731
    completion_shape = CompletionShape(state.model_name, decode_token)
    chat_shape = ChatShape(state.model_name, decode_token)

    def encode(text: str) -> list[int]:
        ids = tokenizer.encode(text)
        if not ids:
            bos = state.generator.model.spec.bos_token_id
            ids = [bos if bos is not None else next(iter(state.eos_ids), 0)]
        return ids

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(exc.status_code, str(exc.detail), kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}", "server_error").body(),
                            status_code=500)

    @app.get("/health")
    async def health():
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": created,
                                            "owned_by": "moetune", "max_model_len": state.max_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(request, CompletionRequest)
        _check_model(state, body.model)
        prompts = _completion_prompts(body.prompt, encode, state.generator.model.spec.vocab_size)
        return await _generate(state, request, body, completion_shape, prompts, body.max_tokens, body.logprobs)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _parse(request, ChatRequest)
        _check_model(state, body.model)
        from moetune.engine.tokenizer import apply_chat_template

        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        prompt = encode(apply_chat_template(tokenizer, messages))
        return await _generate(state, request, body, chat_shape, [prompt], body.max_new_tokens, body.num_logprobs)

    @app.post("/v1/expert_distribution/start")
    async def record_start():
        return await state.recorder.start()

    @app.post("/v1/expert_distribution/stop")
    async def record_stop():
        return await state.recorder.stop()

    @app.post("/v1/expert_distribution/dump")
    async def record_dump(request: Request):
        raw = await request.body()
        body = await _parse(request, RecordRequest) if raw.strip() else RecordRequest()
        return await state.recorder.dump(body.name)

    # outermost first: count every answer, then refuse big bodies, then check the key
    app.add_middleware(ApiKeyMiddleware, api_key=state.api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=state.config.serve.max_body_bytes)
    app.add_middleware(StatusCountMiddleware, counter=state.metrics.requests)
    return app


async def _parse(request: Request, model: type[BaseModel]):
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(400, "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = validation_message(exc.errors())
        raise APIError(400, message, param=param) from None


def _check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise APIError(404, f"the model '{name}' does not exist; this server serves '{state.model_name}'",
                       param="model", code="model_not_found")


def _completion_prompts(prompt, encode, vocab_size: int) -> list[list[int]]:
    if isinstance(prompt, str):
        return [encode(prompt)]
    if all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    elif all(isinstance(p, str) for p in prompt):
        return [encode(p) for p in prompt]
    else:
        prompts = [list(p) for p in prompt]
    for ids in prompts:
        if not ids or any(not 0 <= t < vocab_size for t in ids):
            raise APIError(400, f"token-id prompts must be non-empty with ids in [0, {vocab_size})", param="prompt")
    return prompts


async def _generate(state: ServerState, request: Request, body, shape, prompts: list[list[int]],
                    max_tokens: int | None, logprobs: int | None):
    n, choice_prompts, params = body.n, [], []
    try:
        for ids in prompts:
            limit = max_tokens if max_tokens is not None else max(state.max_len - len(ids), 1)
            for j in range(n):
                choice_prompts.append(ids)
                params.append(SamplingParams(
                    max_tokens=limit, temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                    seed=None if body.seed is None else body.seed + len(params), stop=tuple(body.stop or ()),
                    ignore_eos=body.ignore_eos, logprobs=logprobs))
    except RequestError as exc:
        raise APIError(400, str(exc)) from None
    tenant = request.headers.get(TENANT_HEADER, "")
    reserved = sum(len(p) for p in prompts) + sum(p.max_tokens for p in params)
    job = Job(state, shape, choice_prompts, params, tenant, reserved)
    job.stream_usage = body.include_usage
    return await respond(job, request, body.stream)
