"""The simulator's estimates stay bit-identical across refactors of the cost model: a few recipes on a
seeded synthetic trace (one process, EP with replicas on two nodes, mixed precision, offloading with
prefetch, the per-call CPU path with fitted multipliers) priced step by step, compared with the
figures recorded before the change (`estimates_golden.json`: every Metrics field exactly, and a
SHA-256 of every per-step array). A change that means to move the estimates rewrites that file:

    python -m tests.search.test_estimates_unchanged
"""

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simmodel import SimModel
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.step_totals import PHASES
from moetune.search.cost.source import TraceSource

GOLDEN = Path(__file__).with_name("estimates_golden.json")
RECIPES = {
    "one-rank": ("H200", Deployment(max_num_seqs=8)),
    "ep4-eplb-replicas": ("H200", Deployment(ep_size=4, redundant_experts=4, placement="eplb", max_num_seqs=4)),
    "ep16-two-nodes-int4-hot": ("2xH200", Deployment(ep_size=16, placement="round_robin", max_num_seqs=2,
                                                     quant_low_format="int4", quant_hot_fraction=0.25)),
    "offload-prefetch-lfu": ("H200", Deployment(ep_size=2, max_num_seqs=4, max_num_batched_tokens=256,
                                                offload_resident_fraction=0.5, offload_prefetch_depth=2,
                                                offload_eviction="lfu")),
    "cpu-calls-fitted": ("cpu", Deployment(max_num_seqs=16, quant_low_format="int8")),
}


def synthetic_source(seed: int = 7, n_prefill: int = 300, n_decode: int = 200) -> TraceSource:
    """A seeded synthetic trace: 3 MoE layers of 16 experts (top-2) with per-layer skew, one dense layer."""
    rng = np.random.default_rng(seed)
    E, K, Lm = 16, 2, 3
    model = SimModel("golden", D=256, E=E, K=K, I=512, I_shared=256, L=4, moe_layers=(1, 2, 3), dense_I=(1024,),
                     V=4096, attn_weights=256 * 4 * 256, kv_elems=2 * 2 * 64, pair_flops=4 * 4 * 64, tied=False)
    skew = rng.dirichlet(np.full(E, 0.4), size=Lm)  # [Lm, E] per-layer skew

    def rows(n):  # [n, Lm, K] distinct experts per token
        return np.stack([np.stack([rng.choice(E, K, replace=False, p=skew[j]) for j in range(Lm)])
                         for _ in range(n)]).astype(np.int32)

    prefill, decode = rows(n_prefill), rows(n_decode)
    loads = np.stack([np.bincount(np.concatenate([prefill[:, j], decode[:, j]]).ravel(), minlength=E)
                      for j in range(Lm)]).astype(np.float64)
    return TraceSource(Path("golden"), model, prefill, decode, loads, SimWorkload((37, 5, 64, 18, 90, 12, 3, 41), 6),
                       batch_size=8, recorded_on="cpu", model_path=None)


def hardware_of(name: str):
    if name == "2xH200":
        return BUILTIN["H200"].with_nodes(2)
    if name == "cpu":  # per-call pricing (no grouped kernels), as on this-machine, without its microbenchmarks
        return replace(BUILTIN["H200"], name="cpu-like", grouped_experts=False, act_bytes=4, op_overhead_s=9e-6)
    return BUILTIN[name]


def estimates() -> dict:
    src, out = synthetic_source(), {}
    for name, (hw, d) in RECIPES.items():
        multipliers = {"attention": 1.7, "experts/decode": 0.6, "other/prefill": 2.5} if hw == "cpu" else None
        sim = Simulator(src, hardware_of(hw), multipliers=multipliers)
        sim.reference = True  # the per-step loop (the vectorised pricing equals it within rounding: test_vector_price)
        sched = sim.schedule(d, src.workload)
        step_s, phases, _ = sim._price(d, sched, sim.prepare(d))
        arrays = np.concatenate([step_s] + [phases[p] for p in PHASES])
        out[name] = {"metrics": sim.evaluate(d).as_dict(), "steps": int(sched.num_steps),
                     "per_step_sha256": hashlib.sha256(arrays.tobytes()).hexdigest()}
    return json.loads(json.dumps(out))  # the same types as read back from the file


def test_estimates_are_the_recorded_ones():
    """Every figure recorded is unchanged; a Metrics field added since (the burst's latency percentiles,
    request rate, goodput, workload label; detail's routing, stored weights and CUDA-graph memory) is an
    addition, not a change, and is checked by its own tests."""
    golden = json.loads(GOLDEN.read_text())
    now = estimates()
    assert sorted(now) == sorted(golden)
    added = {"workload", "latency_ms", "request_s", "goodput_rps", "replicas", "output_tok_s_per_gpu"}
    for name in golden:
        metrics = now[name]["metrics"]
        assert set(metrics) - set(golden[name]["metrics"]) <= added, name
        assert metrics["workload"].startswith("burst"), name
        kept = {k: v for k, v in metrics.items() if k in golden[name]["metrics"]}  # the recorded ones
        detail = kept["detail"]  # detail figures added since: which routing, the stored weights, graph memory
        assert detail.pop("routing") == "trace" and detail.pop("stored_weights") == "none", name
        assert detail["memory"].pop("graphs") == 0.0, name  # no CUDA graphs priced in these recipes
        assert {**now[name], "metrics": kept} == golden[name], name


def test_the_recipes_cover_every_pricing_branch():
    for name, entry in json.loads(GOLDEN.read_text()).items():
        assert entry["steps"] > 3, name
    golden = json.loads(GOLDEN.read_text())
    assert golden["ep16-two-nodes-int4-hot"]["metrics"]["detail"]["inter_node_bytes"] > 0
    assert golden["offload-prefetch-lfu"]["metrics"]["detail"]["offload_stall_s"] > 0
    assert 0 < golden["ep16-two-nodes-int4-hot"]["metrics"]["detail"]["low_precision_share"] < 1
    assert golden["one-rank"]["metrics"]["detail"]["a2a_bytes"] == 0
    assert {"prefill", "decode"} <= set(golden["cpu-calls-fitted"]["metrics"]["phases_ms"])


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(estimates(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


def test_the_prefix_counts_and_the_per_step_bincount_give_the_same_estimates(monkeypatch):
    """The trace's copies per expert come from prefix sums where they fit, else from a bincount of each
    step's rows: both are the same integers, so the estimates are the same bits."""
    import moetune.search.cost.trace_rows as trace_rows

    fast = estimates()
    monkeypatch.setattr(trace_rows, "PREFIX_ELEMS", 0)  # every pool over the budget: the bincount path
    assert estimates() == fast
