"""The stream interval (serve/stream_interval.py): a running request's tokens reach the front end
every `interval` engine steps, as one chunk per choice; the first and the last token, and requests
with logprobs, at once. `moetune serve` chooses the interval at start and names it on its first line."""

import asyncio

from moetune.engine.engine import RequestOutput
from moetune.engine.sampling import TokenLogprobs
from moetune.serve.stream_interval import AUTO_INTERVAL, StreamHold, choose_interval
from moetune.serve.worker import Stream

from tests.serve.conftest import ServeProcess


def _stream(loop) -> Stream:
    return Stream([[1, 2, 3]], [None], loop)


def _step(hold: StreamHold, streams: list[Stream], t: float, finish: str | None = None, logprobs=None) -> dict:
    """One engine step with one token for each of `streams`; → {stream: the items handed over now}."""
    by_stream = {id(s): (s, [(0, RequestOutput(7, 42, "x", finish, logprobs), t)]) for s in streams}
    return {id(s): items for s, items in hold.due(by_stream).values()}


def test_tokens_are_held_for_the_interval_and_the_first_and_last_go_at_once():
    loop = asyncio.new_event_loop()
    try:
        a, b = _stream(loop), _stream(loop)
        hold = StreamHold(3)
        assert set(_step(hold, [a], 0.0)) == {id(a)}  # a's first token: at once
        assert _step(hold, [a, b], 1.0) == {id(b): [(0, RequestOutput(7, 42, "x", None, None), 1.0)]}  # b's first
        assert _step(hold, [a, b], 2.0) == {}
        got = _step(hold, [a, b], 3.0)  # a held steps 1, 2, 3: handed over together, each with its step time
        assert list(got) == [id(a)] and [t for _, _, t in got[id(a)]] == [1.0, 2.0, 3.0]
        got = _step(hold, [a, b], 4.0, finish="length")  # the last token: at once, with b's held ones
        assert [t for _, _, t in got[id(b)]] == [2.0, 3.0, 4.0] and [t for _, _, t in got[id(a)]] == [4.0]
    finally:
        loop.close()


def test_logprobs_a_silent_step_and_an_abort_do_not_keep_tokens_back():
    loop = asyncio.new_event_loop()
    try:
        a, b, c = _stream(loop), _stream(loop), _stream(loop)
        hold = StreamHold(8)
        _step(hold, [a, b, c], 0.0)
        assert set(_step(hold, [a], 1.0, logprobs=TokenLogprobs(-0.5, []))) == {id(a)}
        assert _step(hold, [b, c], 2.0) == {}
        hold.drop(c)  # c's request was aborted: its held token is dropped
        assert set(_step(hold, [a], 3.0)) == {id(b)}  # b had no token this step (preempted): what it held goes
    finally:
        loop.close()


def test_an_interval_of_one_hands_every_step_over():
    loop = asyncio.new_event_loop()
    try:
        a = _stream(loop)
        hold = StreamHold(1)
        assert all(set(_step(hold, [a], float(t))) == {id(a)} for t in range(4))
    finally:
        loop.close()


def test_the_interval_is_chosen_from_where_the_model_runs_and_the_cores_its_threads_take():
    assert choose_interval(4, "cpu", 2, 2) == (4, "set")
    assert choose_interval(None, "cpu", 2, 2)[0] == AUTO_INTERVAL > 1
    assert choose_interval(None, "cpu", 3, 4) == (1, "auto: the model's 3 threads leave 1 of 4 cores to the front end")
    assert choose_interval(None, "cuda", 4, 4) == (1, "auto: the model runs on cuda")


def test_serve_names_its_interval_and_a_held_stream_carries_the_same_text_as_one_answer():
    srv = ServeProcess("--max-num-seqs", "4")
    try:
        first = next(line for line in srv.lines if "http://" in line)
        assert f"stream interval: {AUTO_INTERVAL} steps (auto: the model's" in first  # CPU, threads = every core
        client, model = srv.client(), srv.client().models.list().data[0].id
        whole = client.completions.create(model=model, prompt="def parse(x):\n", max_tokens=40, temperature=0)
        chunks = list(client.completions.create(model=model, prompt="def parse(x):\n", max_tokens=40, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        texts = [ch.choices[0].text for ch in chunks if ch.choices]
        assert "".join(texts) == whole.choices[0].text
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 40
        assert len(texts) <= 2 + 40 // AUTO_INTERVAL + 1  # the first token, then one chunk per interval
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
        assert all(ch.choices[0].finish_reason is None for ch in chunks[:-2] if ch.choices)
        with_lp = [ch for ch in client.completions.create(model=model, prompt="def parse(x):\n", max_tokens=12,
                                                          temperature=0, logprobs=1, stream=True) if ch.choices]
        assert len(with_lp) == 12 and all(len(ch.choices[0].logprobs.tokens) == 1 for ch in with_lp)  # a chunk each
        assert whole.choices[0].text.startswith("".join(ch.choices[0].text for ch in with_lp))  # greedy: a prefix
    finally:
        assert srv.stop() == 0
