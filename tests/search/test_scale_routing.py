"""--scale-routing: the block mapping (the toy's skew, kept for comparison), the statistics mapping
(each layer's load CV kept, hot experts scattered, co-selection kept) and a real deployment's load
dump (SGLang's recorder .pt in stat and per_token mode, a moetune run directory; vLLM's refused),
down to `moetune simulate` on the command line, which says the routing it priced (balance.py)."""

import numpy as np
import pandas as pd
import pytest

from moetune.errors import MoetuneError
from moetune.profile.rundir import read_run
from moetune.search.cost.scale import (load_cv, parse_scale_routing, rank_imbalance, read_scale_spec,
                                       scale_routing_ids)
from moetune.search.cost.balance import balance_of, balance_sentence, gain_sentence
from moetune.search.cost.scale_loads import read_target_loads
from moetune.search.study.setup import Inputs, prepare
from moetune.search.study.space import Deployment
from tests.cli_run import assert_one_line_error, moetune

QWEN3 = "recipes/scale/qwen3-30b-a3b.json"


def skewed_ids(n: int = 4000, layers: int = 2) -> np.ndarray:
    """[n, layers, 2] picks of 16 experts, expert 0 hottest (a linear popularity 2 .. 0.1)."""
    rng = np.random.default_rng(0)
    p = np.linspace(2, 0.1, 16) / np.linspace(2, 0.1, 16).sum()
    return np.stack([rng.choice(16, 2, replace=False, p=p) for _ in range(n)])[:, None, :].repeat(layers, 1)


def counts(ids: np.ndarray, E: int) -> np.ndarray:
    """[Lm, E] copies per expert of ids [N, Lm, K]."""
    return np.stack([np.bincount(ids[:, j].astype(np.int64).ravel(), minlength=E) for j in range(ids.shape[1])])


def distinct(ids: np.ndarray) -> bool:
    s = np.sort(ids.astype(np.int64), axis=2)
    return not (s[:, :, 1:] == s[:, :, :-1]).any()


def test_blocks_reproduce_the_toys_rank_imbalance_and_stats_do_not(run_dir):
    """blocks: 16 → 256 experts on 8 ranks, each rank holds the groups of the toy rank's two experts,
    so the contiguous rank imbalance is exactly the toy's; stats scatters the hot experts (lower)."""
    ids = read_run(run_dir).trace.topk_ids  # [N, 4, 2] of 16 experts
    spec = read_scale_spec(QWEN3)
    toy = rank_imbalance(counts(ids, 16).astype(float), 8, "contiguous")
    blocks = scale_routing_ids(ids, 16, spec, parse_scale_routing("blocks"))
    stats = scale_routing_ids(ids, 16, spec, parse_scale_routing("stats"))
    assert blocks.shape == stats.shape == (len(ids), 48, 8) and distinct(stats) and distinct(blocks)
    b = rank_imbalance(counts(blocks, 128).astype(float), 8, "contiguous")
    s = rank_imbalance(counts(stats, 128).astype(float), 8, "contiguous")
    assert b == pytest.approx(toy, rel=1e-9)
    assert toy > 1.2 and s < b - 0.1  # the toy's skew is not copied rank for rank


@pytest.mark.parametrize("config,E,K", [(QWEN3, 128, 8), ("recipes/scale/mixtral-8x7b.json", 8, 2)])
def test_balanced_loads_every_expert_equally_with_distinct_picks(config, E, K):
    """balanced (the peer comparison's uniform routing): each layer's copies per expert differ by at most
    one, whatever the source's skew."""
    ids = skewed_ids()
    out = scale_routing_ids(ids, 16, read_scale_spec(config), parse_scale_routing("balanced"))
    c = counts(out, E)
    assert distinct(out) and out.shape[2] == K
    assert (c.max(1) - c.min(1) <= 1).all() and load_cv(c).max() < 0.01


@pytest.mark.parametrize("config,E,K", [(QWEN3, 128, 8), ("recipes/scale/deepseek-v3.json", 256, 8),
                                        ("recipes/scale/mixtral-8x7b.json", 8, 2)])
def test_stats_keep_each_layers_load_cv_with_distinct_picks(config, E, K):
    ids = skewed_ids()
    rng = np.random.default_rng(1)
    ids[:, 1, 0] = rng.integers(0, 16, len(ids))  # layer 1: even picks (CV only the sampling noise)
    ids[:, 1, 1] = (ids[:, 1, 0] + 1 + rng.integers(0, 15, len(ids))) % 16
    spec = read_scale_spec(config)
    out = scale_routing_ids(ids, 16, spec, parse_scale_routing("stats"))
    assert out.shape[2] == K and out.max() < E and distinct(out)
    src = load_cv(counts(ids, 16))  # [2] source layers' CV
    tgt = load_cv(counts(out, E))  # [Lm_tgt]
    src_of = (np.arange(out.shape[1]) * 2) // out.shape[1]
    assert src[0] > 2 * src[1]  # two different skews...
    np.testing.assert_allclose(tgt, src[src_of], rtol=0.10)  # ...each kept in the target layers it feeds


def test_stats_scatter_hot_experts_and_keep_co_selection():
    ids = skewed_ids()
    out = scale_routing_ids(ids, 16, read_scale_spec("recipes/scale/deepseek-v3.json"), parse_scale_routing("stats"))
    load = counts(out, 256)[0]
    hot = np.argsort(-load)[:26]  # the hottest tenth
    assert len(set((hot // 32).tolist())) >= 5  # spread over most of 8 contiguous ranks, not one block
    same = np.where((ids[:, 0] == ids[0, 0]).all(axis=1))[0]  # tokens with token 0's source picks
    other = np.where(~np.isin(ids[:, 0], ids[0, 0]).any(axis=1))[0]  # tokens sharing none of them
    overlap = lambda rows: np.mean([len(set(out[0, 0]) & set(out[r, 0])) for r in rows[1:200]])  # noqa: E731
    assert overlap(same) > 2 * overlap(other)  # shared source experts → shared target experts


def test_placement_gains_are_priced_from_the_generated_loads(run_dir, big_config):
    """The simulator's loads (EPLB's input) are the generated ids' counts; contiguous, round-robin and
    EPLB imbalances differ between blocks and stats (no particular gain asserted)."""
    figures = {}
    for routing in ("blocks", "stats"):
        setup = prepare(Inputs(str(run_dir), "8xH200", scale_model=str(big_config), num_requests=16, input_len=64,
                               output_len=8, scale_routing=routing))
        src = setup.source
        assert src.scale_routing == routing
        generated = counts(np.concatenate([src.prefill_ids, src.decode_ids]), 256)
        np.testing.assert_array_equal(src.loads, generated)
        figures[routing] = [setup.sim.evaluate(Deployment(ep_size=8, max_num_seqs=8, placement=p)).detail["rank_imbalance"]
                            for p in ("contiguous", "round_robin", "eplb")]
    assert all(v >= 1.0 for f in figures.values() for v in f)
    assert figures["blocks"] != figures["stats"]


def test_the_estimate_says_its_routing_and_how_much_of_a_gain_is_imbalance(run_dir, big_config):
    """balance.py: the step with perfect balance is the priced step minus the straggler wait (the
    slowest rank over the mean one), 1 rank has none; the winner's gain splits into less straggler
    wait and the rest, and both sentences name the routing (blocks here: the toy's skew)."""
    setup = prepare(Inputs(str(run_dir), "8xH200", scale_model=str(big_config), num_requests=16, input_len=64,
                           output_len=8, scale_routing="blocks"))
    evaluate = lambda **kw: setup.sim.evaluate(Deployment(max_num_seqs=8, **kw))  # noqa: E731
    cont, eplb, one = evaluate(ep_size=8, placement="contiguous"), evaluate(ep_size=8, placement="eplb"), evaluate()
    bc, be, b1 = balance_of(cont), balance_of(eplb), balance_of(one)
    dec = cont.phases_ms["decode"]
    assert bc.kind == "decode" and bc.step_ms == dec["step"]
    assert bc.balanced_ms == pytest.approx(dec["step"] - dec["straggler_wait"])
    assert bc.rank_imbalance == cont.detail["rank_imbalance"] > be.rank_imbalance > 1.0
    assert 0 < bc.imbalance_share < 1 and b1.rank_imbalance == 1.0
    assert (bc.step_ms - bc.balanced_ms) > (be.step_ms - be.balanced_ms)  # EPLB waits less on the slowest rank
    line = balance_sentence(eplb)
    assert "routing scaled by blocks" in line and f"{be.rank_imbalance:.2f}" in line and "perfect balance" in line
    assert "trace's own routing" in balance_sentence(
        prepare(Inputs(str(run_dir), "8xH200", num_requests=4, input_len=16, output_len=4)).sim.evaluate(Deployment()))
    gain = gain_sentence(eplb, cont)
    saved, less_wait = bc.step_ms - be.step_ms, (bc.step_ms - bc.balanced_ms) - (be.step_ms - be.balanced_ms)
    assert gain is not None and f"{saved:.4g} ms" in gain and f"{less_wait:.4g} ms" in gain and "blocks" in gain
    assert gain_sentence(cont, eplb) is None  # no saving, nothing to split


def sglang_dump(path, layers: int, E: int, hot: int = 5, dense: int = 1):
    """An SGLang stat-mode dump: logical_count [passes, model layers, experts], dense layers zero."""
    import torch

    count = torch.ones((3, layers, E), dtype=torch.int32)
    count[:, :, hot] = 400
    count[:, :dense] = 0
    torch.save({"rank": 0, "logical_count": count, "average_utilization_rate_over_window": None}, path)
    return path


def test_sglang_dump_and_run_directory_give_the_loads_the_picks_follow(tmp_path, big_config):
    spec = read_scale_spec(big_config)  # 6 layers, MoE layers 1..5, 256 experts, top-8
    moe = list(spec.moe_layers)
    loads = read_target_loads(sglang_dump(tmp_path / "d.pt", 6, 256), moe, 256, 6)
    assert loads.shape == (5, 256) and loads[:, 5].tolist() == [1200.0] * 5
    rows = [(0, "decode", layer, e, 50 if e == 9 else 1) for layer in moe for e in range(256)]
    run = tmp_path / "served"
    run.mkdir()
    pd.DataFrame(rows, columns=["step", "kind", "layer", "expert", "tokens"]).to_parquet(run / "expert_load.parquet")
    assert read_target_loads(run, moe, 256, 6)[:, 9].tolist() == [50.0] * 5
    ids = skewed_ids(2000, 2)
    out = scale_routing_ids(ids, 16, spec, parse_scale_routing(f"loads:{tmp_path / 'd.pt'}"))
    assert distinct(out) and (counts(out, 256).argmax(axis=1) == 5).all()
    share = counts(out, 256)[:, 5] / 2000  # inclusion of the hot expert: 1200 / (1200 + 255·3) · 8 → capped at 1
    assert share.min() > 0.95
    with pytest.raises(MoetuneError, match="holds 6 layers × 128 experts; the target model has 5 MoE layers"):
        read_target_loads(sglang_dump(tmp_path / "e.pt", 6, 128, dense=0), moe, 256, 7)
    with pytest.raises(MoetuneError, match="not one of"):
        parse_scale_routing("eplb")


def sglang_per_token_dump(path, layers: int, E: int, redundant: int = 8, passes: int = 3, seed: int = 0):
    """An SGLang per_token dump as `_DetailAccumulator.dump` writes it: records of forward passes, each
    topk_ids_of_layer int32 [model layers, tokens, 8] of *physical* ids (E logical + `redundant`
    replicas of logical expert 5, the last `redundant` slots), -1 padding, and the map back."""
    import torch

    rng = np.random.default_rng(seed)
    P = E + redundant
    p2l = torch.cat([torch.arange(E), torch.full((redundant,), 5)]).repeat(layers, 1)  # [L, P]
    records = []
    for i in range(passes):
        T = 7 + i
        topk = torch.full((layers, T, 8), -1, dtype=torch.int32)
        for layer in range(layers):
            for t in range(T):
                picks = rng.choice(P, 8 if t % 3 else 6, replace=False)  # every third token: 2 slots padded
                topk[layer, t, :len(picks)] = torch.as_tensor(picks)
        records.append(dict(forward_pass_id=i, rank=0, gatherer_key="primary", input_ids=list(range(T)),
                            positions=list(range(T)), extend_seq_lens=[T], forward_mode=1,
                            topk_ids_of_layer=topk, misc_objects=[], global_physical_count=torch.zeros(layers, P)))
    torch.save({"records": records, "last_physical_to_logical_map": p2l}, path)
    return path, records, p2l


def sglang_reference_counts(records, p2l, E: int) -> np.ndarray:
    """[L, E] the way SGLang itself folds them: `_convert_per_token_to_global_physical_count` (a
    scatter_add of the non-negative ids per layer) then physical → logical by the map (stat mode's
    `_convert_global_physical_count_to_logical_count`)."""
    import torch

    L, P = p2l.shape
    total = torch.zeros((L, E), dtype=torch.int64)
    for rec in records:
        ids = rec["topk_ids_of_layer"].reshape(L, -1)
        mask = ids != -1
        phys = torch.zeros((L, P), dtype=torch.int64).scatter_add_(1, ids.masked_fill(~mask, 0).long(), mask.long())
        total.scatter_add_(1, p2l.long(), phys)
    return total.numpy().astype(float)


def test_sglang_per_token_dump_counts_each_pick_on_its_logical_expert(tmp_path, big_config):
    spec = read_scale_spec(big_config)  # 6 layers, MoE layers 1..5, 256 experts
    moe = list(spec.moe_layers)
    path, records, p2l = sglang_per_token_dump(tmp_path / "expert_distribution_recorder_1.5_0.pt", 6, 256)
    loads = read_target_loads(path, moe, 256, 6)
    want = sglang_reference_counts(records, p2l, 256)[moe]
    assert loads.shape == (5, 256) and np.array_equal(loads, want)
    picks = sum(int((r["topk_ids_of_layer"][1] >= 0).sum()) for r in records)
    assert loads[0].sum() == picks  # padding (-1) is not a pick; replicas fold onto expert 5
    assert loads[:, 5].min() > loads[:, 6:].mean(axis=1).max()
    (tmp_path / "window.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(MoetuneError, match="vLLM writes no expert-load file"):
        read_target_loads(tmp_path / "window.safetensors", moe, 256, 6)
    import torch

    torch.save({"records": [{"rank": 0}]}, tmp_path / "bad.pt")
    with pytest.raises(MoetuneError, match="without topk_ids_of_layer"):
        read_target_loads(tmp_path / "bad.pt", moe, 256, 6)


def test_simulate_command_with_a_loads_dump_end_to_end(run_dir, big_config, tmp_path):
    dump = sglang_dump(tmp_path / "expert_distribution_recorder_1.pt", 6, 256)
    common = ("simulate", "--trace", str(run_dir), "--hardware", "8xH200", "--scale-model", str(big_config),
              "--input-len", "64", "--output-len", "8", "--num-requests", "16", "--recipe")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {path: stdlib-moe}\nparallel: {ep_size: 8, placement: round_robin}\n")
    r = moetune(*common, str(recipe), "--scale-routing", f"loads:{dump}")
    assert r.returncode == 0, r.stderr
    assert "estimated" in r.stdout and "dispatch" in r.stdout
    assert f"routing scaled by loads:{dump}" in " ".join(r.stdout.split()) and "perfect balance" in r.stdout
    bad = sglang_dump(tmp_path / "bad.pt", 6, 64)
    assert_one_line_error(moetune(*common, str(recipe), "--scale-routing", f"loads:{bad}"),
                          "holds 5 layers × 64 experts; the target model has 5 MoE layers (of 6 layers) × 256 experts")
    (tmp_path / "vllm.safetensors").write_bytes(b"\0" * 16)
    assert_one_line_error(moetune(*common, str(recipe), "--scale-routing", f"loads:{tmp_path / 'vllm.safetensors'}"),
                          "vLLM writes no expert-load file")
    assert_one_line_error(moetune("simulate", "--trace", str(run_dir), "--scale-routing", "blocks"),
                          "--scale-routing needs --scale-model")
