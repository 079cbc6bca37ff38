"""The HTTP half of docs/bad-input.md: each bad request `moetune serve` answers, the answer, and
the test (tests/serve/) that checks it through a real server. Appended by
tests/cli/write_bad_input_doc.py; the messages are the server's own (check them with curl)."""

SECTION = """
## Bad requests: what `moetune serve` answers

Every row is checked through a real server (uvicorn in the test process, or `moetune serve` as a
subprocess) by the test named. Errors are OpenAI error objects
`{"error": {"message", "type", "param", "code"}}`; nothing of one bad request reaches another
request, and none leaves a traceback in the log.

| # | case | example | status | message / behaviour | test |
|---|---|---|---|---|---|
| H1 | lone surrogate in a prompt | `{"prompt": "abc\\ud800def"}` | 400 | the request body holds a lone UTF-16 surrogate (\\ud800) in a string; send valid Unicode text | test_bad_http |
| H2 | lone surrogate in chat content (string or part) | `{"messages": [{"role": "user", "content": "abc\\udfffdef"}]}` | 400 | the request body holds a lone UTF-16 surrogate (\\udfff) in a string; send valid Unicode text | test_bad_http |
| H3 | nesting deeper than 32 | `{"prompt": [[[[…]]]]}` 30,000 deep | 400 | the request body nests deeper than 32 levels of arrays/objects | test_bad_http |
| H4 | an integer over 40 digits | `"max_tokens": 1000…0` (5,000 digits) | 400 | the request body holds an integer of 5001 digits; integers are limited to 40 digits | test_bad_http |
| H5 | seed outside [0, 2^63 − 1] | `"seed": 18446744073709551616` or `-1` | 400 | 'seed': must be in [0, 2^63 - 1 = 9223372036854775807], got 18446744073709551616 | test_fault_isolation, test_bad_http |
| H6 | seed + choice index over 2^63 − 1 | `"seed": 9223372036854775807, "n": 2` | 400 | 'seed': with 2 choices (choice i uses seed + i) the seed must be in [0, 2^63 - 1 - 1 = 9223372036854775806] | test_fault_isolation |
| H7 | temperature or top_p NaN / inf | `"temperature": NaN` | 400 | 'temperature': Input should be a finite number | test_bad_http |
| H8 | tiny but valid temperature / top_p | `"temperature": 1e-300`, `"top_p": 1e-300` | 200 | sampled safely (max-shifted logits, temperature held at ≥ 1e-30; top-p keeps the top token): the greedy tokens | test_fault_isolation |
| H9 | parameters out of range | `"temperature": 5`, `"max_tokens": 0`, `"n": 0`, `"top_p": 0`, `"logprobs": 99`, `"stop": [""]` | 400 | '<param>': Input should be … (param named) | test_errors |
| H10 | unsupported parameters | `"logit_bias": {"5": 10}` | 400 | 'logit_bias' is not supported by moetune serve | test_errors |
| H11 | body not JSON / not an object / missing prompt | `{not json`, `[1, 2]` | 400 | the request body is not valid JSON / must be a JSON object / 'prompt' is required | test_errors |
| H12 | prompt over the context | `"prompt": [5, …]` 3,000 ids | 400 | the prompt has 3000 tokens but the context is 2048; shorten the prompt | test_errors |
| H12b | max_tokens over what the context leaves | `"prompt": [5, 6, 7], "max_tokens": 99999` | 400 | max_tokens 99999 is more than the 2,045 tokens the context of 2,048 leaves after this 3-token prompt; ask for at most 2,045 — never cut silently | test_errors |
| H13 | unknown model | `"model": "gpt-4"` | 404 | the model 'gpt-4' does not exist; this server serves 'stdlib-moe' | test_errors |
| H14 | body over serve.max_body_bytes | 70 KiB prompt on a 64 KiB limit | 413 | the request body is over the server's limit of 65536 bytes | test_errors |
| H15 | missing or wrong API key | no `Authorization`, `Basic …` | 401 | missing or invalid API key; send 'Authorization: Bearer <key>' | test_errors |
| H16 | request head over 16 KiB | a 1 MB header | 431 | the request line and headers are over the server's limit of 16384 bytes (answered, then the connection lingers: no reset) | test_bad_http |
| H16b | a head over 16 KiB in any shape | 10,000 small headers (~120 KB), a 100 KB request line, either in one write or in 1 KB pieces | 431 | the request line and headers are over the server's limit of 16384 bytes (431, not 414: the limit is on the whole head) | test_heads |
| H16c | a request head not completed in time | half a head, then nothing (or a connection that sends nothing) | 408, closed | the request head was not completed within 10 s (serve.head_timeout_s) | test_heads |
| H16d | many slow heads from one address | 600 sockets each holding half a head | 408 at once beyond serve.slow_heads_per_client (256) heads incomplete for over 1 s; the rest at the timeout | too many slow request heads from 127.0.0.1 (at most 256 may take over 1 s); send the head at once — other requests, from that address too, are answered meanwhile | test_heads |
| H16e | two Authorization headers | `Authorization: Bearer <key>` twice, or a good and a bad one | 400 | 2 Authorization headers; send exactly one ('Authorization: Bearer <key>') | test_heads |
| H17 | more sequences than the server holds / at capacity | `"n": 3` × 2 prompts on capacity 4; a burst | 400 / 429 + Retry-After | the request asks for 6 sequences but the server holds at most 4 … / the server is at capacity … | test_overload |
| H18 | client leaves during its upload | `Content-Length: 60000` (under the 64 KiB limit), 500 bytes sent | — | nothing answered (counted as 499), nothing logged (no ClientDisconnect traceback) | test_bad_http |
| H19 | non-streaming client resets mid-generation | two 1,500-token requests, RST | — | aborted within ≤ 3 engine steps; KV blocks back to the baseline; `moetune_aborted_sequences_total{reason="client_gone"}` | test_bad_http |
| H20 | streaming client leaves mid-stream | closes after 3 chunks | — | aborted; KV blocks freed | test_overload |
| H21 | a sequence whose sampling fails | (a NaN temperature injected past the edge) | 500 | internal error generating choice 0: sampling failed: RuntimeError: … — four concurrent streams finish identical to their solo output | test_fault_isolation |
| H22 | an engine step that fails | (an injected scheduler error) | 500 | internal error in the engine step (RuntimeError); the engine was reset — the next request succeeds | test_fault_isolation |
| H23 | an engine that cannot step any more | (the KV pool removed) | 500, then 503 | `/health` 503 `{"status": "unhealthy", "reason": …}`, `moetune_engine_healthy 0`, later requests 503 at once; `moetune serve` exits 1 | test_fault_isolation |
| H24 | SIGTERM past serve.drain_timeout_s | four 1,500-token requests, drain 1 s | 503 / SSE error event + `[DONE]` | the server is shutting down (serve.drain_timeout_s=1s ran out); exit 0, no traceback | test_sigterm |
| H24b | a second SIGTERM or Ctrl-C while draining | three 1,500-token requests, the default 30 s drain | 503 / SSE error event + `[DONE]` | the server is shutting down at once (a second stop signal); exit 0 within seconds, no traceback | test_sigterm |
| H25 | any request, as the OpenAPI document allows or not | schemathesis, 528 cases, positive and negative | never 5xx | every answer matches `/openapi.json` (body, status, content type); every request the schema rejects gets a 4xx | test_openapi |
| H26 | a surrogate as raw UTF-8 bytes (ED A0 80) in any string: prompt, chat content, stop, user, dump name | `{"prompt": "abc<ED A0 80>def"}` | 400 | the request body holds a UTF-16 surrogate (U+D800) encoded as UTF-8 bytes at byte 15; JSON bodies must be valid UTF-8 text | test_request_edges |
| H27 | bytes that are not UTF-8 | `{"prompt": "caf<E9>"}` (Latin-1) | 400 | the request body holds the byte 0xE9, which is not valid UTF-8, at byte 15; JSON bodies must be valid UTF-8 text (a leading byte-order mark is dropped) | test_request_edges |
| H28 | a POST body that is not JSON: a browser's "simple" request | `text/plain`, form-encoded, multipart, XML, no Content-Type, `charset=latin-1`, two Content-Type headers | 415 | the request body must be JSON: 'Content-Type: application/json', got 'text/plain' (after the API key check: 401 first) | test_request_edges |
| H29 | a POST without a body from a page elsewhere | `POST /v1/expert_distribution/stop`, `Origin: https://evil.example` | 415 | a POST from another origin (https://evil.example) must send 'Content-Type: application/json' (this server answers no CORS preflight); without Origin, or from the same host, it passes (`curl -X POST`) | test_request_edges |
| H30 | loose types | `"max_tokens": "4"`, `true`, `4.5`; `"seed": "7"`; `"stream": "true"`; `"prompt": [1, true]` | 400 | 'max_tokens': expected an integer, got a string ("4") — a whole number written as a float (`4.0`) is that integer, as JSON Schema and vLLM read it | test_request_edges, test_openapi |
| H31 | completions `logprobs: false` | `"logprobs": false` | 400 | 'logprobs': expected an integer (how many top log-probabilities to return, 0-20) or null, got a boolean (false); omit it for none — not 0 | test_request_edges |
| H32 | chat message without content | `{"role": "user", "content": null}`, `{"role": "assistant"}`, `"tool_calls": […]` | 400 | 'messages.0.content': expected a string or an array, got null / 'messages.1.content' is required / 'messages.1': 'tool_calls' is not supported by moetune serve (no tool calling) | test_request_edges |
| H33 | chat `top_logprobs` without `logprobs` | `"top_logprobs": 2` | 400 | 'top_logprobs': needs 'logprobs': true (without it no log-probabilities are returned) | test_request_edges |
| H34 | `null` for a parameter | `"max_tokens": null`, `"n": null`, `"temperature": null`, `"stream": null`, chat `"logprobs": null` | 200 | the default, as if omitted (OpenAI documents these as nullable): 16 tokens (completions and chat); the default over what the context leaves: 400 "max_tokens 16 (the default) is more than the 8 tokens …" | test_request_edges |
"""
