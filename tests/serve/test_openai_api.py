"""The OpenAI endpoints through the official `openai` client against a real server."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from moetune.model.registry import bundled_asset

PROMPT = "def read_config(path):\n"


def _prompts(n: int) -> list[str]:
    lines = bundled_asset("prompts/stdlib-heldout.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"][:200] for line in lines[:n]]


def test_models_and_health(server):
    client = server.client()
    assert [m.id for m in client.models.list().data] == [server.model]
    import httpx

    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


def test_completion_has_text_finish_reason_and_usage(server):
    out = server.client().completions.create(model=server.model, prompt=PROMPT, max_tokens=8, temperature=0)
    choice = out.choices[0]
    assert isinstance(choice.text, str) and choice.text and choice.finish_reason in ("length", "stop")
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens == 8 and out.usage.total_tokens > 8
    assert out.usage.model_extra["expert_flops"] > 0  # routed-expert cost of the request


def test_chat_completion(server):
    out = server.client().chat.completions.create(
        model=server.model, messages=[{"role": "system", "content": "python"}, {"role": "user", "content": "import os"}],
        max_tokens=6, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content
    assert out.usage.completion_tokens == 6 and out.object == "chat.completion"


def test_streaming_equals_the_full_answer(server):
    client = server.client()
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    messages = [{"role": "user", "content": "class Foo:"}]
    chat = client.chat.completions.create(model=server.model, messages=messages, max_tokens=10, temperature=0)
    stream = list(client.chat.completions.create(model=server.model, messages=messages, max_tokens=10,
                                                 temperature=0, stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == chat.choices[0].message.content
    assert stream[-1].choices[0].finish_reason == "length"


def test_n_choices(server):
    client = server.client()
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=7, n=3)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert out.usage.completion_tokens == sum(1 for _ in range(3)) * 8
    assert len({c.text for c in out.choices}) > 1  # seeded per choice, not three copies
    again = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=7, n=3)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # the seed makes it reproducible
    greedy = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "x = 1"}],
                                            max_tokens=5, temperature=0, n=2, stream=True)
    texts = {0: "", 1: ""}
    for chunk in greedy:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] == texts[1] and texts[0]


def test_stop_strings_cut_the_text(server):
    client = server.client()
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), full
    cut = full[: full.find(stop)]
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0,
                                         stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_logprobs(server):
    client = server.client()
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == 5 and all(v <= 0 for v in lp.token_logprobs)
    assert "".join(lp.tokens) == out.choices[0].text and all(len(t) == 2 for t in lp.top_logprobs)
    chat = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "import re"}],
                                          max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 3 and c.token == c.top_logprobs[0].token for c in content)


def test_sixteen_concurrent_greedy_requests_match_each_alone(server):
    client = server.client()
    prompts = _prompts(16)

    def ask(p):
        return client.completions.create(model=server.model, prompt=p, max_tokens=16, temperature=0).choices[0].text

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone


def test_tenant_over_its_token_rate_gets_429(server):
    import openai

    client = server.client(default_headers={"X-Tenant": "tiny"})
    client.completions.create(model=server.model, prompt="x", max_tokens=20, temperature=0)
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model=server.model, prompt="x", max_tokens=20, temperature=0)
    assert "tiny" in info.value.message and int(info.value.response.headers["retry-after"]) >= 1
    server.client().completions.create(model=server.model, prompt="x", max_tokens=2)  # other tenants unaffected
