"""One generation request end to end: admit (queue bound, tenant rate), submit to the engine worker,
then answer as one JSON body or as an SSE stream; whatever happens, abort what still runs and give
the queue slots back.

The client is watched while the answer is computed, not only when idle: a task waits for the
connection's `http.disconnect` and puts ("gone",) on the stream's queue, so a non-streaming request
whose client left is aborted as soon as its handler takes the next event (a few engine steps at most).
An engine failure is a 500 (a JSON error, or an SSE error event), the server stopping a 503; a
stream always ends with `data: [DONE]`.

`Job` holds the per-request bookkeeping (choices' text, token counts, logprobs, timing); the two
OpenAI endpoints differ only in how a choice and a chunk are shaped (`shapes.py`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from moetune.engine.sampling import SamplingParams
from moetune.serve.protocol import APIError
from moetune.serve.shapes import Shape
from moetune.serve.state import ServerState
from moetune.serve.worker import Stream

@dataclass
class Choice:
    text: str = ""
    tokens: int = 0
    finish_reason: str | None = None  # "error": the engine failed this sequence alone (see `error`)
    error: str | None = None
    logprobs: list[tuple[int, object]] = field(default_factory=list)  # (token id, TokenLogprobs)
    last_t: float | None = None


class Job:
    def __init__(self, state: ServerState, shape: Shape, prompts: list[list[int]], params: list[SamplingParams],
                 tenant: str, reserved_tokens: int):
        self.state, self.shape, self.tenant, self.reserved = state, shape, tenant, reserved_tokens
        self.id = f"{shape.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.stream = Stream(prompts, params, asyncio.get_running_loop(), tenant=tenant)
        self.choices = [Choice() for _ in params]
        self.prompt_tokens = sum(len(p) for p in _distinct(prompts))
        self.stream_usage = False  # a last chunk with `usage` (stream_options.include_usage)
        self._slots = self._charged = self._admitted = self._closed = False

    # admission --------------------------------------------------------------------------------
    async def admit(self) -> None:
        """Reserve queue slots, hand the sequences to the engine, wait until it accepts them."""
        s, n = self.state, len(self.choices)
        if s.draining:
            raise APIError(503, "the server is shutting down", "server_error")
        if s.worker.failure is not None:
            raise APIError(503, f"the engine has failed ({s.worker.failure}); the server is restarting",
                           "server_error")
        if n > s.capacity:
            raise APIError(400, f"the request asks for {n} sequences but the server holds at most {s.capacity} "
                           "(max_num_seqs + max_queue); lower n or send fewer prompts", param="n")
        if s.inflight + n > s.capacity:
            raise APIError(429, f"the server is at capacity ({s.capacity} sequences running or queued); retry "
                           "later", "rate_limit_error", headers={"Retry-After": str(s.retry_after_s())})
        s.inflight += n
        self._slots = True
        s.tenants.charge(self.tenant, self.reserved)  # 429 when the tenant is over its token rate
        self._charged = True
        s.worker.submit(self.stream)
        kind, payload = (await self.stream.queue.get())[:2]
        if kind == "error":
            raise APIError(400, str(payload), param="prompt")
        if kind == "aborted":
            raise APIError(503, str(payload), "server_error")
        if kind == "failed":
            raise APIError(500, str(payload), "server_error")
        self._admitted = True
        s.metrics.prompt_tokens.inc(self.prompt_tokens)
        s.recorder.note(sequences=n)

    def close(self) -> None:
        """Idempotent; runs on every path out (done, error, client gone, server stopping)."""
        if self._closed:
            return
        self._closed = True
        s = self.state
        if self._slots:
            s.inflight -= len(self.choices)
        if self._charged:
            used = self.prompt_tokens + sum(c.tokens for c in self.choices) if self._admitted else 0
            s.tenants.refund(self.tenant, max(self.reserved - used, 0))
        if not self._admitted:
            s.worker.abort(self.stream)  # in case the engine took it after we stopped waiting
            return
        unfinished = sum(c.finish_reason is None for c in self.choices)
        failed = sum(c.finish_reason == "error" for c in self.choices)
        if unfinished:  # the client left, or a sibling choice failed
            s.worker.abort(self.stream)
            s.metrics.aborted.labels("error" if failed else "client_gone").inc(unfinished)
        if failed:
            s.metrics.aborted.labels("error").inc(failed)
        s.metrics.expert_flops.labels(self.tenant).inc(self.expert_flops())
        s.recorder.note(generated=sum(c.tokens for c in self.choices))

    # events -----------------------------------------------------------------------------------
    def apply(self, items) -> list[tuple[int, str, object | None, int]]:
        """Outputs [(choice, RequestOutput, step time), ...] → (choice, text delta, logprobs or None,
        token) to send: a choice's tokens without logprobs joined in one delta (tokens held over several
        steps, serve/stream_interval.py), each token with logprobs on its own; updates metrics."""
        s, sent, merge = self.state, [], {}  # merge: choice → its entry in `sent` that takes more text
        for index, out, t in items:
            c = self.choices[index]
            if out.finish_reason == "error":
                c.finish_reason, c.error = "error", out.error
                continue
            eos = out.new_token in s.eos_ids and not self.stream.params[index].ignore_eos
            if not eos:
                c.tokens += 1
                s.metrics.generation_tokens.inc()
                if out.logprobs is not None:
                    c.logprobs.append((out.new_token, out.logprobs))
            if c.last_t is None:
                s.metrics.ttft.observe(t - self.stream.arrival)
            else:
                s.metrics.itl.observe(t - c.last_t)
            c.last_t = t
            c.text += out.text_delta
            c.finish_reason = out.finish_reason
            logprobs = out.logprobs if not eos else None
            if logprobs is None and index in merge:  # a token of a held run: joins its choice's chunk
                at = merge[index]
                sent[at] = (index, sent[at][1] + out.text_delta, None, out.new_token)
                continue
            sent.append((index, out.text_delta, logprobs, out.new_token))
            if logprobs is None:
                merge[index] = len(sent) - 1
            else:
                merge.pop(index, None)  # each token with logprobs keeps a chunk of its own
        if self.done and items:
            s.metrics.e2e.observe(items[-1][2] - self.stream.arrival)
        return sent

    def server_aborted(self, kind: str, reason: str) -> APIError:
        """The engine dropped our sequences: "aborted" (shutdown: 503) or "failed" (engine failure:
        500); the error to answer with."""
        unfinished = [c for c in self.choices if c.finish_reason is None]
        for c in unfinished:
            c.finish_reason = "abort"
        self.state.metrics.aborted.labels("server" if kind == "aborted" else "error").inc(len(unfinished))
        return APIError(503 if kind == "aborted" else 500, reason, "server_error")

    def failed_choice(self) -> APIError | None:
        """The error to answer with when the engine failed one of our sequences (the rest is aborted)."""
        for i, c in enumerate(self.choices):
            if c.finish_reason == "error":
                return APIError(500, f"internal error generating choice {i}: {c.error}", "server_error")
        return None

    @property
    def done(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    def usage(self) -> dict:
        completion = sum(c.tokens for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion, "expert_flops": self.expert_flops()}

    def expert_flops(self) -> int:
        """Routed-expert FLOPs of the tokens computed for this request: every prompt and completion token
        of every choice runs K experts in each MoE layer."""
        tokens = sum(len(p) for p in self.stream.prompts) + sum(c.tokens for c in self.choices)
        return int(tokens * self.state.expert_flops_per_token)


def _distinct(prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt once (the n choices of one prompt share it in `usage`)."""
    out: list[list[int]] = []
    for p in prompts:
        if not out or out[-1] is not p:
            out.append(p)
    return out


async def respond(job: Job, request: Request, stream: bool) -> Response:
    try:
        await job.admit()
    except BaseException:
        job.close()
        raise
    if stream:
        return _SSE(_events(job), job.close)
    try:
        await _collect(job, request)
    finally:
        job.close()
    body = job.shape.response(job)
    return JSONResponse(body)


async def _collect(job: Job, request: Request) -> None:
    watcher = asyncio.create_task(_watch_disconnect(request, job.stream.queue))
    try:
        while not job.done:
            event = await job.stream.queue.get()
            if event[0] == "gone":
                return  # close() aborts the sequences
            if event[0] in ("aborted", "failed"):
                raise job.server_aborted(event[0], str(event[1]))
            job.apply(event[1])
            error = job.failed_choice()
            if error is not None:
                raise error
    finally:
        watcher.cancel()


async def _watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """Wait for the client to go away (the body is read: the next message is `http.disconnect`)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait(("gone",))


async def _events(job: Job):
    """The SSE body: one write per batch of events waiting on the stream's queue (a front end that
    fell behind the engine catches up in one write instead of one per token)."""
    shape = job.shape
    for first in shape.opening_chunks(job):
        yield _sse(first)
    ended = False
    while not job.done and not ended:
        events = [await job.stream.queue.get()]
        while not job.stream.queue.empty():
            events.append(job.stream.queue.get_nowait())
        parts: list[str] = []
        for event in events:
            ended = _event_chunks(job, event, parts)
            if ended or job.done:
                break
        if parts:
            yield "".join(parts)
    if not ended and job.stream_usage:
        yield _sse(shape.usage_chunk(job))
    yield "data: [DONE]\n\n"


def _event_chunks(job: Job, event: tuple, parts: list[str]) -> bool:
    """One queue event's SSE chunks appended to `parts`; True when the stream ends with an error."""
    if event[0] in ("aborted", "failed"):
        parts.append(_sse(job.server_aborted(event[0], str(event[1])).body()))
        return True
    for index, delta, logprobs, token in job.apply(event[1]):
        chunk = job.shape.chunk(job, index, delta, logprobs, token)
        if chunk is not None:
            parts.append(_sse(chunk))
    error = job.failed_choice()
    if error is not None:
        parts.append(_sse(error.body()))
        return True
    return False


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _SSE(StreamingResponse):
    """An SSE response whose `on_close` runs however the response ends (client gone included)."""

    def __init__(self, events, on_close):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
