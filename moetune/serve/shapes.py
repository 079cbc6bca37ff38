"""How /v1/completions and /v1/chat/completions shape a choice, a stream chunk and the usage chunk.

`Shape` is what differs between the two endpoints; `generation.py` does the rest. Token strings in
logprobs are each token decoded alone.
"""

from __future__ import annotations

from typing import Protocol


class Shape(Protocol):
    id_prefix: str

    def response(self, job) -> dict: ...

    def opening_chunks(self, job) -> list[dict]: ...

    def chunk(self, job, index: int, delta: str, logprobs, token: int) -> dict | None: ...

    def usage_chunk(self, job) -> dict: ...


class CompletionShape:
    id_prefix = "cmpl"

    def __init__(self, model_name: str, decode_token):
        self.model, self.decode_token = model_name, decode_token

    def _head(self, job) -> dict:
        return {"id": job.id, "object": "text_completion", "created": job.created, "model": self.model}

    def response(self, job) -> dict:
        choices = [{"index": i, "text": c.text, "finish_reason": c.finish_reason,
                    "logprobs": self._logprobs(c.logprobs) if job.stream.params[i].logprobs is not None else None}
                   for i, c in enumerate(job.choices)]
        return {**self._head(job), "choices": choices, "usage": job.usage()}

    def opening_chunks(self, job) -> list[dict]:
        return []

    def chunk(self, job, index, delta, logprobs, token):
        finish = job.choices[index].finish_reason
        if not delta and finish is None and logprobs is None:
            return None
        lp = self._logprobs([(token, logprobs)], offset=len(job.choices[index].text) - len(delta)) if logprobs else None
        return {**self._head(job), "choices": [{"index": index, "text": delta, "finish_reason": finish, "logprobs": lp}]}

    def usage_chunk(self, job) -> dict:
        return {**self._head(job), "choices": [], "usage": job.usage()}

    def _logprobs(self, entries, offset: int = 0) -> dict:
        tokens, values, tops, offsets = [], [], [], []
        for token, lp in entries:
            text = self.decode_token(token)
            tokens.append(text)
            values.append(lp.logprob)
            tops.append({self.decode_token(t): v for t, v in lp.top})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


class ChatShape:
    id_prefix = "chatcmpl"

    def __init__(self, model_name: str, decode_token):
        self.model, self.decode_token = model_name, decode_token

    def _head(self, job, chunk: bool) -> dict:
        return {"id": job.id, "object": "chat.completion.chunk" if chunk else "chat.completion",
                "created": job.created, "model": self.model}

    def response(self, job) -> dict:
        choices = [{"index": i, "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason,
                    "logprobs": {"content": [self._entry(t, lp) for t, lp in c.logprobs]}
                    if job.stream.params[i].logprobs is not None else None}
                   for i, c in enumerate(job.choices)]
        return {**self._head(job, False), "choices": choices, "usage": job.usage()}

    def opening_chunks(self, job) -> list[dict]:
        return [{**self._head(job, True), "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                       "finish_reason": None, "logprobs": None}]}
                for i in range(len(job.choices))]

    def chunk(self, job, index, delta, logprobs, token):
        finish = job.choices[index].finish_reason
        if not delta and finish is None and logprobs is None:
            return None
        lp = {"content": [self._entry(token, logprobs)]} if logprobs else None
        return {**self._head(job, True), "choices": [{"index": index, "delta": {"content": delta} if delta else {},
                                                      "finish_reason": finish, "logprobs": lp}]}

    def usage_chunk(self, job) -> dict:
        return {**self._head(job, True), "choices": [], "usage": job.usage()}

    def _entry(self, token: int, lp) -> dict:
        def one(t: int, v: float) -> dict:
            text = self.decode_token(t)
            return {"token": text, "logprob": v, "bytes": list(text.encode())}

        return {**one(token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}
