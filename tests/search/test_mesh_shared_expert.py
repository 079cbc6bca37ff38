"""The shared expert on a general mesh (search/cost/mesh.py): on the rows and weight split each engine gives
it, and — with the measured tables bound — beside the routed path in the steps the engine runs it on a second
stream, as the legacy meshes price it (phase_costs.shared_beside_experts: max(routed, shared − dispatch −
combine) per layer and rank; phase_costs.second_stream: which steps).

DeepSeek-V3 on 8×H200 with attention DP 8 × experts TP 8 added the shared expert serially on all 128
gathered rows at I_shared / 8: 9.8 ms of a 40.0 ms decode step where AIConfigurator's was 31.0
(docs/search.md). vLLM runs it in SharedFusedMoE on the DP rank's own input, before the DP dispatch, TP-split
over the rank's attention TP group like a dense MLP (`shared_experts_input` in its MoE runner; the
MLP whole under sequence-parallel MoE); SGLang's DP attention gathers every rank's rows before the MLP and
TP-splits it over all GPUs (its shared MLP at tp_size 1 only under DeepEP and the other all-to-all backends).
"""

import json
from dataclasses import replace

import numpy as np
import pytest

from moetune.search.cost import op_tables, phase_costs
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.mesh import shared_split
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.source import load_source

H200 = BUILTIN["H200"]
DP8_TP8 = Deployment(attn_dp=8, tp_size=1, ep_size=1, expert_tp_size=8, moe_a2a=0, max_num_seqs=16)
TABLES = pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")


@pytest.fixture(scope="module")
def ds_sim(run_dir, big_config):
    """A simulator on DeepSeek-V3's shapes (6 layers, 5 MoE; I_shared 2,048) over H200s; tables unbound."""
    def make(tables=None, drop_shared=False):
        src = load_source(run_dir, str(big_config))
        if drop_shared:
            src = replace(src, model=replace(src.model, I_shared=0))
        sim = Simulator(src, H200)
        sim.tables = tables
        return sim
    return make


def test_the_shared_expert_takes_the_second_stream_where_each_engine_does():
    """vLLM: steps of at most 256 shared-expert rows a GPU (VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD); SGLang:
    CUDA-graph steps, or every step under DeepEP."""
    rows, graph = np.array([1.0, 256.0, 257.0, 4096.0]), np.array([True, True, False, False])
    assert list(phase_costs.second_stream("vllm", rows, graph, False)) == [True, True, False, False]
    assert list(phase_costs.second_stream("vllm", rows, ~graph, True)) == [True, True, False, False]
    assert list(phase_costs.second_stream("sglang", rows, graph, False)) == [True, True, False, False]
    assert list(phase_costs.second_stream("sglang", rows, ~graph, False)) == [False, False, True, True]
    assert phase_costs.second_stream("sglang", rows, ~graph, True).all()


def test_each_engine_runs_the_shared_expert_on_its_own_rows_and_split():
    """[S, a] group rows → ([S] rows per GPU, the shared MLP's TP split), from the engines' code paths."""
    T = np.array([[16.0] * 8, [20.0, 4.0, 16.0, 16.0, 16.0, 16.0, 16.0, 16.0]])  # two steps, 8 DP groups
    rows, split = shared_split(DP8_TP8, "vllm", T)
    assert split == 1 and list(rows) == [16.0, 20.0]  # the group's own rows, the whole 2,048 (t = 1)
    rows, split = shared_split(DP8_TP8, "sglang", T)
    assert split == 8 and list(rows) == [128.0, 120.0]  # every group's rows, 2,048 / 8 = 256 a GPU
    dp2_tp4 = Deployment(attn_dp=2, tp_size=4, ep_size=1, expert_tp_size=8, moe_a2a=0)
    T2 = np.array([[40.0, 24.0]])
    assert (list(shared_split(dp2_tp4, "vllm", T2)[0]), shared_split(dp2_tp4, "vllm", T2)[1]) == ([40.0], 4)
    sp = Deployment(attn_dp=2, tp_size=4, ep_size=8, expert_tp_size=1, moe_a2a=0)  # vLLM's sequence-parallel MoE
    assert (list(shared_split(sp, "vllm", T2)[0]), shared_split(sp, "vllm", T2)[1]) == ([10.0], 1)
    assert shared_split(sp, "sglang", T2)[1] == 8
    a2a = Deployment(attn_dp=2, tp_size=4, ep_size=8, expert_tp_size=1, moe_a2a=1)  # DeepEP: T_i / t rows, whole
    for engine in ("vllm", "sglang"):
        rows, split = shared_split(a2a, engine, T2)
        assert split == 1 and list(rows) == [10.0]


def test_a_dp_groups_gpu_runs_the_shared_expert_as_a_one_gpu_replica_of_that_group(ds_sim):
    """On the roofline (the shared expert serial): vLLM's DP-8 × TP-8 mesh at 16 sequences a group prices each
    decode step's shared expert as one GPU serving those 16 sequences (the whole MLP on 16 rows); SGLang's as
    the TP-8 mesh on all 128 rows (its MLP / 8). The old pricing (128 rows at / 8) read 1/8 of the weights."""
    burst = SimWorkload((64,) * 128, 8)
    mesh = ds_sim().evaluate(DP8_TP8, burst).phases_ms["decode"]["shared_expert"]
    one = ds_sim().evaluate(Deployment(max_num_seqs=16), SimWorkload((64,) * 16, 8)).phases_ms["decode"]
    assert mesh > 0 and mesh == pytest.approx(one["shared_expert"], rel=1e-9)
    sglang = ds_sim(op_tables.TableChoice("sglang", None, None, "roofline")).evaluate(DP8_TP8, burst)
    tp8 = ds_sim().evaluate(Deployment(tp_size=8, expert_tp_size=8, max_num_seqs=128), burst).phases_ms["decode"]
    assert sglang.phases_ms["decode"]["shared_expert"] == pytest.approx(tp8["shared_expert"], rel=1e-9)
    assert sglang.phases_ms["decode"]["shared_expert"] < mesh  # 1/8 of the weights read a GPU


@TABLES
@pytest.mark.parametrize("overlap", [0, 1])
def test_with_the_tables_a_mesh_the_legacy_one_prices_is_priced_the_same(ds_sim, overlap):
    """DP-8 attention × EP-8 all-to-all is the legacy `parallel` mesh (simulate.py / vector_price.py): with the
    tables bound both run the shared expert beside the routed path, so every figure agrees — also with
    two-batch overlap (each micro-batch's shared expert beside its own routed path)."""
    loop = SimWorkload((40, 7, 64, 12) * 8, 6, mode="concurrency", concurrency=16)
    tables = op_tables.choose("H200", "vllm")
    legacy = ds_sim(tables).evaluate(Deployment(ep_size=8, max_num_seqs=8, overlap=overlap), loop)
    mesh = ds_sim(tables).evaluate(Deployment(ep_size=8, max_num_seqs=8, attn_dp=8, overlap=overlap), loop)
    assert mesh.tpot_ms == pytest.approx(legacy.tpot_ms, rel=1e-9)
    assert mesh.ttft_ms == pytest.approx(legacy.ttft_ms, rel=1e-9)
    assert mesh.detail["op_sources"]["shared_expert"] == legacy.detail["op_sources"]["shared_expert"]


@TABLES
def test_with_the_tables_the_dp_tp_mesh_hides_its_shared_expert_beside_the_routed_experts(ds_sim):
    """DP-8 attention × TP-8 experts, 16 sequences a group (the peer's DeepSeek-V3 pick): each GPU's whole
    shared MLP on its 16 rows (vLLM's fp8-block GEMMs [4,096 × 7,168] and [7,168 × 2,048] at 16 tokens)
    is shorter than the routed experts of a layer, so with the tables bound the decode step is the step
    without a shared expert; on the roofline it adds its own line."""
    loop = SimWorkload((1024,) * 48, 8, mode="concurrency", concurrency=128)
    d = replace(DP8_TP8, dense_format="fp8")
    tables = op_tables.choose("H200", "vllm")
    got = ds_sim(tables).evaluate(d, loop)
    bare = ds_sim(tables, drop_shared=True).evaluate(d, loop)
    dec, bare_dec = got.phases_ms["decode"], bare.phases_ms["decode"]
    m = ds_sim().src.model
    meas = op_tables.Measured(tables.backend, m, m, 1, 8, 1, "fp8", "bfloat16", "bfloat16")
    shared_ms = float(meas.mlp(m.I_shared, np.array([16.0]))[0]) * 1e3 * m.Lm  # whole MLP, 16 rows, every layer
    assert 0 < shared_ms < bare_dec["experts"]  # the precondition: shorter than the routed experts (comm aside)
    assert dec.get("shared_expert", 0.0) == 0.0
    assert got.detail["op_sources"]["shared_expert"] == phase_costs.BESIDE
    assert dec["step"] == pytest.approx(bare_dec["step"], rel=1e-9)
    assert dec["experts"] == pytest.approx(bare_dec["experts"], rel=1e-9)
    mixed, bare_mixed = got.phases_ms["mixed"], bare.phases_ms["mixed"]  # a prompt of 1,024 + decode rows: > 256
    assert mixed["shared_expert"] > 0  # vLLM runs it serially there
    assert mixed["step"] - bare_mixed["step"] == pytest.approx(mixed["shared_expert"], rel=1e-6)
    roof = ds_sim().evaluate(d, loop).phases_ms["decode"]
    roof_bare = ds_sim(drop_shared=True).evaluate(d, loop).phases_ms["decode"]
    assert roof["shared_expert"] > 0
    assert roof["step"] - roof_bare["step"] == pytest.approx(roof["shared_expert"], rel=1e-6)


@TABLES
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_per_step_loop_takes_the_second_stream_in_the_same_steps_as_the_vectorised_pricing(ds_sim, engine):
    """simulate.py's per-step reference and vector_price.py agree step for step where some steps run the shared
    expert beside the routed path and some serially (prompts of 300 tokens: mixed steps past 256 rows)."""
    loop = SimWorkload((300, 7, 64, 280) * 6, 6, mode="concurrency", concurrency=16)
    tables = op_tables.choose("H200", engine)
    for d in (Deployment(ep_size=8, max_num_seqs=8), Deployment(tp_size=2, expert_tp_size=2, max_num_seqs=16)):
        fast, ref = ds_sim(tables), ds_sim(tables)
        ref.reference = True
        a, b = fast.evaluate(d, loop), ref.evaluate(d, loop)
        assert a.tpot_ms == pytest.approx(b.tpot_ms, rel=1e-9) and a.ttft_ms == pytest.approx(b.ttft_ms, rel=1e-9)
        assert a.phases_ms["mixed"]["shared_expert"] == pytest.approx(b.phases_ms["mixed"]["shared_expert"], rel=1e-9)
