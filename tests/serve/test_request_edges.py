"""The last request edges of `moetune serve` (issue 41), through a real server: raw UTF-8 bytes the
tokenizer cannot take (a lone surrogate, ED A0 80) in any string field, bodies that are not
`application/json` (a browser's simple cross-origin POST), loose types, chat messages without
content, `max_tokens: null`, and /health's two states."""

import logging

import httpx
import pytest

from tests.serve.openai_errors import error_of as _error, logged  # noqa: F401 (a fixture)
from tests.serve.conftest import API_KEY

JSON = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
SURROGATE = b"\xed\xa0\x80"  # U+D800 encoded as if it were a character: not UTF-8


# -- bytes the tokenizer cannot take ------------------------------------------------------------
@pytest.mark.parametrize("path,raw", [
    ("/v1/completions", b'{"prompt": "abc' + SURROGATE + b'def", "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": ["ok", "' + SURROGATE + b'"], "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "stop": "' + SURROGATE + b'"}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "stop": ["a", "' + SURROGATE + b'"]}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "user": "' + SURROGATE + b'"}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "' + SURROGATE + b'"}], "max_tokens": 2}'),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a' + SURROGATE + b'"}]}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "stop": "' + SURROGATE + b'"}'),
    ("/v1/expert_distribution/dump", b'{"name": "' + SURROGATE + b'"}'),
])
def test_raw_surrogate_bytes_anywhere_are_400_without_a_traceback(server, logged, path, raw):
    err = _error(httpx.post(f"{server.url}{path}", content=raw, headers=JSON, timeout=30), 400)
    assert "UTF-16 surrogate (U+D800) encoded as UTF-8 bytes" in err["message"], err
    assert f"at byte {raw.index(SURROGATE)}" in err["message"]
    assert not [r for r in logged if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.parametrize("field", [b'"stop": "a\\udc00"', b'"stop": ["\\ud800"]', b'"user": "\\ud800"'])
def test_an_escaped_surrogate_in_any_field_is_400_too(server, field):
    raw = b'{"prompt": "x", "max_tokens": 2, ' + field + b"}"
    err = _error(httpx.post(f"{server.url}/v1/completions", content=raw, headers=JSON), 400)
    assert "lone UTF-16 surrogate" in err["message"], err


def test_other_invalid_utf8_is_400_and_valid_text_passes(server):
    bad = b'{"prompt": "caf\xe9", "max_tokens": 2}'  # Latin-1, not UTF-8
    err = _error(httpx.post(f"{server.url}/v1/completions", content=bad, headers=JSON), 400)
    assert "0xE9, which is not valid UTF-8" in err["message"]
    good = '{"prompt": "café 😀 ✓", "max_tokens": 2, "stop": "😀"}'.encode()
    assert httpx.post(f"{server.url}/v1/completions", content=good, headers=JSON, timeout=60).status_code == 200
    bom = b"\xef\xbb\xbf" + b'{"prompt": "x", "max_tokens": 1}'  # a byte-order mark is dropped, as before
    assert httpx.post(f"{server.url}/v1/completions", content=bom, headers=JSON, timeout=60).status_code == 200


# -- Content-Type -------------------------------------------------------------------------------
BODY = b'{"prompt": "x", "max_tokens": 1}'


@pytest.mark.parametrize("content_type,content", [
    ("text/plain", BODY), ("text/plain;charset=UTF-8", BODY),
    ("application/x-www-form-urlencoded", b"prompt=x&max_tokens=1"),
    ("multipart/form-data; boundary=b", b'--b\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n--b--\r\n'),
    ("application/xml", b"<prompt>x</prompt>"), ("text/xml", BODY), ("application/jsonx", BODY),
    ("application/json; charset=latin-1", BODY), (None, BODY),
])
def test_a_body_that_is_not_json_is_415(server, content_type, content):
    headers = {"Authorization": f"Bearer {API_KEY}", **({"Content-Type": content_type} if content_type else {})}
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/expert_distribution/dump"):
        err = _error(httpx.post(f"{server.url}{path}", content=content, headers=headers), 415)
        assert err["code"] == "unsupported_media_type" and "application/json" in err["message"]


def test_json_content_types_that_pass(server):
    for content_type in ("application/json", "Application/JSON", "application/json; charset=utf-8",
                         'application/json;charset="UTF-8"'):
        r = httpx.post(f"{server.url}/v1/completions", content=BODY, timeout=60,
                       headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": content_type})
        assert r.status_code == 200, (content_type, r.text)


def test_a_post_without_a_body_needs_no_content_type_unless_from_another_origin(server):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    port = server.url.rsplit(":", 1)[1]
    stop = f"{server.url}/v1/expert_distribution/stop"
    assert _error(httpx.post(stop, headers=auth), 409)["code"]  # curl -X POST: reaches the route (nothing recording)
    assert httpx.post(stop, headers={**auth, "Origin": f"http://127.0.0.1:{port}"}).status_code == 409  # same origin
    err = _error(httpx.post(stop, headers={**auth, "Origin": "https://evil.example"}), 415)
    assert "another origin" in err["message"]
    err = _error(httpx.post(stop, headers={**auth, "Origin": "null"}), 415)  # a sandboxed page or a file
    two = [("Authorization", f"Bearer {API_KEY}"), ("Content-Type", "application/json"), ("Content-Type", "text/plain")]
    assert "2 Content-Type headers" in _error(httpx.post(f"{server.url}/v1/completions", content=BODY, headers=two),
                                             415)["message"]


def test_the_key_is_checked_before_the_content_type(server):
    r = httpx.post(f"{server.url}/v1/completions", content=BODY, headers={"Content-Type": "text/plain"})
    assert _error(r, 401)["code"] == "invalid_api_key"


# -- strict types -------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,param,words", [
    ({"max_tokens": "4"}, "max_tokens", 'expected an integer, got a string ("4")'),
    ({"max_tokens": True}, "max_tokens", "expected an integer, got a boolean (true)"),
    ({"max_tokens": 4.5}, "max_tokens", "expected an integer, got a number (4.5)"),
    ({"seed": "7"}, "seed", 'expected an integer, got a string ("7")'),
    ({"n": "2"}, "n", "expected an integer"),
    ({"top_k": False}, "top_k", "expected an integer, got a boolean (false)"),
    ({"temperature": "0"}, "temperature", 'expected a number, got a string ("0")'),
    ({"top_p": True}, "top_p", "expected a number, got a boolean (true)"),
    ({"stream": "false"}, "stream", "expected a boolean (true or false)"),
    ({"stream": 0}, "stream", "expected a boolean (true or false), got an integer (0)"),
    ({"ignore_eos": 1}, "ignore_eos", "expected a boolean"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "expected a boolean"),
    ({"logprobs": False}, "logprobs", "got a boolean (false); omit it for none"),
    ({"logprobs": True}, "logprobs", "got a boolean (true)"),
    ({"logprobs": "2"}, "logprobs", "expected an integer"),
    ({"stop": 5}, "stop", "expected a string or an array, got an integer (5)"),
    ({"model": 5}, "model", "expected a string"),
    ({"prompt": [1, True]}, "prompt.1", "got a boolean (true)"),
    ({"prompt": [[1, "2"]]}, "prompt.0.1", 'expected an integer, got a string ("2")'),
    ({"prompt": 5}, "prompt", "expected a string or an array, got an integer (5)"),
])
def test_loose_types_are_400_naming_the_parameter(server, extra, param, words):
    body = {"prompt": "x", "max_tokens": 2, **extra}
    err = _error(httpx.post(f"{server.url}/v1/completions", json=body, headers=JSON, timeout=30), 400)
    assert err["param"] == param and words in err["message"], err


def test_a_whole_number_written_as_a_float_is_that_integer(server):
    body = {"prompt": "x", "max_tokens": 4.0, "n": 1.0, "seed": 7.0, "top_k": 5e0, "temperature": 1,
            "ignore_eos": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=JSON, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    ids = httpx.post(f"{server.url}/v1/completions", json={"prompt": [5.0, 6.0], "max_tokens": 1}, headers=JSON)
    assert ids.status_code == 200 and ids.json()["usage"]["prompt_tokens"] == 2, ids.text


CHAT = [{"role": "user", "content": "import os"}]


@pytest.mark.parametrize("body,param,words", [
    ({"messages": [{"role": "user", "content": None}]}, "messages.0.content",
     "expected a string or an array, got null"),
    ({"messages": [{"role": "user"}]}, "messages.0.content", "is required"),
    ({"messages": [*CHAT, {"role": "assistant"}]}, "messages.1.content", "is required"),
    ({"messages": [{"role": "system", "content": None}, *CHAT]}, "messages.0.content", "got null"),
    ({"messages": [*CHAT, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]}]},
     "messages.1", "'tool_calls' is not supported"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "got an integer (5)"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "messages.0.content.0.text",
     "expected a string, got null"),
    ({"messages": CHAT, "logprobs": 1}, "logprobs", "expected a boolean (true or false), got an integer (1)"),
    ({"messages": CHAT, "top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
    ({"messages": CHAT, "max_completion_tokens": "8"}, "max_completion_tokens", "expected an integer"),
])
def test_chat_messages_need_content_and_strict_types(server, body, param, words):
    err = _error(httpx.post(f"{server.url}/v1/chat/completions", json={"max_tokens": 2, **body}, headers=JSON,
                            timeout=30), 400)
    assert err["param"] == param and words in err["message"], err


def test_chat_content_that_is_there_passes(server):
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": [{"type": "text", "text": "a"}]},
                {"role": "assistant", "content": "b", "tool_calls": None}, {"role": "user", "content": "c"}]
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, headers=JSON,
                   timeout=60)
    assert r.status_code == 200, r.text


# -- max_tokens: null is the default ------------------------------------------------------------
@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "import os\n"}),
    ("/v1/chat/completions", {"messages": CHAT}),
])
def test_max_tokens_null_means_omitted_the_default_of_16(server, path, body):
    for limit in ({}, {"max_tokens": None}, {"max_tokens": None, "max_completion_tokens": None}):
        r = httpx.post(f"{server.url}{path}", json={**body, **limit, "ignore_eos": True}, headers=JSON, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16, (limit, r.text)


def test_null_is_the_default_for_every_nullable_parameter(server):
    nulls = {"n": None, "temperature": None, "top_p": None, "top_k": None, "stream": None, "ignore_eos": None,
             "seed": None, "stop": None, "stream_options": None, "user": None, "model": None}
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2, "logprobs": None, **nulls},
                   headers=JSON, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 1 and r.json()["choices"][0]["logprobs"] is None
    chat = {"messages": CHAT, "max_tokens": 2, "logprobs": None, "top_logprobs": None, **nulls}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=chat, headers=JSON, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None, r.text


def test_the_default_over_the_room_the_prompt_leaves_is_400_saying_so(server):
    ids = [5] * (server.state.max_len - 8)  # leaves 8 tokens: fewer than the default 16
    err = _error(httpx.post(f"{server.url}/v1/completions", json={"prompt": ids, "max_tokens": None}, headers=JSON),
                 400)
    assert err["param"] == "max_tokens" and "max_tokens 16 (the default) is more than the 8 tokens" in err["message"]
    err = _error(httpx.post(f"{server.url}/v1/completions", json={"prompt": ids, "max_tokens": 9}, headers=JSON), 400)
    assert "max_tokens 9 is more than the 8 tokens" in err["message"] and "ask for at most 8" in err["message"]


# -- /health ------------------------------------------------------------------------------------
def test_health_has_two_states_and_the_document_says_so(server):
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    doc = httpx.get(f"{server.url}/openapi.json").json()
    assert doc["components"]["schemas"]["Health"]["properties"]["status"]["enum"] == ["ok", "unhealthy"]
    server.state.draining = True  # what the shutdown sets once the listening socket is closed
    try:
        r = httpx.get(f"{server.url}/health")
    finally:
        server.state.draining = False
    assert r.status_code == 503 and r.json() == {"status": "unhealthy", "reason": "the server is shutting down"}


def test_the_request_models_are_strict_in_the_document_too(server):
    """What /openapi.json says about the edges above (schemathesis's negative cases rely on it)."""
    schemas = httpx.get(f"{server.url}/openapi.json").json()["components"]["schemas"]
    assert schemas["ChatMessage"]["required"] == ["role", "content"]
    content = schemas["ChatMessage"]["properties"]["content"]["anyOf"]
    assert {"type": "null"} not in content
    completion = schemas["CompletionRequest"]["properties"]
    assert completion["max_tokens"]["anyOf"] == [{"minimum": 1, "type": "integer"}, {"type": "null"}]
    assert completion["logprobs"]["anyOf"][0] == {"maximum": 20, "minimum": 0, "type": "integer"}
    for name in ("n", "temperature", "top_p", "stream"):  # null is the default: nullable, as OpenAI's
        assert {"type": "null"} in completion[name]["anyOf"], name
    assert schemas["ChatRequest"]["properties"]["logprobs"]["anyOf"] == [{"type": "boolean"}, {"type": "null"}]
