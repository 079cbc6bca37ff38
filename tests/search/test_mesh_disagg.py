"""Every mesh the engines run (cost/mesh.py) and disaggregated prefill/decode (cost/disagg.py):
priced by hand-computable formulas, canonical twins, emitted flags parsed by the engines' tables,
and a search winner's recipe re-priced by `moetune simulate --recipe --json` to the same figures."""

import csv
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from moetune.search.cost import mesh as mesh_costs
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.disagg import kv_transfer, workers
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simmodel import SimModel
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.source import TraceSource
from moetune.search.study.deploy_knobs import canonical_deploy, prune_deploy
from moetune.search.study.disagg_launch import disagg_text
from moetune.search.study.flag_table import check, commands_of, kv_transfer_reason
from moetune.search.study.launch import ServeTarget
from moetune.search.study.sglang_launch import sglang_launch
from moetune.search.study.vllm_launch import vllm_launch
from tests.cli_run import moetune
from tests.search.test_simulate_tp import source

H200 = BUILTIN["H200"]
CLOSED = SimWorkload((40, 7, 64, 12) * 8, 6, mode="concurrency", concurrency=16)


def test_a_mesh_the_legacy_one_prices_is_priced_the_same():
    """DP-8 attention with EP-8 all-to-all is the `parallel` mesh: the same figures either way."""
    sim = Simulator(source(), H200)
    legacy = sim.evaluate(Deployment(ep_size=8, max_num_seqs=8), CLOSED)
    mesh = sim.evaluate(Deployment(ep_size=8, max_num_seqs=8, attn_dp=8), CLOSED)
    assert mesh.output_tok_s == pytest.approx(legacy.output_tok_s, rel=1e-9)
    assert mesh.tpot_ms == pytest.approx(legacy.tpot_ms, rel=1e-9)
    assert canonical_deploy(Deployment(ep_size=8, attn_dp=8), [])[0].attn_dp == 0  # and one point of the space


def test_dp_attention_reads_fewer_attention_weights_per_rank_than_tp():
    """DP-4 attention (TP 1) reads all attention weights on each GPU for its own rows; TP-4 reads a
    quarter: a rank's attention memory term (W_attn · b) is 4× smaller under TP, by the formula."""
    m = source().model
    tp4 = mesh_costs.tp_costs.tp_model(m, Deployment(tp_size=4))
    assert tp4.attn_weights * 4 == m.attn_weights
    sim = Simulator(source(), H200)
    dp = sim.evaluate(Deployment(ep_size=1, expert_tp_size=4, attn_dp=4, max_num_seqs=4), CLOSED)
    tp = sim.evaluate(Deployment(ep_size=1, expert_tp_size=4, tp_size=4, attn_dp=1, max_num_seqs=16), CLOSED)
    assert dp.detail["memory"]["dense"] > tp.detail["memory"]["dense"]  # weights held per GPU
    assert "tp_allreduce" in tp.phases_ms["decode"] and tp.phases_ms["decode"]["tp_allreduce"] > 0
    assert dp.phases_ms["decode"]["tp_allreduce"] == 0  # no attention TP collective under DP attention


def test_gather_mode_collectives_match_the_hand_formula():
    """moe_in = (a−1)/a·T·D·b/bw + α, moe_out = (N−1)/N·T·D·b/bw + α on a hand-sized case."""
    hw = replace(H200, intra_bw=100.0, link_eff=1.0, intra_latency_s=1.0)
    d = Deployment(ep_size=1, expert_tp_size=4, attn_dp=4, moe_a2a=0)
    T = np.array([8.0])
    moe_in, moe_out = mesh_costs.gather_seconds(d, hw, D=10, b=2, T=T, T_max=np.array([2.0]))
    assert moe_in[0] == pytest.approx(3 / 4 * 8 * 10 * 2 / 100 + 1)
    assert moe_out[0] == pytest.approx(3 / 4 * 8 * 10 * 2 / 100 + 1)
    tp = Deployment(ep_size=1, expert_tp_size=4, tp_size=4, attn_dp=1, moe_a2a=0)  # TP attention: an all-reduce
    moe_in, moe_out = mesh_costs.gather_seconds(tp, hw, D=10, b=2, T=T, T_max=T)
    assert moe_in[0] == 0 and moe_out[0] == pytest.approx(2 * 3 / 4 * 8 * 10 * 2 / 100 + 1)
    two = Deployment(ep_size=1, expert_tp_size=4, tp_size=2, attn_dp=2, moe_a2a=0)  # DP 2 × TP 2: + gather over 2
    moe_in, moe_out = mesh_costs.gather_seconds(two, hw, D=10, b=2, T=T, T_max=np.array([5.0]))
    assert moe_in[0] == pytest.approx(1 / 2 * 8 * 10 * 2 / 100 + 1)
    assert moe_out[0] == pytest.approx(3 / 4 * 8 * 10 * 2 / 100 + 1 + 1 / 2 * 5 * 10 * 2 / 100 + 1)


def test_a_tp_mesh_as_a_general_mesh_is_priced_as_the_tp_mesh():
    """TP-4 attention with TP-4 experts said both ways (legacy tp group; attn_dp 1, all-gather): the same step."""
    sim = Simulator(source(), H200)
    legacy = sim.evaluate(Deployment(tp_size=4, expert_tp_size=4, max_num_seqs=16), CLOSED)
    mesh = sim.evaluate(Deployment(tp_size=4, expert_tp_size=4, attn_dp=1, moe_a2a=0, max_num_seqs=16), CLOSED)
    assert mesh.ttft_ms == pytest.approx(legacy.ttft_ms, rel=1e-9) and mesh.tpot_ms == pytest.approx(legacy.tpot_ms, rel=1e-9)
    assert canonical_deploy(Deployment(tp_size=4, expert_tp_size=4, attn_dp=1, moe_a2a=0), [])[0].attn_dp == 0


def test_ep_and_tp_experts_move_different_bytes():
    """EP-8 all-to-all moves each copy's row once to its expert's GPU; TP-8 experts gather and reduce every
    row over all 8 GPUs: the bytes differ, and each is what its formula says."""
    sim = Simulator(source(), H200)
    ep = sim.evaluate(Deployment(ep_size=8, tp_size=8, attn_dp=1, max_num_seqs=16), CLOSED)
    tp = sim.evaluate(Deployment(ep_size=1, expert_tp_size=8, tp_size=8, attn_dp=1, max_num_seqs=16, moe_a2a=0), CLOSED)
    assert ep.detail["a2a_bytes"] > 0 and tp.detail["a2a_bytes"] > 0
    assert ep.detail["a2a_bytes"] != pytest.approx(tp.detail["a2a_bytes"])
    sched = sim.schedule(Deployment(ep_size=1, max_num_seqs=16), CLOSED)
    rows, m = float((sched.prefill + sched.decode).sum()), source().model
    assert tp.detail["a2a_bytes"] == pytest.approx(7 / 8 * rows * m.D * 2 * 8 * m.Lm)  # (N−1)/N · T·D·b · N GPUs · Lm


def test_meshes_the_engines_cannot_run_are_pruned():
    m = source().model
    assert "moe_a2a 0" in prune_deploy(Deployment(ep_size=4, expert_tp_size=2, attn_dp=8, tp_size=1), m, 8)
    assert "does not cover" in prune_deploy(Deployment(ep_size=4, attn_dp=8, tp_size=1), m, 8)
    assert prune_deploy(Deployment(ep_size=4, expert_tp_size=2, attn_dp=8, tp_size=1, moe_a2a=0), m, 8) is None
    d, notes = canonical_deploy(Deployment(ep_size=8, attn_dp=2, tp_size=1), [])
    assert d.tp_size == 4 and notes  # attention TP follows the DP size


def test_disaggregated_ttft_includes_the_kv_transfer():
    """bytes = L · layers · kv_elems · b; seconds = α + bytes / (lanes · bw · eff); TTFT = wait + prefill + it."""
    src = source()
    hw = replace(H200, intra_bw=1e6, link_eff=0.5, intra_latency_s=1e-3)
    sim = Simulator(src, hw)
    d = Deployment(max_num_seqs=16, prefill_workers=1, decode_workers=1)  # one GPU each: no collective in a step
    w = SimWorkload((40,) * 64, 6, mode="rate", rate=10.0)
    xfer = kv_transfer(sim, d, 40.0)
    m = src.model
    assert xfer["bytes"] == 40 * m.L * m.kv_elems * 2
    assert xfer["seconds"] == pytest.approx(1e-3 + xfer["bytes"] / (1 * 1e6 * 0.5))
    out = sim.evaluate(d, w).detail["disagg"]
    ttft = sim.evaluate(d, w).ttft_ms / 1e3
    assert out["prefill_load"] < 0.5  # the median request waits for no other: TTFT P50 = prefill + transfer
    assert ttft == pytest.approx(out["prefill_s"] + out["transfer_s"], rel=1e-9)
    assert out["transfer_s"] == pytest.approx(xfer["seconds"])
    slow = Simulator(src, replace(hw, intra_bw=1e5))
    assert slow.evaluate(d, w).ttft_ms > sim.evaluate(d, w).ttft_ms  # a slower link: a later first token


def test_disaggregated_decode_is_priced_at_its_steady_batch():
    sim = Simulator(source(), H200)
    d = Deployment(ep_size=2, max_num_seqs=32, prefill_workers=2, decode_workers=2, prefill_ep=1)
    m = sim.evaluate(d, CLOSED)
    dis = m.detail["disagg"]
    assert 1 <= dis["decode_batch"] <= 32 and 0 < dis["prefill_load"] < 1
    assert m.output_tok_s == pytest.approx(dis["request_rate"] * CLOSED.output_len)
    assert m.ranks == 2 * 1 + 2 * 2 and m.output_tok_s_per_gpu == pytest.approx(m.output_tok_s / 8)
    pre, dec = workers(d)
    assert (pre.ep_size, dec.ep_size, pre.prefill_workers) == (1, 2, 0)


TARGET = ServeTarget("$MODEL_DIR", "deepseek_v3", 8, 8, "H200")
MESHES = [Deployment(ep_size=1, expert_tp_size=4, attn_dp=4, moe_a2a=0),  # DP-4 attention, TP-4 experts
          Deployment(ep_size=8, tp_size=8, attn_dp=1),  # TP-8 attention, EP-8 experts
          Deployment(ep_size=4, expert_tp_size=2, attn_dp=8, moe_a2a=0)]  # DP-8 attention, TP-2 × EP-4 experts


@pytest.mark.parametrize("d", MESHES, ids=["dp4-tp4", "tp8-ep8", "dp8-tp2xep4"])
def test_mesh_flags_parse_and_say_the_mesh(d):
    v, s = vllm_launch(d, TARGET), sglang_launch(d, TARGET, None)
    assert all(check("vllm", n) is None for n in v.nodes) and all(check("sglang", n) is None for n in s.nodes)
    sg = " ".join(s.nodes[0])
    assert f"--tp-size {d.ep_size * d.expert_tp_size}" in sg
    assert (f"--attn-dp-size {d.attn_dp}" in sg) == (d.attn_dp > 1)
    assert (f"--ep-size {d.ep_size}" in sg) == (d.ep_size > 1)
    vl = " ".join(v.nodes[0])
    assert f"--tensor-parallel-size {d.tp_size}" in vl
    assert ("--enable-expert-parallel" in vl) == (d.ep_size > 1)
    assert bool(v.unsupported) == (d.ep_size > 1 and d.expert_tp_size > 1)  # vLLM: all-EP or all-TP experts


def test_disaggregated_launch_files_parse_with_the_engines_and_the_router():
    d = Deployment(ep_size=4, max_num_seqs=64, prefill_workers=2, decode_workers=1, prefill_ep=2)
    sg = disagg_text("sglang", d, TARGET, d.label(), None)
    cmds = commands_of(sg)
    assert len(cmds) == 2 + 1 + 1  # two prefill workers, one decode worker, the router
    assert [c[c.index("--disaggregation-mode") + 1] for c in cmds[:3]] == ["prefill", "prefill", "decode"]
    router = cmds[-1]
    assert check("sglang_router", router) is None and router.count("--prefill") == 2 and "--pd-disaggregation" in router
    assert all(check("sglang", c) is None for c in cmds[:3])
    vl = commands_of(disagg_text("vllm", d, TARGET, d.label(), None))
    roles = [json.loads(c[c.index("--kv-transfer-config") + 1])["kv_role"] for c in vl]
    assert roles == ["kv_producer", "kv_producer", "kv_consumer"] and all(check("vllm", c) is None for c in vl)
    assert "is not one of" in kv_transfer_reason('{"kv_connector": "NixlConnector", "kv_role": "prefill"}')
    assert "connector" in kv_transfer_reason('{"kv_connector": "NoSuch", "kv_role": "kv_both"}')
    assert "without kv_role" in kv_transfer_reason('{"kv_connector": "NixlConnector"}')
    assert "no field" in kv_transfer_reason('{"kv_connector": "NixlConnector", "kv_role": "kv_both", "role": 1}')
    assert check("sglang", ["--disaggregation-mode", "both"]) is not None  # the parser's choices hold


def test_search_winner_recipe_reprices_to_the_same_figures(run_dir, tmp_path):
    """search → winner.yaml (its deploy section: mesh, disaggregation, formats) → simulate --recipe --json
    gives the winner's figures; --json - prints one JSON object and nothing else on stdout."""
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: [1, 2, 4]\nattn_dp: [0, 1, 2]\nprefill_workers: [0, 1]\nkv_format: [none, fp8]\n"
                     "dense_format: fp8\nreplicas: 1\nexpert_tp_size: 1\n")
    out = tmp_path / "o"
    load = ["--hardware", "8xH200", "--concurrency", "8", "--num-requests", "32", "--output-len", "8"]
    r = moetune("search", "--trace", str(run_dir), "--n-trials", "12", "--seed", "3", "--space", str(space),
                "--out", str(out), *load)
    assert r.returncode == 0, r.stderr[-2000:]
    recipe = (out / "winner.yaml").read_text()
    assert "deploy:" in recipe and "dense_format: fp8" in recipe
    sim = moetune("simulate", "--trace", str(run_dir), "--recipe", str(out / "winner.yaml"), "--json", "-", *load)
    assert sim.returncode == 0, sim.stderr[-2000:]
    figures = json.loads(sim.stdout)  # the whole of stdout is one object
    label = recipe.splitlines()[0].split("): ", 1)[1]  # "# moetune search winner (how): LABEL"
    assert figures["label"] == label
    with (out / "trials.csv").open() as f:
        best = next(row for row in csv.DictReader(f) if row["state"] == "COMPLETE" and row["deployment"] == label)
    for k in ("output_tok_s", "ttft_ms", "tpot_ms"):
        assert math.isclose(figures[k], float(best[k]), rel_tol=1e-5), (k, figures[k], best[k])


def test_the_disaggregated_form_is_searched_unnamed_on_two_nodes_and_the_meshes_on_two_gpus():
    from moetune.search.study.space import build_space

    one_node = {k.name: k.values for k in build_space(256, 8).knobs}
    two_nodes = {k.name: k.values for k in build_space(256, 16).knobs}
    assert "prefill_workers" not in one_node  # the base recipe's (neutral): out of the grid
    assert one_node["attn_dp"] == (0, 1, 2, 4, 8) and one_node["moe_a2a"] == (0, 1)  # meshes: 2+ GPUs
    assert two_nodes["prefill_workers"] == (0, 1, 2, 4) and two_nodes["attn_dp"] == (0, 1, 2, 4, 8, 16)
    assert two_nodes["prefill_expert_tp"] == (1, 2, 4, 8)  # a prefill worker's DP attention × TP experts (the peer's
    assert "prefill_tokens" not in two_nodes and "prefill_expert_tp" not in one_node  # DeepSeek-V3 pick) unnamed
    named = {k.name: k.values for k in build_space(256, 8, overrides={"attn_dp": [0, 1, 8], "moe_a2a": [0, 1]}).knobs}
    assert named["attn_dp"] == (0, 1, 8) and named["moe_a2a"] == (0, 1)


def test_a_disaggregated_point_over_the_gpus_is_repaired_down_to_the_decode_workers_ep():
    """One prefill worker beside a decode worker as wide as the GPUs (EP 16 on 16 GPUs: 17) is repaired, not
    pruned: the prefill side first (workers, EP, expert TP halved), then the decode worker's EP, its mesh kept
    one the engines run (attention DP dividing its GPUs)."""
    from moetune.search.cost.disagg import total_gpus
    from moetune.search.study.deploy_knobs import repair_workers

    d = Deployment(ep_size=16, redundant_experts=32, prefill_workers=2, decode_workers=2, prefill_ep=4,
                   prefill_expert_tp=2)
    out, notes = repair_workers(d, 16, [])
    assert (out.prefill_workers, out.decode_workers, out.prefill_ep, out.prefill_expert_tp, out.ep_size) == (1, 1, 1, 1, 8)
    assert total_gpus(out) == 9 and "(2, 2, 4, 2, 16) → (1, 1, 1, 1, 8)" in notes[-1]
    mesh = Deployment(ep_size=16, attn_dp=16, moe_a2a=1, prefill_workers=1, prefill_ep=2)
    out, _ = repair_workers(mesh, 16, [])
    assert (out.ep_size, out.attn_dp, out.tp_size, out.prefill_ep) == (8, 8, 1, 1) and total_gpus(out) <= 16
    fits = Deployment(ep_size=8, prefill_workers=1, prefill_ep=8)
    assert repair_workers(fits, 16, []) == (fits, [])  # 8 + 8 GPUs: unchanged


def test_a_recipe_deploy_section_round_trips_every_priced_knob():
    from moetune.config import parse_config
    from moetune.search.study.space import from_config, to_config

    d = Deployment(ep_size=4, expert_tp_size=2, tp_size=1, attn_dp=8, moe_a2a=0, dense_format="fp8", kv_format="fp8",
                   overlap=1, cuda_graph_max_bs=128, replicas=2, prefill_workers=1, decode_workers=2, prefill_ep=2,
                   prefill_tp=2, prefill_expert_tp=1, prefill_tokens=4096)
    cfg = to_config(parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}}), d)
    again = from_config(parse_config(cfg.model_dump()))
    for name in ("attn_dp", "moe_a2a", "dense_format", "kv_format", "overlap", "cuda_graph_max_bs", "replicas",
                 "prefill_workers", "decode_workers", "prefill_ep", "prefill_tp", "prefill_expert_tp", "prefill_tokens",
                 "ep_size", "tp_size", "expert_tp_size"):
        assert getattr(again, name) == getattr(d, name), name


def test_the_report_says_which_form_wins_and_by_how_much():
    from moetune.search.study.forms import form_sentence
    from moetune.search.study.optuna_study import TrialRow

    def row(n, tok, **knobs):
        return TrialRow(n, "COMPLETE", knobs, [tok], {"output_tok_s": tok})

    rows = [row(0, 100.0), row(1, 150.0, prefill_workers=1), row(2, 120.0, ep_size=2)]
    said = form_sentence(rows, "throughput")
    assert said.startswith("Disaggregated prefill/decode wins") and "150 vs 120 (1.25×" in said
    assert form_sentence(rows[:1] + rows[2:], "throughput") is None  # one form tried: nothing to say


def test_moetunes_engine_refuses_a_recipe_whose_deploy_section_only_the_serving_engines_run(tmp_path):
    from tests.cli_run import assert_one_line_error

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {path: stdlib-moe, device: cpu}\nparallel: {ep_size: 2}\ndeploy: {attn_dp: 1}\n")
    assert_one_line_error(moetune("generate", "--recipe", str(recipe), "--prompt", "hi", "--max-tokens", "2"),
                          "deploy.attn_dp 1", "launch files")


def test_attention_reads_all_its_weights_per_gpu_under_dp_and_a_quarter_under_tp4():
    """Memory-bound pricing (seconds = bytes): a GPU of a DP-4 group reads W_attn·b + context·kv·b + 2·T·D·b
    for its own rows; a GPU of TP-4 reads W_attn/4·b + context·kv/4·b (4 KV heads: one each) + 2·T·D·b."""
    from moetune.search.cost import phase_costs as costs

    hw = replace(H200, flops=1e30, mem_bw=1.0, mem_eff=1.0, op_overhead_s=0.0)
    sim = Simulator(source(), hw)
    m, b = source().model, hw.act_bytes
    T, ctx = np.array([3.0]), np.array([50.0])
    st = costs.StepRows(T, np.zeros(1), ctx, ctx, T, 1)
    dp = sim.rank_view(mesh_costs.attention_view(Deployment(ep_size=1, expert_tp_size=4, attn_dp=4)))
    tp = sim.rank_view(mesh_costs.attention_view(Deployment(ep_size=1, expert_tp_size=4, tp_size=4, attn_dp=1)))
    assert costs.attention(dp, st)[0] == pytest.approx(m.attn_weights * b + 50 * m.kv_elems * b + 2 * 3 * m.D * b)
    assert costs.attention(tp, st)[0] == pytest.approx(m.attn_weights / 4 * b + 50 * m.kv_elems / 4 * b + 2 * 3 * m.D * b)
