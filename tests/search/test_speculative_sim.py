"""Speculative decoding in the cost model and the search (search/cost/speculative.py): a verify step's
B·(k + 1) rows priced through attention, the MoE layers (the experts the trace's rows wake at that
row count) and the LM head, the drafter's passes, the accepted tokens per step from the measured or
assumed acceptance; the `speculative` knob of the space, pruned where the engine cannot run it."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from moetune.config import parse_config
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.schedule import SimWorkload, simulate_schedule
from moetune.search.cost.simmodel import SimModel
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.source import TraceSource
from moetune.search.cost.speculative import (expected_prefix, make_plan, parse_knob, per_token_acceptance,
                                             plan_reason)
from moetune.search.study.space import Limits, SpaceError, build_space, from_config, prune, to_config
from tests.search.test_capacity_knobs import FIXED, skewed_rows

# a model whose batch-1 decode reads far more bytes than it computes (memory-bound on an H200) and
# whose batch-256 verify computes more than it reads (compute-bound): 64 experts, top-6
BIG = SimModel("big", D=4096, E=64, K=6, I=1408, I_shared=2816, L=8, moe_layers=tuple(range(8)), dense_I=(),
               V=32000, attn_weights=4096 * 4 * 4096, kv_elems=2 * 8 * 128, pair_flops=4 * 32 * 128, tied=False,
               kv_heads=8, heads=32)


def source(batch: int, decode_rows: np.ndarray | None = None, spec_summary: dict | None = None) -> TraceSource:
    rng = np.random.default_rng(5)
    pre = skewed_rows(rng, 160, BIG.E, BIG.K, BIG.Lm)
    dec = skewed_rows(rng, 400, BIG.E, BIG.K, BIG.Lm) if decode_rows is None else decode_rows
    loads = np.ones((BIG.Lm, BIG.E))
    return TraceSource(Path("synthetic"), BIG, pre, dec, loads, SimWorkload((64,) * batch, 32), batch_size=batch,
                       recorded_on="cpu", model_path=None, speculative=spec_summary)


def tok_s(batch: int, speculative: str, acceptance: float | None, decode_rows=None) -> float:
    sim = Simulator(source(batch, decode_rows), BUILTIN["H200"])
    sim.spec_acceptance = acceptance
    return sim.evaluate(Deployment(max_num_seqs=batch, speculative=speculative)).output_tok_s


def test_speculation_gains_at_batch_one_and_less_at_a_large_batch_and_acceptance_zero_always_loses():
    gain = {B: tok_s(B, "ngram:4", 0.6) / tok_s(B, "none", None) for B in (1, 256)}
    assert gain[1] > 1.2  # memory-bound: 5 rows cost little more than 1
    assert 1.0 <= gain[256] < gain[1]  # compute-bound: the rows cost FLOPs, the experts woken are most of E
    for B in (1, 16, 256):
        assert tok_s(B, "ngram:4", 0.0) < tok_s(B, "none", None), B  # k rows computed for nothing


def test_the_experts_woken_come_from_the_trace_at_the_verify_row_count():
    """A trace whose decode tokens all route to the same experts wakes no more experts in a verify
    step: speculation gains more there than on a trace whose rows spread over the experts."""
    rng = np.random.default_rng(1)
    same = np.repeat(skewed_rows(rng, 1, BIG.E, BIG.K, BIG.Lm), 400, axis=0)
    spread = tok_s(1, "ngram:4", 0.6) / tok_s(1, "none", None)
    shared = tok_s(1, "ngram:4", 0.6, same) / tok_s(1, "none", None, same)
    assert shared > spread * 1.1


def test_a_verify_schedule_emits_every_token_in_fewer_steps_within_the_budget():
    w = SimWorkload((40, 9, 30), 12)
    plain = simulate_schedule(w, 1, 4, 64)
    plan = make_plan("ngram:3", None, 0.7)
    s = simulate_schedule(w, 1, 4, 64, True, plan)
    assert s.sampled.sum() == plain.sampled.sum() == 3 * 12
    assert s.num_steps < plain.num_steps and (s.prefill + s.decode).max() <= 64
    assert (s.decode >= s.drafting).all() and s.drafting.sum() > 0
    assert (s.logits >= s.sampled).all()  # a verify's LM head runs on all its rows
    zero = simulate_schedule(w, 1, 4, 64, True, make_plan("ngram:3", None, 0.0))
    assert zero.num_steps == plain.num_steps  # nothing accepted: one token a step, as without speculation


def test_acceptance_is_measured_from_a_matching_profile_else_assumed_else_refused():
    assert per_token_acceptance(expected_prefix(0.55, 3.5), 3.5) == pytest.approx(0.55, abs=1e-6)
    prof = {"enabled": True, "method": "ngram:4", "verified": 100, "draft_tokens": 400, "accepted_tokens": 150,
            "acceptance_rate": 0.375}
    plan = make_plan("ngram:2", prof, 0.9)
    assert plan.source.startswith("measured") and expected_prefix(plan.p, 4) == pytest.approx(1.5, rel=1e-6)
    assumed = make_plan("draft:/d:2", prof, 0.9)  # another speculator's acceptance does not transfer
    assert assumed.source.startswith("assumed") and assumed.p == 0.9
    assert "--spec-acceptance" in plan_reason("mtp:2", prof, None)
    assert plan_reason("ngram:4", prof, None) is None and make_plan("none", None, None) is None


def test_the_knob_parses_prunes_mtp_without_layers_and_writes_engine_speculative():
    space = build_space(8, 1, overrides={"speculative": ["none", "ngram:4", "mtp:1", "draft:stdlib-moe:2"]})
    assert dict(space.grid())["speculative"] == ["none", "ngram:4", "mtp:1", "draft:stdlib-moe:2"]
    assert "speculative" not in build_space(8, 1).grid()  # opt-in: a default space is the grid it was
    with pytest.raises(SpaceError, match="speculative"):
        build_space(8, 1, overrides={"speculative": ["ngram:0"]})
    lim = Limits(8, 2, 8, 16)
    assert prune(Deployment(tp_size=2, speculative="ngram:4"), lim) is None  # the engine verifies on a TP group
    assert prune(Deployment(tp_size=2, speculative="mtp:1"), replace(lim, mtp_layers=1)) is None
    assert "MTP layers" in prune(Deployment(speculative="mtp:2"), lim)
    assert prune(Deployment(speculative="ngram:4"), lim) is None
    base = parse_config({"model": {"path": "stdlib-moe", "device": "cpu"}})
    cfg = to_config(base, Deployment(speculative="ngram:4"))
    assert cfg.engine.speculative == "ngram:4" and from_config(cfg).speculative == "ngram:4"
    assert to_config(cfg, replace(from_config(cfg), speculative="none")).engine.speculative is None


def test_a_simulated_search_prices_the_knob_and_the_winner_carries_it(run_dir, tmp_path):
    from moetune.config import load_recipe
    from moetune.search.study.optuna_study import StudySettings
    from moetune.search.study.run import SearchSettings, run_search
    from moetune.search.study.setup import Inputs

    space = tmp_path / "space.yaml"
    space.write_text(FIXED + "speculative: [none, ngram:4]\n")
    out = tmp_path / "out"
    st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", 2, 0)
    res = run_search(SearchSettings(Inputs(str(run_dir), "H200", spec_acceptance=0.8), st, out, "simulate",
                                    str(space), hf_id="org/model"))
    rows = {r.deployment.speculative: r for r in res.rows}
    spec = rows["ngram:4"].metrics["detail"]["speculative"]
    assert spec["acceptance"].startswith("assumed") and spec["tokens_per_verify"] > 1
    assert res.winner.deployment.speculative == "ngram:4"  # a tiny overhead-bound model on an H200: verify is free
    assert load_recipe(out / "winner.yaml").engine.speculative == "ngram:4"
    assert "speculative decoding: priced" in (out / "winner.vllm.sh").read_text()
    refused = run_search(SearchSettings(Inputs(str(run_dir), "H200"), replace(st, study="t"), tmp_path / "o2",
                                        "simulate", str(space)))
    why = {r.deployment.speculative: r.reason for r in refused.rows}
    assert why["none"] is None and "--spec-acceptance" in why["ngram:4"]


def test_a_tp_group_prices_the_verify_rows_on_its_slices_and_the_mtp_drafter_whole():
    """TP 2: the verify step's rows run through each rank's slices (cheaper compute, an all-reduce
    per layer and the logits of every verify row gathered), while the MTP layer, replicated on every
    rank, costs what it costs one rank; speculation still gains at batch 1 (memory-bound)."""
    def evaluate(B, tp, speculative):
        sim = Simulator(source(B), BUILTIN["H200"])
        sim.spec_acceptance = 0.6
        return sim.evaluate(Deployment(max_num_seqs=B, tp_size=tp, expert_tp_size=tp, speculative=speculative))

    for B in (1, 16):
        one, two = evaluate(B, 1, "mtp:2"), evaluate(B, 2, "mtp:2")
        draft = one.detail["speculative"]["draft_s"]
        assert draft > 0 and two.detail["speculative"]["draft_s"] == pytest.approx(draft, rel=1e-9)
        plain_tp = evaluate(B, 2, "none")
        assert two.phases_ms["decode"]["tp_gather"] > plain_tp.phases_ms["decode"]["tp_gather"] > 0  # 3 rows a seq
    assert evaluate(1, 2, "ngram:4").output_tok_s > 1.2 * evaluate(1, 2, "none").output_tok_s
