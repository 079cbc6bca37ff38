"""Speculative decoding through a real `moetune serve`: 16 concurrent greedy requests (some
streamed) to a server running `engine.speculative: ngram:4`, or `mtp:1` (the bundled model's
trained MTP head), get the text each request gets alone from a server decoding plainly, while the
speculative engine really accepted drafts; /metrics shows acceptance and the experts read."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from moetune.engine.speculative.mtp import MTPSpeculator
from moetune.model.registry import bundled_asset
from tests.serve.conftest import start_server


@pytest.fixture(scope="module", params=["ngram:4", "mtp:1"])
def speculative_server(request):
    running, stop = start_server({"engine": {"max_num_seqs": 16, "max_num_batched_tokens": 256,
                                             "speculative": request.param}})
    yield running
    stop()


def _prompts(n: int) -> list[str]:
    lines = bundled_asset("prompts/stdlib-heldout.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"][:300] for line in lines[:n]]


def _ask(running, prompt: str, stream: bool) -> str:
    client = running.client()
    if not stream:
        return client.completions.create(model=running.model, prompt=prompt, max_tokens=40, temperature=0).choices[0].text
    pieces = client.completions.create(model=running.model, prompt=prompt, max_tokens=40, temperature=0, stream=True)
    return "".join(c.choices[0].text for c in pieces)


def test_sixteen_concurrent_speculative_requests_equal_each_alone_without_it(server, speculative_server):
    prompts = _prompts(16)
    alone = [_ask(server, p, False) for p in prompts]  # the session's server: no speculation
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda ip: _ask(speculative_server, ip[1], ip[0] % 2 == 1), enumerate(prompts)))
    assert together == alone
    stats = speculative_server.state.generator.engine.stats
    assert stats.accepted_tokens > 0 and stats.verify_steps > 0


def _gauges(text: str) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("moetune_spec_")}


def test_metrics_show_acceptance_and_the_experts_a_verify_step_wakes(speculative_server):
    import httpx

    client = speculative_server.client()
    client.completions.create(model=speculative_server.model, prompt=_prompts(1)[0], max_tokens=32, temperature=0)
    g = _gauges(httpx.get(f"{speculative_server.url}/metrics").text)
    assert g["moetune_spec_draft_tokens"] >= g["moetune_spec_accepted_tokens"] > 0
    assert 0 < g["moetune_spec_acceptance_rate"] <= 1 and g["moetune_spec_tokens_per_verify"] > 1
    K = speculative_server.state.generator.model.spec.moe.router.top_k
    assert g["moetune_spec_experts_per_layer_verify"] >= g["moetune_spec_experts_per_layer_plain"] >= K
    mtp = isinstance(speculative_server.state.generator.engine.speculator, MTPSpeculator)  # its MoE block reads
    assert (g["moetune_spec_draft_experts_per_verify"] >= K) if mtp else g["moetune_spec_draft_experts_per_verify"] == 0
