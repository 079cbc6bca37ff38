"""A hot/low expert mix (quant.hot_fraction) priced from the measured tables (search/cost/op_tables.py:
two fused MoEs, one per weight format, each at its own rows), and kept out of GPU searches because no
serving engine runs per-expert mixed formats in one MoE layer (study/engine_formats.py).

The splitting tests need no extra: the curves are the package's own H200 vLLM 0.24.0 fused-MoE rows
(Mixtral-8x7B, EP 8, balanced; copied below). The trial tests need the gpu-db extra and skip without it.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from moetune.search.cost import op_tables
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.table_curves import at, hot_share, mixed_experts

SCALE = Path(__file__).resolve().parents[2] / "recipes" / "scale"
# (N tokens, ms) of aiconfigurator-core 0.12.0 h200_sxm vLLM 0.24.0 fused MoE, D 4096, I 14336, K 2, E 8, EP 8
BF16 = [(1, 0.13553), (64, 0.15662), (1024, 0.44012), (8192, 1.99198)]
FP8 = [(1, 0.10138), (64, 0.12759), (1024, 0.26183), (8192, 1.43081)]


def _curve(rows):
    return np.array([[n for n, _ in rows], [ms * 1e-3 for _, ms in rows]], dtype=np.float64)


def test_at_equal_rows_per_expert_the_mix_lies_between_the_all_hot_and_all_low_op():
    hot, low = _curve(BF16), _curve(FP8)
    rows = np.array([[3.0, 40.0, 700.0], [1.0, 256.0, 5000.0]])  # [Lm, R] awkward rows per rank
    per_row = 8 / 2  # ep / K
    for share in (1 / 8, 2 / 8, 0.5):
        mix = mixed_experts(hot, low, share * rows, (1 - share) * rows, share, per_row)
        all_hot, all_low = at(hot, rows * per_row), at(low, rows * per_row)
        assert mix.shape == rows.shape
        np.testing.assert_allclose(mix, share * all_hot + (1 - share) * all_low, rtol=1e-12)
        assert np.all(all_low <= mix) and np.all(mix <= all_hot)


def test_each_part_is_priced_at_its_own_rows_per_expert():
    hot, low = _curve(BF16), _curve(FP8)
    share, per_row = 0.25, 4.0
    hot_rows, low_rows = np.array([512.0, 0.0]), np.array([100.0, 300.0])
    mix = mixed_experts(hot, low, hot_rows, low_rows, share, per_row)
    want = share * at(hot, hot_rows * per_row / share) + (1 - share) * at(low, low_rows * per_row / (1 - share))
    np.testing.assert_allclose(mix, want)
    assert mix[1] == pytest.approx(0.75 * float(at(low, np.array([1600.0]))[0]))  # no hot rows: no hot kernel time


def test_the_edges_are_one_format():
    hot, low = _curve(BF16), _curve(FP8)
    rows = np.array([10.0, 900.0])
    np.testing.assert_allclose(mixed_experts(hot, low, rows * 0, rows, 0.0, 4.0), at(low, rows * 4.0))
    np.testing.assert_allclose(mixed_experts(hot, low, rows, rows * 0, 1.0, 4.0), at(hot, rows * 4.0))


def test_the_hot_share_is_the_hottest_ceil_of_the_experts():
    assert hot_share(0.125, 8) == 1 / 8
    assert hot_share(0.1, 8) == 1 / 8  # ceil(0.8) = 1 expert
    assert hot_share(0.25, 256) == 64 / 256


def mixtral_sim(run_dir):
    """A simulator on Mixtral-8x7B's shapes over 8×H200 priced from vLLM's tables (also test_mesh_tables_bound)."""
    from moetune.search.cost.hardware import BUILTIN
    from moetune.search.cost.simulate import Simulator
    from moetune.search.cost.source import load_source

    sim = Simulator(load_source(run_dir, str(SCALE / "mixtral-8x7b.json")), BUILTIN["H200"])
    sim.tables = op_tables.choose("H200", "vllm")
    return sim


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_a_mixed_hot_trial_is_priced_wholly_from_the_tables(run_dir):
    sim = mixtral_sim(run_dir)
    d = Deployment(ep_size=8, quant_low_format="fp8", quant_hot_fraction=0.125)
    m = sim.evaluate(d)
    assert m.detail["measured_share"] == pytest.approx(1.0, abs=1e-9)  # old code: experts roofline, share < 0.5
    assert m.detail["op_sources"]["experts"].startswith(m.detail["cost_source"])


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_the_mixed_op_lies_between_all_bf16_and_all_fp8_at_the_same_rows(run_dir):
    from moetune.search.cost import tp as tp_costs
    from moetune.search.cost.precision import precision

    sim = mixtral_sim(run_dir)
    m = sim.src.model
    rows = np.array([[2.0, 30.0, 400.0, 3000.0]])  # [Lm, R]

    def bound(d):
        d = sim.stored(d)
        return op_tables.bind(sim.tables, m, tp_costs.tp_model(m, d), d, precision(d, sim.hw, sim.b))

    mixed = bound(Deployment(ep_size=4, quant_low_format="fp8", quant_hot_fraction=0.125))
    assert mixed.hot_q == "bfloat16" and mixed.expert_q == "fp8" and mixed.experts_measured()
    share = mixed.hot_share
    got = mixed.experts(rows, (1 - share) * rows)
    bf16 = bound(Deployment(ep_size=4)).experts(rows)
    fp8 = bound(Deployment(ep_size=4, quant_low_format="fp8")).experts(rows)
    lo, hi = np.minimum(bf16, fp8), np.maximum(bf16, fp8)  # vLLM's per-tensor fp8 at EP 4 is slower at few rows
    assert np.all(lo <= got + 1e-15) and np.all(got <= hi + 1e-15)
    assert not np.allclose(got, bf16) and not np.allclose(got, fp8)


def _gpu_sim(run_dir, tables=None):
    from moetune.search.cost.hardware import BUILTIN
    from moetune.search.cost.simulate import Simulator
    from moetune.search.cost.source import load_source

    sim = Simulator(load_source(run_dir, str(SCALE / "mixtral-8x7b.json")), BUILTIN["H200"])
    sim.tables = tables
    return sim


def test_a_gpu_search_prunes_a_per_expert_mix_and_keeps_one_format(run_dir):
    from moetune.search.study.engine_formats import format_reason

    sim = _gpu_sim(run_dir)  # with or without the tables: no engine serves the mix
    reason = format_reason(sim, Deployment(ep_size=8, quant_low_format="fp8", quant_hot_fraction=0.125))
    assert reason is not None and "no serving engine runs per-expert mixed formats" in reason
    assert format_reason(sim, Deployment(ep_size=8, quant_low_format="fp8")) is None
    assert format_reason(sim, Deployment(ep_size=8, quant_hot_fraction=0.25)) is None  # no low format: moot


def test_this_machine_keeps_the_mix_its_own_engine_runs(run_dir):
    from moetune.search.cost.hardware import BUILTIN
    from moetune.search.study.engine_formats import format_reason

    sim = _gpu_sim(run_dir)
    sim.hw = replace(BUILTIN["H200"], name="this-machine")
    assert format_reason(sim, Deployment(ep_size=1, quant_low_format="int4", quant_hot_fraction=0.25)) is None


def test_a_gpu_space_fixes_the_hot_fraction_unless_named():
    from moetune.search.study.engine_formats import gpu_space
    from moetune.search.study.space import build_space

    space = build_space(8, 8)
    fixed = {k.name: k.values for k in gpu_space(space, set()).knobs}
    assert fixed["quant_hot_fraction"] == (0.0,) and len(fixed["quant_low_format"]) == 4  # no tables: all
    assert gpu_space(space, {"quant_hot_fraction"}) == space


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_with_the_tables_a_gpu_space_leaves_out_what_no_table_prices(run_dir):
    from moetune.search.study.engine_formats import gpu_space
    from moetune.search.study.space import build_space

    sim = _gpu_sim(run_dir, op_tables.choose("H200", "vllm"))
    space = build_space(8, 8)
    values = {k.name: k.values for k in gpu_space(space, set(), sim).knobs}
    assert "int8" not in values["quant_low_format"] and "fp8" in values["quant_low_format"]
    assert 8 in values["ep_size"] and 3 not in values["ep_size"]  # Mixtral: no fused-MoE rows at EP 3
    named = {k.name: k.values for k in gpu_space(space, {"quant_low_format", "ep_size"}, sim).knobs}
    assert "int8" in named["quant_low_format"] and 3 in named["ep_size"]


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_with_the_tables_an_expert_op_they_lack_is_not_ranked(run_dir):
    from moetune.search.study.engine_formats import format_reason

    sim = _gpu_sim(run_dir, op_tables.choose("H200", "vllm"))
    reason = format_reason(sim, Deployment(ep_size=8, quant_low_format="int8"))  # no int8 fused-MoE table
    assert reason is not None and "no fused-MoE entry for int8 experts" in reason
    assert format_reason(sim, Deployment(ep_size=8, quant_low_format="fp8")) is None
    assert format_reason(sim, Deployment(ep_size=8, quant_low_format="int4")) is None


def test_a_trials_memory_is_at_the_load_it_was_priced_at(run_dir):
    """The search's trials table and `simulate --recipe` priced the same recipe at the same concurrency with
    different caps (--num-requests): the KV cache is the sequences in flight at the load priced, not the cap."""
    from moetune.search.cost.slo_load import at_concurrency

    sim = _gpu_sim(run_dir)
    m, d = sim.src.model, Deployment(ep_size=2, max_num_seqs=1024)
    w = sim.src.workload
    probe = at_concurrency(w, 64)
    per_token = (max(probe.prompt_lens) + probe.output_len) * m.L * m.kv_elems * sim.b
    assert sim.memory(d, probe).kv == pytest.approx(32 * per_token)  # 64 in flight over 2 ranks
    big, small = (at_concurrency(replace(w, prompt_lens=w.prompt_lens * n), 64) for n in (64, 2))
    assert sim.memory(d, big).kv == sim.memory(d, small).kv


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_a_model_the_tables_hold_nowhere_keeps_every_format(run_dir):
    """The bundled model's shapes are in no table: its experts are roofline in every trial, none pruned."""
    from moetune.search.cost.hardware import BUILTIN
    from moetune.search.cost.simulate import Simulator
    from moetune.search.cost.source import load_source
    from moetune.search.study.engine_formats import format_reason, gpu_space
    from moetune.search.study.space import build_space

    sim = Simulator(load_source(run_dir), BUILTIN["H200"])
    sim.tables = op_tables.choose("H200", "vllm")
    assert format_reason(sim, Deployment(ep_size=2, quant_low_format="int8")) is None
    space = build_space(sim.src.model.E, 8)
    values = {k.name: k.values for k in gpu_space(space, set(), sim).knobs}
    assert values["quant_low_format"] == ("none", "fp8", "int8", "int4")


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_an_expert_op_answered_by_an_older_versions_rows_says_so(run_dir):
    """H200 vLLM 0.24.0 holds Mixtral's per-tensor fp8 fused MoE at EP 1, 2, 4 only: EP 8 is 0.19.0's rows."""
    sim = _gpu_sim(run_dir, op_tables.choose("H200", "vllm"))
    older = sim.evaluate(Deployment(ep_size=8, max_num_seqs=16, quant_low_format="fp8")).detail["op_sources"]
    assert "fused-MoE rows of vllm 0.19.0" in older["experts"]
    own = _gpu_sim(run_dir, op_tables.choose("H200", "vllm"))  # bf16 at EP 4: 0.24.0's own rows
    assert "rows of" not in own.evaluate(Deployment(ep_size=4, max_num_seqs=16)).detail["op_sources"]["experts"]
