"""A new study runs reference deployments first (seeds.py): the shapes a cluster engineer tries by hand,
each valid in the space, so that a small trial budget finds a feasible point where random starts do not."""

import csv
from pathlib import Path

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.memory import HEADROOM
from moetune.search.study.evaluate import SimulateEvaluator
from moetune.search.study.repair import repair
from moetune.search.study.optuna_study import Constraints, StudySettings
from moetune.search.study.run import SearchSettings, run_search
from moetune.search.study.seeds import reference_seeds
from moetune.search.study.setup import Inputs, prepare
from moetune.search.study.space import build_space, prune
from tests.cli_run import moetune

ROOT = Path(__file__).resolve().parents[2]
DSV3 = str(ROOT / "recipes/scale/deepseek-v3.json")
SLO = Constraints(max_ttft_ms=1000.0, max_tpot_ms=50.0)


def _inputs(run_dir, config="deepseek-v3.json", hardware="8xH200", concurrency=64, output_len=256) -> Inputs:
    return Inputs(str(run_dir), hardware, scale_model=str(ROOT / "recipes/scale" / config), input_len=1024,
                  output_len=output_len, concurrency=concurrency)


def _seeds(inputs: Inputs, overrides: dict | None = None):
    setup = prepare(inputs)
    space = build_space(setup.source.model.E, setup.hardware.max_ranks, overrides=overrides)
    rule = SimulateEvaluator(setup.sim, setup.workload).memory_rule()
    return space, setup, reference_seeds(space, setup.limits(), setup.hardware.ranks_per_node, rule)


def _deployment(params: dict) -> Deployment:
    return Deployment(**{**Deployment().as_dict(), **params})


def test_the_seeds_are_points_of_the_space_that_prune_passes(run_dir):
    space, setup, seeds = _seeds(_inputs(run_dir))
    assert [s.name for s in seeds] == ["ep-node", "wide-ep", "dp-attention"]  # DeepSeek-V3 needs a whole node: no
    # replicas seed, no narrower mesh
    domains = {k.name: k.values for k in space.knobs}
    for s in seeds:
        assert set(s.params) == set(domains) and all(v in domains[k] for k, v in s.params.items()), s
        d, _ = repair(_deployment(s.params), 256, 8)
        assert prune(d, setup.limits()) is None and setup.sim.memory_reason(d) is None, s
    node, wide, mesh = (s.params for s in seeds)
    assert (mesh["attn_dp"], mesh["ep_size"], mesh["expert_tp_size"], mesh["moe_a2a"]) == (8, 1, 8, 0)
    assert mesh["max_num_seqs"] == 8  # 64 in flight over 8 attention DP ranks
    assert node["ep_size"] == wide["ep_size"] == 8 and node["placement"] == wide["placement"] == "eplb"
    assert wide["redundant_experts"] == 32 and wide["quant_low_format"] == wide["dense_format"] == "fp8"
    assert (node["max_num_batched_tokens"], wide["max_num_batched_tokens"]) == (512, 256)
    assert wide["max_num_seqs"] == 8  # 64 in flight over 8 ranks


def test_on_two_nodes_a_disaggregated_seed_runs_the_peers_deepseek_v3_shape(run_dir):
    """16×H200: one prefill and one decode worker, each attention DP 8 × experts TP 8 (AIConfigurator's best
    DeepSeek-V3 deployment there); with the load found per trial the decode worker holds both nodes' share."""
    inputs = _inputs(run_dir, hardware="16xH200", concurrency=256)
    space, setup, seeds = _seeds(inputs)
    names = [s.name for s in seeds]
    assert names[-1] == "disagg-dp-attention" and "dp-attention" in names, names
    p = seeds[-1].params
    assert (p["prefill_workers"], p["decode_workers"], p["prefill_ep"], p["prefill_tp"], p["prefill_expert_tp"]) == \
        (1, 1, 1, 1, 8)
    assert (p["attn_dp"], p["ep_size"], p["expert_tp_size"], p["moe_a2a"], p["replicas"]) == (8, 1, 8, 0, 1)
    assert p["max_num_seqs"] == 32  # 256 in flight over the decode worker's 8 DP ranks
    mesh = next(s for s in seeds if s.name == "dp-attention").params
    assert (mesh["replicas"], mesh["max_num_seqs"]) == (2, 32)  # 256 per replica (each replica's, not split)
    d, _ = repair(_deployment(p), 256, 16, True)
    assert prune(d, setup.limits()) is None and setup.sim.memory_reason(d) is None
    rule = SimulateEvaluator(setup.sim, setup.workload).memory_rule()
    found = reference_seeds(space, setup.limits(), 8, rule, load_per_gpu=True)
    assert found[-1].name == "disagg-dp-attention" and found[-1].params["max_num_seqs"] == 64  # 2 × 256 / 8
    one_node = [s.name for s in _seeds(_inputs(run_dir))[2]]
    assert not any(n.startswith("disagg") for n in one_node)  # the disaggregated form is searched on 2+ nodes


def test_a_small_model_gets_the_most_replicas_and_a_tp_seed_only_where_tp_is_searched(run_dir):
    _, _, seeds = _seeds(_inputs(run_dir, "mixtral-8x7b.json"))
    assert [s.name for s in seeds] == ["replicas", "replicas-own-experts", "ep-node", "wide-ep", "dp-attention",
                                       "dp-attention-4", "dp-attention-2"]
    assert (seeds[0].params["ep_size"], seeds[0].params["replicas"]) == (1, 8)
    assert (seeds[0].params["quant_low_format"], seeds[1].params["quant_low_format"]) == ("fp8", "none")
    assert {k: v for k, v in seeds[1].params.items() if k != "quant_low_format"} == \
        {k: v for k, v in seeds[0].params.items() if k != "quant_low_format"}
    meshes = {s.name: (s.params["attn_dp"], s.params["expert_tp_size"], s.params["replicas"]) for s in seeds[4:]}
    assert meshes == {"dp-attention": (8, 8, 1), "dp-attention-4": (4, 4, 2), "dp-attention-2": (2, 2, 4)}
    groups = {"tp_size": [1, 2, 4, 8], "expert_tp_size": [1, 2, 4, 8]}
    _, setup, seeds = _seeds(_inputs(run_dir, "mixtral-8x7b.json"), groups)
    tp = seeds[-1]
    assert tp.name == "tp" and (tp.params["tp_size"], tp.params["expert_tp_size"], tp.params["replicas"]) == (2, 2, 4)
    assert setup.sim.memory_reason(_deployment(tp.params)) is None
    _, _, seeds = _seeds(_inputs(run_dir, "mixtral-8x7b.json"), {**groups, "tp_size": [1, 8]})
    assert seeds[-1].name == "tp" and seeds[-1].params["tp_size"] == 8  # only values the space holds


def test_a_seeded_deepseek_v3_study_on_8_h200_runs_the_seeds_first_and_finds_a_feasible_one(run_dir, tmp_path):
    inputs = _inputs(run_dir)
    _, _, seeds = _seeds(inputs)
    out = tmp_path / "dsv3"
    st = StudySettings("d", f"sqlite:///{out / 'study.db'}", ("throughput_per_gpu",), "tpe", len(seeds), 0, SLO)
    result = run_search(SearchSettings(inputs, st, out, "simulate"))
    assert [r.seeded for r in result.rows] == [s.name for s in seeds]
    assert [r.params for r in result.rows] == [{k: v for k, v in s.params.items() if k in r.params}  # moot knobs
                                               for r, s in zip(result.rows, seeds)]  # are not drawn (optuna_study.moot)
    assert all(r.state == "COMPLETE" for r in result.rows)
    assert result.winner is not None and result.winner.feasible and result.winner.seeded is not None
    assert result.winner.metrics["peak_mem_gb"] < 141 * HEADROOM
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [r["seeded"] for r in rows] == [s.name for s in seeds]


def test_no_reference_trials_turns_them_off(run_dir, tmp_path):
    def search(out, *extra):
        got = moetune("search", "--trace", str(run_dir), "--hardware", "8xH200", "--n-trials", "3", "--out", str(out),
                      "--num-requests", "16", *extra)
        assert got.returncode == 0, got.stderr
        return [r["seeded"] for r in csv.DictReader((out / "trials.csv").open())]

    assert search(tmp_path / "on")[0] == "replicas"
    assert search(tmp_path / "off", "--no-reference-trials") == ["", "", ""]
