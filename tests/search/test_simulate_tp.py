"""The simulator prices tensor parallelism as the engine runs it: one rank's shapes (heads, KV heads,
dense / expert intermediate and vocab split), plus exactly the collectives of docs/architecture.md
§3d, each on its own phase line; on this-machine the all-reduce latency is measured among real
gloo ranks."""

from pathlib import Path

import numpy as np
import pytest

from moetune.config import parse_config
from moetune.search.cost import tp as tp_costs
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simmodel import SimModel
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.source import TraceSource
from moetune.search.study.space import from_config

H200 = BUILTIN["H200"]


def source() -> TraceSource:
    rng = np.random.default_rng(3)
    E, K, Lm = 8, 2, 2
    model = SimModel("tp", D=512, E=E, K=K, I=1024, I_shared=512, L=3, moe_layers=(1, 2), dense_I=(2048,), V=8192,
                     attn_weights=512 * 4 * 512, kv_elems=2 * 4 * 64, pair_flops=4 * 8 * 64, tied=False, kv_heads=4)
    rows = lambda n: rng.integers(0, E, (n, Lm, K)).astype(np.int32)  # noqa: E731
    prefill, decode = rows(200), rows(100)
    loads = np.stack([np.bincount(prefill[:, j].ravel(), minlength=E) for j in range(Lm)]).astype(np.float64)
    return TraceSource(Path("tp"), model, prefill, decode, loads, SimWorkload((40, 7, 64, 12), 6), batch_size=4,
                       recorded_on="cpu", model_path=None)


def priced(d: Deployment, hw=H200):
    sim = Simulator(source(), hw)
    sched = sim.schedule(d, sim.src.workload)
    step_s, phases, _ = sim._price(d, sched, sim.prepare(d))
    return sim, sched, step_s, phases


def test_one_ranks_shapes():
    m = source().model
    local = tp_costs.tp_model(m, Deployment(tp_size=2, expert_tp_size=2))
    assert (local.attn_weights, local.pair_flops, local.kv_elems) == (m.attn_weights // 2, m.pair_flops // 2,
                                                                     m.kv_elems // 2)
    assert (local.I, local.I_shared, local.dense_I, local.V) == (512, 256, (1024,), 4096)
    assert local.E == m.E and local.D == m.D  # routers and the hidden size stay whole
    assert tp_costs.tp_model(m, Deployment(tp_size=8)).kv_elems == m.kv_elems // 4  # 4 KV heads: one per rank
    mla = SimModel("mla", 512, 8, 2, 1024, 0, 3, (1, 2), (2048,), 8192, 1000, 576, 4000, False, kv_heads=0)
    assert tp_costs.tp_model(mla, Deployment(tp_size=2)).kv_elems == 576  # the latent cache is whole per rank
    assert tp_costs.tp_model(m, Deployment(expert_tp_size=2)).attn_weights == m.attn_weights


def test_each_step_pays_the_engines_collectives():
    """tp 2 × expert tp 2: per step L attention all-reduces + 1 dense + Lm MoE ones of [T, D], one
    embedding all-reduce and the logits' gather, each priced by the ring formula of tp.py."""
    d = Deployment(max_num_seqs=4, tp_size=2, expert_tp_size=2)
    sim, sched, step_s, phases = priced(d)
    _, _, step_1, phases_1 = priced(Deployment(max_num_seqs=4))
    m, b, bw, lat = sim.src.model, sim.b, H200.intra_bw * H200.link_eff, H200.intra_latency_s
    for t in range(sched.num_steps):
        T, S = float(sched.prefill[t].max() + sched.decode[t].max()), float(sched.sampled[t].max())
        one = 2 * (2 - 1) / 2 * T * m.D * b / bw + lat
        assert phases["tp_allreduce"][t] == pytest.approx((3 + 1 + 2) * one)
        assert phases["tp_embed"][t] == pytest.approx(one)
        assert phases["tp_gather"][t] == pytest.approx((S * m.V * b / 2 / bw + lat) if S else 0.0)
    assert "tp_allreduce" not in phases_1  # no TP lines where TP does not run
    assert (phases["attention"] <= phases_1["attention"]).all() and phases["attention"].sum() < phases_1["attention"].sum()
    assert (phases["experts"] <= phases_1["experts"]).all()
    collective = sum(phases[p] for p in tp_costs.TP_PHASES)
    assert (step_s >= collective).all()


def test_a_whole_projection_qk_norm_adds_its_sums_all_reduce_per_layer():
    """olmoe under tp_size 2: L more all-reduces of the [T, 2] fp32 sums of squares (model/tp_norm.py)."""
    import dataclasses

    m = source().model
    d = Deployment(tp_size=2, expert_tp_size=2)
    plain = tp_costs.tp_collectives(m, d, 64, 4, 1e9, 1e-5, 4)
    normed = tp_costs.tp_collectives(dataclasses.replace(m, whole_qk_norm=True), d, 64, 4, 1e9, 1e-5, 4)
    assert normed["tp_allreduce"] - plain["tp_allreduce"] == pytest.approx(m.L * (64 * 2 * 4 / 1e9 + 1e-5))
    assert (normed["tp_embed"], normed["tp_gather"]) == (plain["tp_embed"], plain["tp_gather"])
    expert_only = Deployment(expert_tp_size=2)  # attention whole: no split norm
    assert tp_costs.tp_collectives(dataclasses.replace(m, whole_qk_norm=True), expert_only, 64, 4, 1e9, 1e-5, 4) == \
        tp_costs.tp_collectives(m, expert_only, 64, 4, 1e9, 1e-5, 4)


def test_memory_per_rank_shrinks():
    sim = Simulator(source(), H200)
    assert sim.memory(Deployment(tp_size=2, expert_tp_size=2)).total < sim.memory(Deployment()).total


def test_a_recipes_tp_sizes_reach_the_deployment():
    cfg = parse_config({"parallel": {"ep_size": 2, "tp_size": 2}})
    d = from_config(cfg)
    assert (d.ep_size, d.tp_size, d.expert_tp_size) == (2, 2, 2) and "TP=2/eTP=2" in d.label()


def test_this_machine_measures_the_allreduce_among_gloo_ranks():
    lat = tp_costs.allreduce_latency(2, rounds=20)
    assert 0 < lat < 0.5
