"""Response models and the OpenAPI description of every route (`/openapi.json`, `/docs`).

The handlers build their JSON themselves (shapes.py) and return Responses, so these models do not
run per request; they are what `/openapi.json` promises, and the schemathesis suite
(tests/serve/test_openapi.py) checks every answer against them. Request bodies are parsed by
bodies.py (not by FastAPI), so their schemas are added to the document here (`request_body`,
`openapi_document`), and so are the stream chunks' (`sse`).
"""

from __future__ import annotations

from typing import Literal

from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from moetune.serve.protocol import ChatRequest, CompletionRequest, RecordRequest

FinishReason = Literal["stop", "length", "abort", "error"] | None


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorBody


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    expert_flops: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason
    logprobs: CompletionLogprobs | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason
    logprobs: CompletionLogprobs | None


class CompletionChunk(BaseModel):
    """One `data:` event of a streamed completion; the last (with stream_options.include_usage) has no
    choices and the usage."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    """`unhealthy` (503) once the engine failed, with the reason; never `draining`: SIGTERM closes the
    listening socket first (routes.health)."""

    status: Literal["ok", "unhealthy"]
    reason: str | None = None


class RecordingState(BaseModel):
    recording: bool
    steps: int | None = None


class RecordingDump(BaseModel):
    path: str
    steps: int
    kinds: list[str]


def errors(*statuses: int) -> dict:
    """`responses=` entries: these statuses answer an OpenAI error object."""
    return {s: {"model": ErrorResponse} for s in statuses}


def request_body(model: type[BaseModel]) -> dict:
    """`openapi_extra=` for a route that parses `model` itself."""
    return {"requestBody": {"required": model is not RecordRequest, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def sse(chunk: type[BaseModel]) -> dict:
    """The `text/event-stream` answer of `stream: true`: each event's data is a chunk or an error
    object (the engine failed, the server stopped), and the last is `[DONE]`."""
    ref = lambda m: {"$ref": f"#/components/schemas/{m.__name__}"}  # noqa: E731
    data = {"anyOf": [{"const": "[DONE]"}, {"type": "string", "contentMediaType": "application/json",
                                             "contentSchema": {"anyOf": [ref(chunk), ref(ErrorResponse)]}}]}
    return {"text/event-stream": {"schema": {"type": "object", "required": ["data"], "properties": {"data": data}}}}


def generation(request: type[BaseModel], response: type[BaseModel], chunk: type[BaseModel]) -> dict:
    """The route arguments of a generation endpoint: its body, its JSON and SSE answers, its errors."""
    return {"openapi_extra": request_body(request),
            "responses": {200: {"model": response, "content": sse(chunk)},
                          **errors(400, 401, 404, 413, 415, 429, 500, 503)}}


# parsed by bodies.py or referenced by hand (sse): added to the document's components
DOCUMENTED_MODELS: tuple[type[BaseModel], ...] = (CompletionRequest, ChatRequest, RecordRequest, CompletionChunk,
                                                  ChatCompletionChunk, ErrorResponse)


def openapi_document(app) -> dict:
    """FastAPI's document plus the request models' schemas (cached on the app)."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in DOCUMENTED_MODELS:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        app.openapi_schema = doc
    return app.openapi_schema
