"""The OpenAI wire format: request bodies (pydantic) and the error object.

Fields moetune does not implement are refused with 400 when set to anything but their neutral
value (a silently ignored `logit_bias` would be a wrong answer); unknown fields are ignored, as
OpenAI-compatible servers do. `top_k` and `ignore_eos` are accepted as extensions (vLLM's names).

Types are strict, as OpenAI's API checks them: a string, a boolean or a fraction where an integer
belongs (`"max_tokens": "4"`, `true`, `4.5`, `"seed": "7"`) is a 400, and so is anything but
true/false where a boolean belongs; a float field takes an integer. A whole number written with a
fraction (`4.0`, `1e3`) is that integer (`Integer`): JSON has one number type, the JSON Schema of
/openapi.json counts 4.0 as an integer (so a client checked against it may send one), and vLLM
reads it the same way. `null` is the default wherever OpenAI documents a field as nullable
(`max_tokens`, `n`, `temperature`, `stream`, chat's `logprobs`, ...).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema, field_validator,
                      model_validator)

MAX_N = 64
MAX_STOPS = 16
MAX_SEED = 2**63 - 1  # choice i samples with seed + i, which must fit torch's signed 64-bit seed
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions; chat uses the same (documented)
WHOLE_FLOAT_LIMIT = 1e40  # a whole float beyond it is no integer parameter (integers are limited to 40 digits)


def _whole(value):
    """4.0 → 4; anything else is left to the strict integer check (which refuses it)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < WHOLE_FLOAT_LIMIT:
        return int(value)
    return value


Integer = Annotated[int, BeforeValidator(_whole)]
# bounds inside the type, before the validator, so that `| None` keeps them as minimum/maximum in the schema
TokenCount = Annotated[int, Field(ge=1), BeforeValidator(_whole)]
LogprobCount = Annotated[int, Field(ge=0, le=20), BeforeValidator(_whole)]
STRICT = ConfigDict(strict=True, extra="ignore")
# OpenAI documents these as nullable, null meaning the default (as `max_tokens`, `seed`, `stop`, ... are Optional)
NULL_IS_DEFAULT = ("n", "temperature", "top_p", "top_k", "stream", "ignore_eos", "logprobs")


def _nullable_in_schema(schema: dict) -> None:
    """/openapi.json: the NULL_IS_DEFAULT fields also take null (the model drops a null before checking)."""
    for name in NULL_IS_DEFAULT:
        prop = schema.get("properties", {}).get(name)
        if prop is not None and "anyOf" not in prop:
            kept = {k: prop.pop(k) for k in ("default", "title") if k in prop}
            schema["properties"][name] = {"anyOf": [prop, {"type": "null"}], **kept}


class APIError(Exception):
    """An error answered as {"error": {...}} with this status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


# field → its neutral value; anything else is refused
_UNSUPPORTED = {"echo": False, "suffix": None, "logit_bias": None, "presence_penalty": 0.0,
                "frequency_penalty": 0.0, "tools": None, "functions": None, "response_format": None}


class _Sampling(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", json_schema_extra=_nullable_in_schema)

    model: str | None = None
    n: Integer = Field(1, ge=1, le=MAX_N)
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)  # any value > 0 samples safely
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Integer = Field(0, ge=0)
    seed: Annotated[Integer, WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_SEED})] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in NULL_IS_DEFAULT)}
        return data

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, value):
        if value is not None and not 0 <= value <= MAX_SEED:
            raise ValueError(f"must be in [0, 2^63 - 1 = {MAX_SEED}], got {value}")
        return value

    @model_validator(mode="after")
    def _refuse_unsupported(self):
        extra = self.model_extra or {}
        for name, neutral in _UNSUPPORTED.items():
            value = extra.get(name, neutral)
            if value not in (neutral, None, {}, []) and not (name == "response_format" and value == {"type": "text"}):
                raise ValueError(f"'{name}' is not supported by moetune serve")
        best_of = extra.get("best_of")
        if best_of not in (None, 1, self.n):
            raise ValueError("'best_of' is not supported by moetune serve")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[Integer] | list[list[Integer]]
    max_tokens: TokenCount | None = None  # null or omitted: DEFAULT_MAX_TOKENS (OpenAI's default)
    logprobs: LogprobCount | None = None

    @field_validator("prompt")
    @classmethod
    def _nonempty(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        return value

    @field_validator("logprobs", mode="before")
    @classmethod
    def _count_not_flag(cls, value):
        if isinstance(value, bool):  # chat's logprobs is a flag; here it is a count, and false is not 0
            raise ValueError(f"expected an integer (how many top log-probabilities to return, 0-20) or null, got "
                             f"a boolean ({str(value).lower()}); omit it for none")
        return value

    @property
    def max_new_tokens(self) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS


class ContentPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """`content` is required for every role: OpenAI lets an assistant message leave it out only
    beside `tool_calls`, which moetune does not support (refused)."""

    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart]

    @model_validator(mode="before")
    @classmethod
    def _no_tool_calls(cls, data):
        for name in ("tool_calls", "function_call"):
            if isinstance(data, dict) and data.get(name) not in (None, []):
                raise ValueError(f"'{name}' is not supported by moetune serve (no tool calling)")
        return data

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: TokenCount | None = None  # neither set (or null): DEFAULT_MAX_TOKENS, as for completions
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: LogprobCount | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value, info: ValidationInfo):
        if value and not info.data.get("logprobs"):  # OpenAI: logprobs must be true when this is used
            raise ValueError("needs 'logprobs': true (without it no log-probabilities are returned)")
        return value

    @property
    def max_new_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class RecordRequest(BaseModel):
    """Body of /v1/expert_distribution/dump (optional): the run directory's name under serve.record_dir."""

    model_config = ConfigDict(strict=True, extra="forbid")
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_seed(seed: int | None, choices: int) -> None:
    """Choice i samples with seed + i: the last one must still fit a signed 64-bit seed."""
    if seed is not None and seed + choices - 1 > MAX_SEED:
        raise APIError(400, f"'seed': with {choices} choices (choice i uses seed + i) the seed must be in "
                       f"[0, 2^63 - 1 - {choices - 1} = {MAX_SEED - choices + 1}]", param="seed")
