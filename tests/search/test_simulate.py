"""The cost model on a real trace of the bundled model: phases, memory, EP, replicas, offload, quant,
scaling, hardware files, and `moetune simulate` on the command line."""

from dataclasses import replace

import numpy as np
import pytest

from moetune.search.cost.hardware import BUILTIN, HardwareError, get_hardware
from moetune.search.cost.offload import OffloadState, SlotCache
from moetune.search.cost.scale import scale_ids
from moetune.search.cost.schedule import SimWorkload, simulate_schedule
from moetune.search.study.setup import Inputs, prepare
from moetune.search.study.space import Deployment
from tests.cli_run import assert_one_line_error, moetune

H200 = "H200"


@pytest.fixture(scope="module")
def sim(run_dir):
    return prepare(Inputs(str(run_dir), H200)).sim


def test_schedule_follows_the_engine_budget_and_data_parallel_split():
    w = SimWorkload((40,) * 6, 4)
    s = simulate_schedule(w, ranks=2, max_num_seqs=2, max_num_batched_tokens=50)
    assert s.prefill.sum() == 6 * 40 and s.sampled.sum() == 6 * 4
    assert (s.prefill + s.decode).max() <= 50  # the token budget per rank and step
    assert s.seqs.max() <= 2
    assert (s.first_step <= s.last_step).all() and (s.last_step - s.first_step >= 3).all()


def test_every_figure_is_estimated_and_phases_are_the_profile_names(sim):
    m = sim.evaluate(Deployment(max_num_seqs=8))
    assert m.estimated and m.output_tok_s > 0 and m.tpot_ms > 0 and m.ttft_ms > 0
    assert {"attention", "router", "permute", "experts", "unpermute", "other", "step"} <= set(m.phases_ms["decode"])
    assert set(m.phases_ms) >= {"prefill", "decode"}


def test_expert_parallel_moves_bytes_and_eplb_balances_ranks(sim):
    one = sim.evaluate(Deployment(max_num_seqs=8))
    two = sim.evaluate(Deployment(ep_size=2, max_num_seqs=8))
    eplb = sim.evaluate(Deployment(ep_size=8, redundant_experts=8, placement="eplb", max_num_seqs=8))
    contiguous = sim.evaluate(Deployment(ep_size=8, redundant_experts=8, max_num_seqs=8))
    assert one.detail["a2a_bytes"] == 0 and two.detail["a2a_bytes"] > 0
    assert two.phases_ms["decode"]["dispatch"] > 0
    assert eplb.detail["rank_imbalance"] < contiguous.detail["rank_imbalance"]
    assert two.peak_mem_gb < one.peak_mem_gb  # half the experts per rank


def test_low_bit_experts_shrink_memory_and_hot_fraction_keeps_some_full(sim):
    full = sim.evaluate(Deployment(max_num_seqs=8))
    int4 = sim.evaluate(Deployment(max_num_seqs=8, quant_low_format="int4"))
    mixed = sim.evaluate(Deployment(max_num_seqs=8, quant_low_format="int4", quant_hot_fraction=0.5))
    assert int4.detail["memory"]["experts"] < mixed.detail["memory"]["experts"] < full.detail["memory"]["experts"]
    assert int4.detail["low_precision_share"] == pytest.approx(1.0)
    assert 0 < mixed.detail["low_precision_share"] < 0.75  # the hot half carries more than half the copies


def test_offload_stalls_and_prefetch_hides_some(sim):
    """One sequence at a time needs top-K experts, which fit the cache, so prefetch can hide fetches;
    eight at once need more experts than a quarter of them resident (the transient buffer), where
    prefetch cannot help."""
    resident = sim.evaluate(Deployment(max_num_seqs=1))
    off = sim.evaluate(Deployment(max_num_seqs=1, offload_resident_fraction=0.25))
    pre = sim.evaluate(Deployment(max_num_seqs=1, offload_resident_fraction=0.25, offload_prefetch_depth=3))
    assert resident.detail["offload_stall_s"] == 0 and off.detail["offload_stall_s"] > 0
    assert off.detail["cache_hit_rate"] < 1
    assert pre.detail["offload_stall_s"] < off.detail["offload_stall_s"]
    assert off.peak_mem_gb < resident.peak_mem_gb
    wide = sim.evaluate(Deployment(max_num_seqs=8, offload_resident_fraction=0.25))
    wide_pre = sim.evaluate(Deployment(max_num_seqs=8, offload_resident_fraction=0.25, offload_prefetch_depth=3))
    assert wide.detail["offload_stall_s"] > 0
    assert wide_pre.detail["offload_stall_s"] >= 0.9 * wide.detail["offload_stall_s"]


def test_lru_and_lfu_evict_different_slots():
    lru, lfu = SlotCache(2, "lru"), SlotCache(2, "lfu")
    for c in (lru, lfu):
        for s in (1, 1, 1, 2, 3):
            c.touch(s)
    assert list(lru.resident) == [2, 3] and set(lfu.resident) == {1, 3}


def test_scaling_keeps_group_skew_and_never_repeats_an_expert():
    rng = np.random.default_rng(0)
    ids = np.stack([rng.choice(16, 2, replace=False, p=np.linspace(2, 0.1, 16) / np.linspace(2, 0.1, 16).sum())
                    for _ in range(3000)])[:, None, :].repeat(2, axis=1)  # [N, 2 layers, K=2], expert 0 hottest
    big = scale_ids(ids.astype(np.uint8), 16, 256, 5, 8)
    assert big.shape == (3000, 5, 8)
    assert all(len(set(row)) == 8 for row in big[:, 0, :])
    groups = np.bincount(big[:, 0, :].reshape(-1).astype(np.int64) // 16, minlength=16)
    assert groups[0] > groups[15] * 3  # the hot source expert became a hot group
    small = scale_ids(ids.astype(np.uint8), 16, 8, 32, 2)
    assert small.max() < 8 and all(row[0] != row[1] for row in small[:, 3, :])


def test_scaled_to_deepseek_on_two_h200_nodes(run_dir, big_config):
    setup = prepare(Inputs(str(run_dir), "16xH200", scale_model=str(big_config), num_requests=64, input_len=256,
                           output_len=16))
    assert setup.hardware.max_ranks == 16 and setup.hardware.nodes == 2
    m8 = setup.sim.evaluate(Deployment(ep_size=8, max_num_seqs=8))
    m16 = setup.sim.evaluate(Deployment(ep_size=16, max_num_seqs=4))
    assert m16.detail["inter_node_bytes"] > 0 and m8.detail["inter_node_bytes"] == 0
    assert m8.peak_mem_gb > m16.peak_mem_gb
    full = prepare(Inputs(str(run_dir), "16xH200", scale_model="recipes/scale/deepseek-v3.json"))
    assert "GB per rank" in full.sim.memory_reason(Deployment(ep_size=1, max_num_seqs=8))  # 671B on one GPU
    assert full.sim.memory_reason(Deployment(ep_size=16, max_num_seqs=8)) is None


def test_hardware_profiles_and_files(tmp_path):
    assert BUILTIN["H200"].mem_bw == 4.8e12 and "datasheet" in BUILTIN["H200"].source
    assert get_hardware("8xB200").max_ranks == 8
    f = tmp_path / "hw.yaml"
    f.write_text("base: H100\nname: my-h100\nmem_bytes: 94.0e9\ngemm_eff: 0.5\n")
    hw = get_hardware(str(f))
    assert (hw.name, hw.mem_bytes, hw.gemm_eff, hw.flops) == ("my-h100", 94e9, 0.5, BUILTIN["H100"].flops)
    f.write_text("base: H100\nwarp_speed: 9\n")
    with pytest.raises(HardwareError, match="unknown key 'warp_speed'"):
        get_hardware(str(f))
    with pytest.raises(HardwareError, match="unknown hardware 'TPU'"):
        get_hardware("TPU")


def test_this_machine_is_calibrated_by_microbenchmarks():
    hw = get_hardware("this-machine")
    assert hw.flops > 1e8 and hw.mem_bw > 1e8 and 0 < hw.op_overhead_s < 1e-2 and "measured" in hw.source


def test_simulate_command_prints_phases_all_estimated(run_dir):
    r = moetune("simulate", "--trace", str(run_dir), "--hardware", "H100", "--recipe", "recipes/ep4-what-if.yaml")
    assert r.returncode == 0, r.stderr
    assert "estimated" in r.stdout and "dispatch" in r.stdout and "straggler_wait" in r.stdout


def test_simulate_command_user_mistakes_are_one_line(run_dir, tmp_path):
    assert_one_line_error(moetune("simulate", "--trace", str(tmp_path / "nope")), "does not exist")
    assert_one_line_error(moetune("simulate", "--trace", str(run_dir), "--hardware", "TPU"), "unknown hardware")
    bad = tmp_path / "r.yaml"
    bad.write_text("model: {path: stdlib-moe}\nparallel: {ep_size: 3}\n")
    assert_one_line_error(moetune("simulate", "--trace", str(run_dir), "--recipe", str(bad), "--hardware", "H100"),
                          "does not divide")


def test_calibrated_on_the_trace_call_overheads_are_fitted_on_the_run_and_reproduce_it(run_dir):
    import json

    from moetune.search.study.one import simulate_recipe

    setup, d, m = simulate_recipe(Inputs(str(run_dir), "this-machine", calibrate_on="trace"))
    assert {"attention", "experts", "other", "attention/decode"} <= set(setup.sim.k)
    measured = json.loads((run_dir / "summary.json").read_text())["kinds"]["decode"]
    step_ms = 1e3 * measured["seconds"] / measured["steps"]
    assert m.phases_ms["decode"]["step"] == pytest.approx(step_ms, rel=0.35)  # fitted on this very run
    assert get_hardware("H100").name == "H100" and not prepare(Inputs(str(run_dir), "H100")).sim.k


def test_a_step_needing_more_slots_than_resident_goes_through_a_transient_buffer():
    """As the engine's offloading store does: the missing slots fetched, the resident ones copied,
    and the cache keeps what it held."""
    st = OffloadState(capacity=2, eviction="lru", depth=0)
    sizes = [10.0, 10.0, 10.0, 10.0]
    assert st.step(0, 0, [0, 1], sizes, 1.0, 0.0) == 20.0  # two misses fill the cache
    stall = st.step(0, 0, [0, 1, 2, 3], sizes, 1.0, 0.0, copy_bw=4.0)
    assert stall == pytest.approx(20.0 / 1.0 + 20.0 / 4.0)  # 2 fetched over the host link, 2 copied
    assert list(st.caches[(0, 0)].resident) == [0, 1] and st.misses == 4 and st.needs == 6
    assert st.step(0, 0, [1], sizes, 1.0, 0.0) == 0.0  # still resident
