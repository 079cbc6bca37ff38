"""The fast simulator equals its reference twin: every schedule priced at once (cost/vector.py,
vector_price.py) with the compiled schedule and offload caches (schedule_fast.py, offload_fast.py)
against the per-step loop with `Replay` and `OffloadState` (`Simulator.reference`), on deployments
covering each pricing branch: one rank, EP with replicas of hot experts, two nodes with a mixed
precision, offloading with and without prefetch (lru, lfu), two-batch overlap, tensor parallelism,
speculative decoding, CUDA graphs, replicas of the deployment, fp8 dense / KV, per-call CPU pricing
with fitted multipliers; in a burst and in a closed loop. Tolerance: 1e-9 relative (float sums in
another order), every Metrics figure and every per-step array."""

import math
import numpy as np
import pytest

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.schedule import SimWorkload, simulate_schedule
from moetune.search.cost.schedule_fast import compiled_schedule
from moetune.search.cost.simulate import Simulator
from tests.search.test_estimates_unchanged import RECIPES, hardware_of, synthetic_source

REL = 1e-9
BURST = SimWorkload((37, 5, 64, 18, 90, 12, 3, 41, 7, 120, 33, 9), 6)
LOOP = SimWorkload(tuple(int(x) for x in np.random.default_rng(3).integers(4, 160, 96)), 9, mode="concurrency",
                   concurrency=24, warmup=8)
CASES = {  # the golden recipes (one rank, EP with replicas, two nodes int4, offload lfu, per-call CPU) and more
    **RECIPES,
    "offload-lru-tight": ("H200", Deployment(max_num_seqs=16, max_num_batched_tokens=512,
                                             offload_resident_fraction=0.25, offload_prefetch_depth=1)),
    "tbo-fp8-graphs": ("H200", Deployment(ep_size=4, redundant_experts=4, placement="round_robin", max_num_seqs=8,
                                          overlap=1, quant_low_format="fp8", dense_format="fp8", kv_format="fp8",
                                          cuda_graph_max_bs=4)),
    "tp2-etp2-replicas": ("H200", Deployment(ep_size=2, tp_size=2, expert_tp_size=2, replicas=2, max_num_seqs=8,
                                             cuda_graph_max_bs=0)),
    "speculative-ngram": ("H200", Deployment(ep_size=2, max_num_seqs=8, speculative="ngram:3")),
    "speculative-mtp-tbo": ("H200", Deployment(ep_size=2, max_num_seqs=8, speculative="mtp:2", overlap=1)),
}


def _simulator(hw: str, reference: bool) -> Simulator:
    multipliers = {"attention": 1.7, "experts/decode": 0.6, "other/prefill": 2.5} if hw == "cpu" else None
    src = synthetic_source(11, 170, 90).with_workload(BURST)  # short pools: the windows wrap
    sim = Simulator(src, hardware_of(hw), multipliers=multipliers)
    sim.reference, sim.spec_acceptance = reference, 0.6
    return sim


def _close(a, b, path="") -> list[str]:
    """Where two nested Metrics dicts differ beyond REL (names), empty when equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b)) for p in _close(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return [] if math.isclose(a, b, rel_tol=REL, abs_tol=1e-12) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.mark.parametrize("workload", [BURST, LOOP], ids=["burst", "closed-loop"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_vectorised_pricing_equals_the_per_step_loop(name, workload):
    hw, d = CASES[name]
    fast, ref = _simulator(hw, False), _simulator(hw, True)
    want, got = ref.evaluate(d, workload).as_dict(), fast.evaluate(d, workload).as_dict()
    assert _close(want, got) == [], name
    d = fast.stored(d)
    for sim in (fast, ref):
        sim.src = sim.src.with_workload(workload)
    step_r, phases_r, _ = ref._price(d, ref.schedule(d, workload), ref.prepare(d))
    step_f, phases_f, _ = fast._price(d, fast.schedule(d, workload), fast.prepare(d))
    np.testing.assert_allclose(step_f, step_r, rtol=REL, atol=1e-15)
    assert sorted(phases_f) == sorted(phases_r)
    for phase in phases_r:
        np.testing.assert_allclose(phases_f[phase], phases_r[phase], rtol=REL, atol=1e-15, err_msg=phase)


def test_the_cases_reach_each_branch():
    """The twins are compared where it matters: stalls, drafts, overlap, TP lines, two nodes are non-zero."""
    seen = {}
    for name, (hw, d) in CASES.items():
        sim = _simulator(hw, False)
        seen[name] = sim.evaluate(d, LOOP)
    assert seen["offload-prefetch-lfu"].detail["offload_stall_s"] > 0
    assert seen["offload-lru-tight"].detail["cache_hit_rate"] < 1
    assert seen["ep16-two-nodes-int4-hot"].detail["inter_node_bytes"] > 0
    assert seen["tbo-fp8-graphs"].phases_ms["decode"]["overlap_hidden"] > 0
    assert seen["tp2-etp2-replicas"].phases_ms["decode"]["tp_allreduce"] > 0
    assert "speculative" in seen["speculative-ngram"].detail
    assert seen["speculative-mtp-tbo"].detail["speculative"]["draft_s"] > 0


@pytest.mark.parametrize("ranks,seqs,tokens,chunked", [(1, 4, 64, True), (3, 2, 48, True), (4, 8, 256, False),
                                                       (2, 16, 32, True)])
def test_the_compiled_schedule_equals_replay(ranks, seqs, tokens, chunked):
    rng = np.random.default_rng(ranks * 100 + seqs)
    lens = tuple(int(x) for x in rng.integers(1, tokens if not chunked else 200, 57))
    for w in (SimWorkload(lens, 7), SimWorkload(lens, 3, mode="concurrency", concurrency=11),
              SimWorkload(lens, 1, mode="concurrency", concurrency=5),
              SimWorkload(lens, 3, mode="concurrency", concurrency=11, stagger=False),
              SimWorkload(lens, 40, mode="concurrency", concurrency=7, warmup=7, drain=False)):
        a, b = simulate_schedule(w, ranks, seqs, tokens, chunked), compiled_schedule(w, ranks, seqs, tokens, chunked)
        for field in ("prefill", "decode", "pairs", "context", "sampled", "seqs", "first_step", "last_step",
                      "arrive_step", "logits", "drafting"):
            np.testing.assert_array_equal(getattr(b, field), getattr(a, field), err_msg=field)


def test_a_schedule_that_cannot_progress_is_refused():
    """A prompt longer than the budget without chunked prefill never runs: both say so (Replay after its
    step guard, the compiled one at once)."""
    with pytest.raises(RuntimeError, match="did not finish"):
        compiled_schedule(SimWorkload((300,), 2), 1, 4, 256, False)


class _PathFactors:
    """A calibration as the pricing reads it (not from microbenchmarks: no path timed on its own): a
    factor per step kind and path (1 fused, 2 unfused)."""

    source = "trace"

    def path_factor(self, kind: str, path: int) -> float:
        return {"prefill": 1.3, "decode": 0.8}[kind] * (1.0 if path == 1 else 1.7)  # path: 1 fused, 2 not


@pytest.mark.parametrize("d", [Deployment(max_num_seqs=16, quant_low_format="int8"),
                               Deployment(ep_size=2, max_num_seqs=8, capacity_policy="none")], ids=["fused", "ep2"])
def test_calibrated_path_factors_scale_both_alike(d):
    sims = [_simulator("cpu", reference) for reference in (True, False)]
    for sim in sims:
        sim.cal = _PathFactors()
    want, got = (sim.evaluate(d, LOOP).as_dict() for sim in sims)
    assert _close(want, got) == []
    assert want["phases_ms"]["decode"]["step"] != _simulator("cpu", True).evaluate(d, LOOP).phases_ms["decode"]["step"]
