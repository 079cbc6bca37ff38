"""A sampled point that does not fit memory is stepped to the nearest one that does (repair.py
fit_memory): the moves named in the trial's note, each only among the values the space allows."""

from dataclasses import replace
from pathlib import Path

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.memory import HEADROOM
from moetune.search.cost.simulate import Simulator
from moetune.search.study.repair import MemoryRule, fit_memory
from moetune.search.study.space import Limits, build_space
from tests.search.test_estimates_unchanged import synthetic_source

ROOT = Path(__file__).resolve().parents[2]
LIMITS = Limits(num_experts=16, top_k=2, max_ranks=8, requests=64)
FP8 = dict(kv_format="fp8", dense_format="fp8", quant_low_format="fp8")


def _rule(fit: Deployment, slack: float = 1.001) -> tuple[Simulator, MemoryRule]:
    """A simulator on an H200 whose memory fits `fit` (and nothing that needs more)."""
    need = Simulator(synthetic_source(), BUILTIN["H200"]).memory(fit).total
    sim = Simulator(synthetic_source(), replace(BUILTIN["H200"], mem_bytes=need * slack / HEADROOM))
    return sim, MemoryRule(lambda d: sim.memory(d).total, sim.memory_reason)


def test_a_point_that_does_not_fit_is_stepped_to_fp8_in_order_and_the_moves_are_named():
    d = Deployment(ep_size=2, max_num_seqs=64, max_num_batched_tokens=1024)
    sim, rule = _rule(replace(d, **FP8))
    assert sim.memory_reason(d) is not None
    out, notes = fit_memory(d, build_space(16, 8), LIMITS, rule)
    assert out == replace(d, **FP8) and sim.memory_reason(out) is None
    assert len(notes) == 1 and notes[0].startswith("memory: kv_format none → fp8, dense_format none → fp8, "
                                                   "quant_low_format none → fp8 (needs ")


def test_a_point_that_fits_is_untouched():
    d = Deployment(ep_size=2, max_num_seqs=64, max_num_batched_tokens=1024)
    sim = Simulator(synthetic_source(), BUILTIN["H200"])
    assert sim.memory_reason(d) is None
    rule = MemoryRule(lambda x: sim.memory(x).total, sim.memory_reason)
    assert fit_memory(d, build_space(16, 8), LIMITS, rule) == (d, [])


def test_a_move_the_space_forbids_is_never_made():
    d = Deployment(ep_size=2, max_num_seqs=64, max_num_batched_tokens=1024)
    _, rule = _rule(replace(d, **FP8), slack=0.999)  # the fp8 point itself does not quite fit: more moves
    space = build_space(16, 8, overrides={"kv_format": "none", "quant_low_format": ["none", "int4"],
                                          "ep_size": [1, 2], "max_num_seqs": [64, 32]})
    out, notes = fit_memory(d, space, LIMITS, rule)
    assert rule.reason(out) is None and notes
    assert out.kv_format == "none" and out.quant_low_format == "int4" and out.ep_size == 2
    assert out.max_num_seqs in (64, 32) and "kv_format" not in notes[0]
    fixed = build_space(16, 8, overrides={k: "none" for k in FP8} | {"ep_size": 2, "max_num_seqs": 64,
                                                                      "max_num_batched_tokens": 1024})
    assert fit_memory(d, fixed, LIMITS, rule) == (d, [])  # nothing it may move fits: left to the memory rule


def test_more_ranks_per_replica_when_nothing_else_fits():
    d = Deployment(ep_size=2, replicas=4, max_num_seqs=8, max_num_batched_tokens=256, **FP8)
    _, rule = _rule(replace(d, ep_size=4, replicas=2))
    space = build_space(16, 8, overrides={"quant_low_format": "fp8", "max_num_seqs": 8})
    out, notes = fit_memory(d, space, LIMITS, rule)
    assert (out.ep_size, out.replicas) == (4, 2) and "ep_size 2 → 4, replicas 4 → 2" in notes[0]


def test_a_deepseek_v3_tpe_search_on_8_h200_now_finds_a_feasible_trial(run_dir, tmp_path):
    from moetune.search.study.optuna_study import Constraints, StudySettings
    from moetune.search.study.run import SearchSettings, run_search
    from moetune.search.study.setup import Inputs

    out = tmp_path / "dsv3"
    st = StudySettings("d", f"sqlite:///{out / 'study.db'}", ("throughput_per_gpu",), "tpe", 8, 0,
                       Constraints(max_ttft_ms=1000.0, max_tpot_ms=50.0))
    inputs = Inputs(str(run_dir), "8xH200", scale_model=str(ROOT / "recipes/scale/deepseek-v3.json"),
                    input_len=256, output_len=16, concurrency=16)
    space = tmp_path / "space.yaml"  # the parallel mesh (EP / TP): what needs the memory moves (TP-8 meshes fit as drawn)
    space.write_text("attn_dp: 0\nexpert_tp_size: 1\n")
    result = run_search(SearchSettings(inputs, st, out, "simulate", str(space)))
    ran = [r for r in result.rows if r.metrics is not None]
    assert ran and any("memory: " in (r.reason or "") for r in ran)
    assert result.winner is not None and result.winner.metrics["peak_mem_gb"] < 141 * HEADROOM


def test_an_ep_move_re_tiles_the_redundant_slots_within_the_space():
    d = Deployment(ep_size=3, redundant_experts=5, max_num_seqs=8, max_num_batched_tokens=256, **FP8)  # 4 → 5 tiles 3
    _, rule = _rule(replace(d, ep_size=4, redundant_experts=4))
    space = build_space(16, 8, overrides={"redundant_experts": [0, 4], "quant_low_format": "fp8", "max_num_seqs": 8,
                                          "max_num_batched_tokens": 256, "ep_size": [1, 3, 4]})
    out, notes = fit_memory(d, space, LIMITS, rule)
    assert (out.ep_size, out.redundant_experts) == (4, 4) and "ep_size 3 → 4" in notes[0]


def test_a_disaggregated_prefill_worker_over_memory_is_widened(run_dir):
    """DeepSeek-V3 on 16×H200: a prefill worker of one GPU (its 671 GB of experts) is the fuller worker; its
    experts are split wider (expert TP, then EP) until it fits, the decode worker untouched."""
    from moetune.search.study.evaluate import SimulateEvaluator
    from moetune.search.study.setup import Inputs, prepare

    setup = prepare(Inputs(str(run_dir), "16xH200", scale_model=str(ROOT / "recipes/scale/deepseek-v3.json"),
                           input_len=1024, output_len=256, concurrency=64))
    space = build_space(setup.source.model.E, 16)
    rule = SimulateEvaluator(setup.sim, setup.workload).memory_rule()
    decode = dict(attn_dp=8, expert_tp_size=8, tp_size=1, moe_a2a=0, max_num_seqs=64, **FP8)
    d = Deployment(prefill_workers=1, prefill_ep=1, prefill_expert_tp=1, **decode)
    assert rule.reason(d) is not None
    out, notes = fit_memory(d, space, setup.limits(), rule)
    assert rule.reason(out) is None and out.prefill_expert_tp > 1 and "prefill_expert_tp 1 →" in notes[0]
    assert {k: getattr(out, k) for k in decode} == decode and out.prefill_ep == 1
    narrow = replace(space, knobs=tuple(replace(k, values=(1,)) if k.name == "prefill_expert_tp" else k
                                        for k in space.knobs))
    out, notes = fit_memory(d, narrow, setup.limits(), rule)  # expert TP fixed by the space: EP widened instead
    assert rule.reason(out) is None and out.prefill_expert_tp == 1 and out.prefill_ep > 1 and "prefill_ep 1 →" in notes[0]
