"""The HTTP routes, on a module-level APIRouter: OpenAI completions and chat, models, /health,
/metrics, expert-distribution recording.

Handlers reach the server through the request: `request.app.state.serve` (ServerState) and
`request.app.state.text` (the event-loop thread's tokenizer and the two response shapes), set by
`build_app`. Bodies are parsed by bodies.py; the response models are schemas.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from moetune.engine.sampling import SamplingParams
from moetune.errors import RequestError
from moetune.serve import schemas
from moetune.serve.bodies import parse
from moetune.serve.generation import Job, respond
from moetune.serve.protocol import APIError, ChatRequest, CompletionRequest, RecordRequest, check_seed
from moetune.serve.shapes import Shape
from moetune.serve.state import ServerState
from moetune.serve.tenants import TENANT_HEADER

router = APIRouter()


@dataclass
class Text:
    """What the handlers need of the tokenizer (this thread's instance; the engine has its own)."""

    tokenizer: object
    completion: Shape
    chat: Shape
    created: int  # the models' `created` in /v1/models


def _serve(request: Request) -> ServerState:
    return request.app.state.serve


@router.get("/health", responses={200: {"model": schemas.Health}, 503: {"model": schemas.Health}})
async def health(request: Request):
    """200 while the engine takes requests; 503 `unhealthy` with the reason once it has failed (for the
    second before the server stops). There is no `draining` answer: SIGTERM closes the listening socket
    and idle connections at once, so a probe gets a refused connection (should one still be answered
    while the server stops, it is 503 `unhealthy`, "the server is shutting down")."""
    state = _serve(request)
    if not state.worker.healthy or state.draining:
        reason = state.worker.failure or ("the server is shutting down" if state.draining else
                                          "the engine thread stopped")
        return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request):
    """Prometheus text format."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(_serve(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", responses={200: {"model": schemas.ModelList}, **schemas.errors(401)})
async def models(request: Request):
    state = _serve(request)
    return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": request.app.state.text.created,
                                        "owned_by": "moetune", "max_model_len": state.max_len}]}


@router.post("/v1/completions", **schemas.generation(CompletionRequest, schemas.CompletionResponse,
                                                     schemas.CompletionChunk))
async def completions(request: Request):
    state, text, body = await _read(request, CompletionRequest)
    prompts = _completion_prompts(body.prompt, lambda s: _encode(state, text.tokenizer, s),
                                  state.generator.model.spec.vocab_size)
    return await _generate(state, request, body, text.completion, prompts, body.max_new_tokens, body.logprobs)


@router.post("/v1/chat/completions", **schemas.generation(ChatRequest, schemas.ChatCompletionResponse,
                                                          schemas.ChatCompletionChunk))
async def chat(request: Request):
    from moetune.engine.tokenizer import apply_chat_template

    state, text, body = await _read(request, ChatRequest)
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    prompt = _encode(state, text.tokenizer, apply_chat_template(text.tokenizer, messages))
    return await _generate(state, request, body, text.chat, [prompt], body.max_new_tokens, body.num_logprobs)


@router.post("/v1/expert_distribution/start",
             responses={200: {"model": schemas.RecordingState}, **schemas.errors(401, 409, 415)})
async def record_start(request: Request):
    return await _serve(request).recorder.start()


@router.post("/v1/expert_distribution/stop",
             responses={200: {"model": schemas.RecordingState}, **schemas.errors(401, 409, 415)})
async def record_stop(request: Request):
    return await _serve(request).recorder.stop()


@router.post("/v1/expert_distribution/dump", responses={200: {"model": schemas.RecordingDump},
                                                       **schemas.errors(400, 401, 409, 413, 415)},
             openapi_extra=schemas.request_body(RecordRequest))
async def record_dump(request: Request):
    body = await parse(request, RecordRequest, optional=True)
    return await _serve(request).recorder.dump(body.name)


async def _read(request: Request, model) -> tuple[ServerState, Text, object]:
    """A generation request's server, text helpers and parsed body (its model checked)."""
    state = _serve(request)
    body = await parse(request, model)
    _check_model(state, body.model)
    return state, request.app.state.text, body


def _encode(state: ServerState, tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    if not ids:
        bos = state.generator.model.spec.bos_token_id
        ids = [bos if bos is not None else next(iter(state.eos_ids), 0)]
    return ids


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


async def _generate(state: ServerState, request: Request, body, shape: Shape, prompts: list[list[int]],
                    max_tokens: int, logprobs: int | None):
    n, choice_prompts, params = body.n, [], []
    check_seed(body.seed, n * len(prompts))
    try:
        for ids in prompts:
            room = max(state.max_len - len(ids), 1)  # what the context leaves after this prompt
            # never cut silently (a prompt over the context gets its own 400 below)
            if len(ids) < state.max_len and max_tokens > room:
                raise APIError(400, f"max_tokens {max_tokens}{_defaulted(body)} is more than the {room:,} tokens the "
                                    f"context of {state.max_len:,} leaves after this {len(ids):,}-token prompt; ask "
                                    f"for at most {room:,}", param="max_tokens")
            for _ in range(n):
                choice_prompts.append(ids)
                params.append(SamplingParams(
                    max_tokens=max_tokens, temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                    seed=None if body.seed is None else body.seed + len(params), stop=tuple(body.stop or ()),
                    ignore_eos=body.ignore_eos, logprobs=logprobs))
    except RequestError as exc:
        raise APIError(400, str(exc)) from None
    tenant = request.headers.get(TENANT_HEADER, "")
    reserved = sum(len(p) for p in prompts) + sum(p.max_tokens for p in params)
    job = Job(state, shape, choice_prompts, params, tenant, reserved)
    job.stream_usage = body.include_usage
    return await respond(job, request, body.stream)


def _defaulted(body) -> str:
    given = {"max_tokens", "max_completion_tokens"} & body.model_fields_set
    return "" if any(getattr(body, name) is not None for name in given) else " (the default)"
