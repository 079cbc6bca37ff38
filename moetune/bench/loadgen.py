"""`moetune bench-serve`: send a load to an OpenAI-compatible server and measure it (as vLLM's
`bench serve` does).

Each request streams /v1/completions with `ignore_eos` so it generates exactly `output_len`
tokens. Arrivals are Poisson at `request_rate` (or all at once), capped at `concurrency` in flight.
Per request: TTFT (send → first text), ITL (gaps between text chunks), TPOT ((latency − TTFT) /
(tokens − 1)), latency. Every request ends as answered (200 and a complete stream), refused (an
HTTP error status: 429, 400, ...) or lost (no status and no complete answer: connection dropped,
timed out, stream cut before `[DONE]`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from moetune.errors import MoetuneError

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class LoadSettings:
    url: str
    num_prompts: int = 200
    request_rate: float | None = None  # requests/s (Poisson); None = all at once
    concurrency: int | None = None  # requests in flight at most; None = no cap
    prompts: str | None = None  # JSONL ("prompt" field) or text file; None = the bundled held-out prompts
    output_len: int = 128
    prompt_chars: int | None = 1000  # cut each prompt to this many characters; None = as is
    api_key: str | None = None
    model: str | None = None  # None: the first of /v1/models
    seed: int = 0
    timeout_s: float = 600.0

    def check(self) -> None:
        if self.num_prompts < 1 or self.output_len < 1:
            raise MoetuneError("--num-prompts and --output-len must be at least 1")
        if self.request_rate is not None and self.request_rate <= 0:
            raise MoetuneError("--request-rate must be positive (omit it to send everything at once)")
        if self.concurrency is not None and self.concurrency < 1:
            raise MoetuneError("--concurrency must be at least 1")
        if not self.url.startswith(("http://", "https://")):
            raise MoetuneError(f"--url '{self.url}' must start with http:// or https://")


@dataclass
class RequestResult:
    outcome: str  # "answered" | "refused" | "lost"
    status: str  # HTTP status, or the exception's name when there was none
    ttft: float | None = None
    latency: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str | None = None


def load_prompts(settings: LoadSettings, texts: list[str]) -> list[str]:
    """`num_prompts` prompts cycled from the prompt file's texts (read by the caller: the profile's
    reader, which bench, below profile, does not import), each cut to `prompt_chars`."""
    if settings.prompt_chars:
        texts = [t[: settings.prompt_chars] for t in texts]
    return [texts[i % len(texts)] for i in range(settings.num_prompts)]


def run_load(settings: LoadSettings, texts: list[str],
             on_done: Callable[[RequestResult], None] | None = None) -> dict:
    settings.check()
    prompts = load_prompts(settings, texts)
    results, duration, model = asyncio.run(_run(settings, prompts, on_done))
    return summarize(results, duration, settings, model)


def run_prompts(settings: LoadSettings, prompts: list) -> tuple[list[RequestResult], float, str]:
    """Send exactly `prompts` (texts, or token-id lists: /v1/completions takes both) as `settings` says;
    → (each request's result in sending order, seconds from the first send to the last answer, model)."""
    settings.check()
    return asyncio.run(_run(settings, prompts, None))


async def _run(settings: LoadSettings, prompts: list, on_done) -> tuple[list[RequestResult], float, str]:
    import httpx

    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=settings.url.rstrip("/"), headers=headers, limits=limits,
                                 timeout=httpx.Timeout(settings.timeout_s, connect=30)) as client:
        model = settings.model or await _first_model(client)
        gate = asyncio.Semaphore(settings.concurrency) if settings.concurrency else None
        rng = random.Random(settings.seed)
        tasks = []
        start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            if settings.request_rate is not None and i:
                await asyncio.sleep(rng.expovariate(settings.request_rate))
            tasks.append(asyncio.create_task(_one(client, model, prompt, settings, gate, on_done)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return list(results), duration, model


async def _first_model(client) -> str:
    import httpx

    try:
        r = await client.get("/v1/models")
    except httpx.HTTPError as exc:
        raise MoetuneError(f"cannot reach the server: {type(exc).__name__} {exc}; is it running?") from None
    if r.status_code != 200:
        raise MoetuneError(f"GET /v1/models answered {r.status_code}; check --url and --api-key")
    return r.json()["data"][0]["id"]


async def _one(client, model: str, prompt: str | list[int], settings: LoadSettings, gate, on_done) -> RequestResult:
    if gate is not None:
        async with gate:
            result = await _send(client, model, prompt, settings)
    else:
        result = await _send(client, model, prompt, settings)
    if on_done is not None:
        on_done(result)
    return result


async def _send(client, model: str, prompt: str | list[int], settings: LoadSettings) -> RequestResult:
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": settings.output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")[:200]
                return RequestResult("refused", str(r.status_code), error=text)
            return await _read_stream(r, sent)
    except (httpx.HTTPError, OSError) as exc:
        return RequestResult("lost", type(exc).__name__, error=str(exc)[:200])


async def _read_stream(response, sent: float) -> RequestResult:
    result = RequestResult("lost", "200", error="the stream ended before [DONE]")
    last = None
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        now = time.perf_counter()
        if data == "[DONE]":
            result.outcome, result.error, result.latency = "answered", None, now - sent
            break
        chunk = json.loads(data)
        if "error" in chunk:
            result.error = chunk["error"].get("message")
            break
        if chunk.get("usage"):
            result.output_tokens = chunk["usage"]["completion_tokens"]
            result.prompt_tokens = chunk["usage"]["prompt_tokens"]
        if any(c.get("text") for c in chunk.get("choices", [])):
            if last is None:
                result.ttft = now - sent
            else:
                result.itl.append(now - last)
            last = now
    return result


def summarize(results: list[RequestResult], duration: float, settings: LoadSettings, model: str) -> dict:
    answered = [r for r in results if r.outcome == "answered"]
    by_status: dict[str, int] = {}
    for r in results:
        if r.outcome != "answered":
            by_status[r.status] = by_status.get(r.status, 0) + 1
    out_tokens = sum(r.output_tokens for r in answered)
    in_tokens = sum(r.prompt_tokens for r in answered)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in answered
            if r.ttft is not None and r.output_tokens > 1]
    return {
        "settings": asdict(settings) | {"api_key": "***" if settings.api_key else None},
        "model": model,
        "duration_s": duration,
        "requests": len(results),
        "answered": len(answered),
        "refused": sum(r.outcome == "refused" for r in results),
        "lost": sum(r.outcome == "lost" for r in results),
        "failures_by_status": by_status,
        "request_throughput": len(answered) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "ttft_ms": _dist([r.ttft for r in answered if r.ttft is not None]),
        "tpot_ms": _dist(tpot),
        "itl_ms": _dist([x for r in answered for x in r.itl]),
        "latency_ms": _dist([r.latency for r in answered]),
        "errors": sorted({r.error for r in results if r.error})[:10],
    }


def _dist(seconds: list[float]) -> dict:
    if not seconds:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ms = np.asarray(seconds) * 1e3
    return {"mean": float(ms.mean()), **{f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES}}


def write_result(result: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
