"""400 / 401 / 404 / 413 answers carry an OpenAI error object; the openai client maps them."""

import httpx
import openai
import pytest


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_prompt_over_the_context_is_400(server):
    with pytest.raises(openai.BadRequestError) as info:
        server.client().completions.create(model=server.model, prompt=[5] * 3000, max_tokens=4)
    assert "context" in info.value.message


def test_max_tokens_over_what_the_context_leaves_is_400_with_the_limit(server):
    """Not silently cut to the context: the answer names the most the prompt allows."""
    from tests.serve.conftest import API_KEY

    h = {"Authorization": f"Bearer {API_KEY}"}
    url = f"{server.url}/v1/completions"
    err = _error(httpx.post(url, json={"model": server.model, "prompt": [5, 6, 7], "max_tokens": 99999}, headers=h), 400)
    limit = httpx.get(f"{server.url}/v1/models", headers=h).json()["data"][0]["max_model_len"] - 3
    assert err["param"] == "max_tokens" and f"at most {limit:,}" in err["message"]
    done = server.client().completions.create(model=server.model, prompt=[5, 6, 7], max_tokens=2)
    assert done.usage.completion_tokens <= 2


@pytest.mark.parametrize("extra,param", [
    ({"temperature": 5}, "temperature"), ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n"),
    ({"top_p": 0}, "top_p"), ({"logprobs": 99}, "logprobs"), ({"stop": [""]}, "stop"),
])
def test_bad_parameters_are_400_naming_them(server, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        server.client().completions.create(model=server.model, prompt="x", **extra)
    assert info.value.body["param"] == param


def test_unsupported_parameters_are_refused_not_ignored(server):
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        server.client().completions.create(model=server.model, prompt="x", logit_bias={"5": 10})


def test_malformed_bodies(server):
    h = {"Authorization": "Bearer sk-test-key", "Content-Type": "application/json"}
    url = f"{server.url}/v1/completions"
    assert "JSON" in _error(httpx.post(url, content=b"{not json", headers=h), 400)["message"]
    assert _error(httpx.post(url, content=b"[1, 2]", headers=h), 400)
    assert _error(httpx.post(url, json={"max_tokens": 3}, headers=h), 400)["param"] == "prompt"
    assert _error(httpx.post(f"{server.url}/v1/chat/completions", json={"messages": []}, headers=h), 400)
    assert _error(httpx.post(url, json={"prompt": [[1, 2], []]}, headers=h), 400)["param"] == "prompt"


def test_unknown_model_is_404(server):
    with pytest.raises(openai.NotFoundError):
        server.client().completions.create(model="gpt-4", prompt="x", max_tokens=2)


def test_a_body_over_the_limit_is_413(server):
    big = {"prompt": "x" * (70 * 1024), "max_tokens": 1}
    r = httpx.post(f"{server.url}/v1/completions", json=big, headers={"Authorization": "Bearer sk-test-key"})
    assert _error(r, 413)["code"] == "request_too_large"


def test_missing_or_wrong_key_is_401(server):
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="sk-wrong").completions.create(model=server.model, prompt="x", max_tokens=2)
    assert _error(httpx.get(f"{server.url}/v1/models"), 401)["code"] == "invalid_api_key"
    r = httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Basic sk-test-key"})
    _error(r, 401)
    assert httpx.post(f"{server.url}/v1/expert_distribution/start").status_code == 401  # admin: same key
    assert httpx.get(f"{server.url}/health").status_code == 200  # probes and scrapers need no key
    assert httpx.get(f"{server.url}/metrics").status_code == 200
