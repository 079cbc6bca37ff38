"""Per-tenant expert QoS: a capped tenant's decodes are held back when its predicted routing would
take more than its share of an expert's capacity; other tenants are not; tokens do not change."""

import pytest

from moetune.config import RunConfig
from moetune.engine.sampling import SamplingParams
from moetune.serve.expert_load import ExpertLoadWindow
from moetune.serve.qos import ExpertQoS
from tests.serve.conftest import start_server


@pytest.fixture(scope="module")
def generator():
    from moetune.engine.build import build_generator

    return build_generator(RunConfig.model_validate({"model": {"device": "cpu"}}))


PROMPTS = ["import os\n", "def main():\n", "class A:\n", "x = [", "for i in range(", "with open(", "try:\n", "@property\n"]


def _run(generator, qos, tenant_of):
    engine, model = generator.engine, generator.model
    window = ExpertLoadWindow(model, 8)
    model.attach_probe(window)
    engine.scheduler.policy = qos
    try:
        rids = [engine.add_request(generator.encode(p), SamplingParams(max_tokens=12, ignore_eos=True)) for p in PROMPTS]
        if qos is not None:
            for i, rid in enumerate(rids):
                qos.track(rid, tenant_of(i))
        tokens = {rid: [] for rid in rids}
        steps = 0
        while engine.has_unfinished():
            window.begin_step()
            for out in engine.step():
                tokens[out.request_id].append(out.new_token)
            if qos is not None:
                qos.routed(window.last_ids)
            steps += 1
        return [tokens[r] for r in rids], steps
    finally:
        model.attach_probe(None)
        engine.scheduler.policy = None


def test_a_capped_tenant_is_held_back_and_tokens_stay_the_same(generator):
    spec = generator.model.spec
    free, free_steps = _run(generator, None, None)
    deferred = []
    qos = ExpertQoS({"capped": 0.1}, len(spec.moe_layers), spec.moe.num_experts, spec.moe.router.top_k,
                    on_defer=deferred.append)
    capped, capped_steps = _run(generator, qos, lambda i: "capped" if i < 6 else "other")
    assert capped == free  # held back, never changed
    assert deferred and set(deferred) == {"capped"} and capped_steps > free_steps
    assert not qos.tenant_of or all(t == "capped" for t in qos.tenant_of.values())


def test_a_server_tenant_with_an_expert_share(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    running, stop = start_server({"engine": {"max_num_seqs": 16},
                                  "serve": {"tenants": {"capped": {"expert_share": 0.1}}}}, api_key=None)
    try:
        plain = running.client(api_key="x")
        capped = running.client(api_key="x", default_headers={"X-Tenant": "capped"})

        def ask(client, p):
            return client.completions.create(model=running.model, prompt=p, max_tokens=10, temperature=0).choices[0].text

        alone = [ask(plain, p) for p in PROMPTS]
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda p: ask(capped, p), PROMPTS))
        assert together == alone
        metrics = httpx.get(f"{running.url}/metrics").text
        line = [l for l in metrics.splitlines() if l.startswith('moetune_qos_deferred_decodes_total{tenant="capped"}')]
        assert line and float(line[0].split()[-1]) > 0
        assert not running.state.worker.qos.tenant_of  # forgotten once finished
    finally:
        stop()
