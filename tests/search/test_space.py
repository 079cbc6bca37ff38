"""Pruning rules and the knob table (pure: no model, no trace)."""

import pytest

from moetune.search.study.deploy_knobs import DEPLOY_KNOBS

from moetune.search.study.space import (Deployment, canonical, Limits, SpaceError, build_space, default_knobs, prune, recipe_accepts,
                                  to_config, from_config)
from moetune.config import RunConfig

LIM = Limits(num_experts=16, top_k=2, max_ranks=8, requests=64)


@pytest.mark.parametrize("d, fragment", [
    (Deployment(ep_size=16), "needs more ranks"),
    (Deployment(ep_size=3), "does not divide the 16 experts + 0"),
    (Deployment(ep_size=4, redundant_experts=2), "does not divide"),
    (Deployment(ep_size=2, max_num_seqs=32, max_num_batched_tokens=16), "not one decode"),
    (Deployment(max_num_seqs=8, offload_resident_fraction=0.05), "cannot hold one token's 2 experts"),
    (Deployment(ep_size=2, offload_resident_fraction=0.5), "offload with ep_size 2 is not supported yet"),
])
def test_each_invalid_combination_is_pruned_with_its_reason(d, fragment):
    reason = prune(d, LIM)
    assert reason is not None and fragment in reason, reason


@pytest.mark.parametrize("d", [
    Deployment(), Deployment(ep_size=2, redundant_experts=2, placement="eplb", max_num_seqs=32),
    Deployment(ep_size=4, redundant_experts=4, placement="round_robin", max_num_seqs=16, max_num_batched_tokens=256),
    Deployment(quant_low_format="int4", quant_hot_fraction=0.25),
    Deployment(max_num_seqs=32, offload_resident_fraction=0.5, offload_prefetch_depth=1, offload_eviction="lfu"),
])
def test_valid_combinations_pass(d):
    assert prune(d, LIM) is None


@pytest.mark.parametrize("d, twin, fragment", [
    (Deployment(redundant_experts=2, placement="eplb"), Deployment(), "at ep_size 1"),
    (Deployment(ep_size=2, max_num_seqs=256), Deployment(ep_size=2, max_num_seqs=32), "runs the same as 32"),
    (Deployment(quant_hot_fraction=0.25), Deployment(), "hot fraction is moot"),
    (Deployment(offload_prefetch_depth=2, offload_eviction="lfu"), Deployment(), "prefetch and eviction are moot"),
])
def test_moot_knobs_map_a_point_onto_its_twin(d, twin, fragment):
    got, notes = canonical(d, LIM)
    assert got == twin and any(fragment in n for n in notes), notes
    assert canonical(twin, LIM) == (twin, [])


def test_every_knob_has_a_recipe_key_so_every_knob_is_searched():
    assert recipe_accepts("quant.low") and recipe_accepts("offload.prefetch_depth")  # optional sections
    assert recipe_accepts("parallel.ep_size") and not recipe_accepts("quant.warp") and not recipe_accepts("x.y")
    plain = {k.name for k in build_space(16, 8).knobs}
    named_only = {"capacity_policy", "capacity_factor", "scheduling", "offload_hints", "speculative"}  # when named
    named_only |= set(DEPLOY_KNOBS) - {"attn_dp", "moe_a2a"}  # meshes unnamed on 2+ GPUs; disaggregation
    # unnamed from 16 GPUs (deploy_knobs.py)
    assert plain == {k.name for k in default_knobs(16, 8)} - named_only
    assert plain == {k.name for k in build_space(16, 8, what_if=True).knobs}


def test_space_file_narrows_and_fixes_knobs():
    space = build_space(16, 8, overrides={"ep_size": [1, 2], "placement": "eplb", "max_num_seqs": 8})
    grid = space.grid()
    assert grid["ep_size"] == [1, 2] and grid["placement"] == ["eplb"] and grid["max_num_seqs"] == [8]
    assert space.size() == 2 * 4 * 9 * 1 * 1 * 7 * (4 * 4) * (4 * 4 * 2) * (2 * 2 * 2) * 4 * 5 * 2  # replicas: 1, 2, 4, 8
    # expert TP 1, 2, 4, 8; attention DP 0 (the parallel mesh), 1, 2, 4, 8; all-to-all or all-gather
    # of 8 GPUs; the serving engines' knobs (dense, KV, overlap: priced, build_space's default; CUDA graphs one value)
    assert grid["cuda_graph_max_bs"] == [512]
    with pytest.raises(SpaceError, match="unknown knob 'ep'"):
        build_space(16, 8, overrides={"ep": 2})
    with pytest.raises(SpaceError, match="not one of"):
        build_space(16, 8, overrides={"placement": "random"})
    with pytest.raises(SpaceError, match="non-negative"):
        build_space(16, 8, overrides={"ep_size": -2})


def test_grid_covers_at_least_500_points_for_the_bundled_model():
    assert build_space(16, 8).size() >= 500


def test_a_deployment_round_trips_through_a_recipe():
    d = Deployment(ep_size=2, redundant_experts=4, placement="round_robin", max_num_seqs=16,
                   max_num_batched_tokens=1024)
    cfg = to_config(RunConfig(), d)
    assert (cfg.parallel.ep_size, cfg.parallel.redundant_experts, cfg.engine.max_num_seqs) == (2, 4, 16)
    assert from_config(cfg) == d


def test_quant_and_offload_knobs_become_recipe_sections(checkpoint, tmp_path):
    base = RunConfig.model_validate({"model": {"path": str(checkpoint("mixtral"))}})
    d = Deployment(quant_low_format="int8", offload_resident_fraction=0.5, offload_prefetch_depth=2,
                   offload_eviction="lfu")
    cfg = to_config(base, d)
    assert cfg.quant.experts == "int8" and cfg.quant.hot_fraction is None
    from moetune.model.validate import read_spec

    E = read_spec(checkpoint("mixtral")).moe.num_experts
    assert (cfg.offload.resident_experts, cfg.offload.prefetch_depth, cfg.offload.policy) == (-(-E // 2), 2, "lfu")
    assert from_config(cfg) == d
    hot = Deployment(quant_low_format="int4", quant_hot_fraction=0.25)
    with pytest.raises(Exception, match="run directory"):
        to_config(base, hot)  # a hot fraction ranks experts by a trace's loads
    cfg = to_config(base, hot, loads=str(tmp_path))
    assert (cfg.quant.hot_fraction, cfg.quant.high, cfg.quant.low, cfg.quant.loads) == (0.25, "fp32", "int4-g64",
                                                                                          str(tmp_path))
    assert from_config(cfg) == hot
    neutral = to_config(base.model_copy(update={"quant": cfg.quant}), Deployment())
    assert neutral.quant == cfg.quant and neutral.offload is None  # neutral knobs keep the recipe's own sections


def test_dense_int8_is_a_recipes_quant_dense_both_ways(checkpoint):
    """dense_format int8 (never searched) is `quant.dense: int8`: written beside the experts' part or
    alone, and read back from a recipe, so `simulate --recipe` prices what the recipe runs."""
    from moetune.search.cost.calibrate import variant_key

    base = RunConfig.model_validate({"model": {"path": str(checkpoint("mixtral"))}})
    alone = Deployment(dense_format="int8")
    cfg = to_config(base, alone)
    assert (cfg.quant.dense, cfg.quant.experts, cfg.quant.hot_fraction) == ("int8", None, None)
    assert from_config(cfg) == alone
    both = Deployment(quant_low_format="int8", dense_format="int8")
    cfg = to_config(base, both)
    assert (cfg.quant.dense, cfg.quant.experts) == ("int8", "int8") and from_config(cfg) == both
    assert to_config(base, Deployment(dense_format="fp8")).quant is None  # fp8: the GPU engines' flag only
    assert variant_key(alone) == "dense-int8" and variant_key(both) == "dense-int8,int8"
    assert variant_key(Deployment(dense_format="fp8")) is None


def test_tp_knobs_prune_what_the_engine_cannot_split():
    """The engine's rules (model/tp_check.py, config.py) on the simulator's sizes: each size 1 or the
    group G, the mesh ep_size × G within the hardware, G dividing heads, vocab and intermediates."""
    from moetune.search.cost.simmodel import SimModel

    m = SimModel("t", D=64, E=16, K=2, I=20, I_shared=0, L=2, moe_layers=(0, 1), dense_I=(), V=320,
                 attn_weights=1, kv_elems=1, pair_flops=1, tied=False, kv_heads=2, heads=4)
    lim = Limits(num_experts=16, top_k=2, max_ranks=8, requests=64, model=m)
    cases = {
        Deployment(tp_size=2, expert_tp_size=4): "must each be 1 or the group size 4",
        Deployment(ep_size=4, tp_size=4): "ep_size 4 × tp group 4 = 16 ranks; the hardware has 8",
        Deployment(tp_size=8): "tp_size 8 does not divide the attention heads (4)",
        Deployment(expert_tp_size=8): "expert_tp_size 8 does not divide the expert intermediate size (20)",
        Deployment(ep_size=2, tp_size=2, replicas=4): "4 replicas × ep_size 2 × tp group 2 need 16 GPUs",
        Deployment(ep_size=2, tp_size=2, replicas=2): None,  # 2 × 2 × 2 = the 8 GPUs
        Deployment(ep_size=2, tp_size=4, expert_tp_size=4): None,  # 4 > 2 KV heads: each held by 2 ranks
        Deployment(tp_size=1, expert_tp_size=2): None,  # experts alone split
    }
    for d, want in cases.items():
        got = prune(d, lim)
        assert (got is None) if want is None else (got is not None and want in got), (d.label(), got)


def test_tp_knobs_are_fixed_at_the_base_recipe_unless_the_space_names_them():
    fixed = {"tp_size": 2, "expert_tp_size": 2}
    for priced in (False, True):  # priced on GPUs: expert TP searched for the general meshes (space.GPU_MESH)
        grid = build_space(16, 8, priced=priced, fixed=fixed).grid()
        assert grid["tp_size"] == [2] and grid["expert_tp_size"] == ([1, 2, 4, 8] if priced else [2])
    asked = build_space(16, 8, priced=False, fixed=fixed, overrides={"tp_size": [1, 2, 4, 8]}).grid()
    assert asked["tp_size"] == [1, 2, 4, 8] and asked["expert_tp_size"] == [2]
    assert build_space(16, 8).grid()["tp_size"] == [1]  # no base recipe: one rank per group



def test_capacity_scheduling_and_hint_knobs_are_searched_only_when_the_space_names_them():
    """Off by default (the default grid is the one before them), searched when named, else the base
    recipe's values where those are not the neutral ones."""
    names = {"capacity_policy", "capacity_factor", "scheduling", "offload_hints"}
    assert not names & set(build_space(16, 8).grid())
    assert build_space(16, 8).size() == build_space(16, 8, fixed={"scheduling": "fcfs"}).size()
    asked = build_space(16, 8, overrides={"capacity_policy": ["none", "drop", "buffer"], "capacity_factor": [1, 1.5],
                                          "scheduling": ["fcfs", "affinity"]}).grid()
    assert asked["capacity_policy"] == ["none", "drop", "buffer"] and asked["capacity_factor"] == [1.0, 1.5]
    assert asked["scheduling"] == ["fcfs", "affinity"] and "offload_hints" not in asked
    fixed = build_space(16, 8, fixed={"capacity_policy": "buffer", "capacity_factor": 1.25, "scheduling": "fcfs"})
    assert fixed.grid()["capacity_policy"] == ["buffer"] and fixed.grid()["capacity_factor"] == [1.25]
    assert "scheduling" not in fixed.grid()
    with pytest.raises(SpaceError, match="must be positive"):
        build_space(16, 8, overrides={"capacity_factor": 0})
    with pytest.raises(SpaceError, match="not one of"):
        build_space(16, 8, overrides={"scheduling": "priority"})


@pytest.mark.parametrize("d, twin, fragment", [
    (Deployment(capacity_factor=1.5), Deployment(), "the factor is moot"),
    (Deployment(offload_hints="history"), Deployment(), "the hint source is moot"),
    (Deployment(max_num_seqs=32, offload_resident_fraction=0.5, offload_hints="both"),
     Deployment(max_num_seqs=32, offload_resident_fraction=0.5), "the hint source is moot"),  # prefetch depth 0
])
def test_a_moot_capacity_factor_or_hint_source_maps_onto_its_twin(d, twin, fragment):
    got, notes = canonical(d, LIM)
    assert got == twin and any(fragment in n for n in notes), notes


def test_capacity_scheduling_and_hints_round_trip_through_a_recipe(checkpoint):
    base = RunConfig.model_validate({"model": {"path": str(checkpoint("mixtral"))}})
    d = Deployment(capacity_policy="buffer", capacity_factor=1.25, scheduling="affinity",
                   offload_resident_fraction=0.5, offload_prefetch_depth=1, offload_hints="history")
    cfg = to_config(base, d)
    assert (cfg.parallel.capacity_policy, cfg.parallel.capacity_factor) == ("buffer", 1.25)
    assert (cfg.engine.scheduling, cfg.offload.hints) == ("affinity", "history")
    assert from_config(cfg) == d
    capped = base.model_copy(update={"parallel": cfg.parallel})
    off = to_config(capped, Deployment())  # policy none: the recipe's factor is left as it was (moot)
    assert (off.parallel.capacity_policy, off.parallel.capacity_factor) == ("none", 1.25)
    assert from_config(off) == Deployment()
    neutral = to_config(RunConfig(), Deployment())  # neutral knobs: the base recipe's capacity and scheduling
    assert (neutral.parallel.capacity_policy, neutral.parallel.capacity_factor, neutral.engine.scheduling) == (
        "none", None, "fcfs")


def test_meshes_are_searched_unnamed_on_priced_searches_of_several_gpus():
    """The general meshes (DP attention × TP or EP experts) on GPU hardware without --space naming them;
    not on one GPU, and not where moetune's own engine runs the trials (priced=False)."""
    grid = build_space(256, 8).grid()
    assert grid["attn_dp"] == [0, 1, 2, 4, 8] and grid["moe_a2a"] == [0, 1] and grid["expert_tp_size"] == [1, 2, 4, 8]
    assert "attn_dp" not in build_space(256, 1).grid() and build_space(256, 1).grid()["expert_tp_size"] == [1]
    here = build_space(256, 8, priced=False).grid()
    assert "attn_dp" not in here and here["expert_tp_size"] == [1]


def test_a_sampled_mesh_is_repaired_to_one_the_engines_run_not_pruned():
    """repair.repair → deploy_knobs.repair_mesh: each repaired point passes prune (no budget spent on a refusal)."""
    from moetune.search.study.repair import repair

    lim = Limits(256, 8, 8, 64)
    cases = [(Deployment(attn_dp=4, ep_size=2), dict(attn_dp=2, tp_size=1)),  # DP dividing EP 2's GPUs
             (Deployment(ep_size=8, expert_tp_size=4), dict(expert_tp_size=1)),  # 32 GPUs → 8
             (Deployment(attn_dp=8, expert_tp_size=8, moe_a2a=1), dict(moe_a2a=0, tp_size=1)),  # TP experts gathered
             (Deployment(attn_dp=2, ep_size=8), dict(tp_size=4)),  # attention DP 2 × TP 4 over EP 8's GPUs
             (Deployment(attn_dp=2, expert_tp_size=8), dict(attn_dp=8, tp_size=1)),  # TP 4 beside expert TP 8:
             # no recipe holds it (config.ParallelConfig), the nearest one that does
             (Deployment(expert_tp_size=8), dict(attn_dp=8)),  # attention replicated over the TP group → DP
             (Deployment(attn_dp=8, offload_resident_fraction=0.5, offload_prefetch_depth=2),
              dict(offload_resident_fraction=1.0, offload_prefetch_depth=0))]  # a mesh is priced all resident
    for d, want in cases:
        before = prune(d, lim)
        got, notes = repair(d, 256, 8, meshes=True)
        assert {k: getattr(got, k) for k in want} == want, (d, notes)
        assert prune(got, lim) is None, (got, before)
    assert repair(Deployment(expert_tp_size=8), 256, 8)[0].attn_dp == 0  # no meshes searched: as sampled
