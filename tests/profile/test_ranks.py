"""`profile --ep-size 2` runs two ranks for real: measured per-rank tables agree with the dispatchers'
own counters and with the what-if computed for the same placement; an idle rank is recorded."""

import numpy as np
import pytest

from moetune.config import parse_config
from moetune.profile.rundir import read_run
from moetune.profile.runner import ProfileSettings, run_profile
from moetune.profile.trace import replay_counts
from moetune.profile.workload import Workload

# Two batches: [request 0 → rank 0, request 1 → rank 1], then [request 2 → rank 0] with rank 1 idle.
WORKLOAD = Workload(num_requests=3, batch_size=2, input_len=10, output_len=3, warmup_steps=1)
KEY = ["step", "layer", "rank"]


@pytest.fixture(scope="module")
def run(checkpoint, tmp_path_factory):
    """olmoe: 6 experts + 2 redundant slots, round-robin over 2 ranks, one rank per node."""
    cfg = parse_config({"model": {"path": str(checkpoint("olmoe", shard=False))},
                        "parallel": {"placement": "round_robin", "redundant_experts": 2}})
    out = tmp_path_factory.mktemp("ranks") / "r2"
    return read_run(run_profile(ProfileSettings(cfg, WORKLOAD, ep_size=2, ranks_per_node=1, out=out)).path)


def test_every_lock_step_of_every_rank_is_recorded(run):
    rs, steps = run.tables.rank_steps, run.tables.steps
    assert len(steps) == WORKLOAD.measured_steps() and len(rs) == 2 * len(steps)
    idle = rs[rs.rank_kind == "idle"]
    assert set(idle["rank"]) == {1} and len(idle) == WORKLOAD.output_len  # the second batch has one request
    assert (rs.groupby("step").tokens.sum().to_numpy() == steps.sort_values("step").tokens.to_numpy()).all()
    assert np.allclose(rs.groupby("step").seconds.max().to_numpy(), steps.sort_values("step").seconds.to_numpy())
    assert run.summary["parallel"]["ran_ranks"] and run.env["topology"]["simulated"] is False


def test_bytes_sent_equal_each_dispatchers_counters(run):
    moe = run.tables.rank_moe
    sent = (moe.dispatch_bytes + moe.combine_bytes).groupby(moe["rank"]).sum()
    counters = {c["rank"]: c for c in run.summary["parallel"]["dispatcher_counters"]}
    assert sent.sum() > 0
    for rank, total in sent.items():
        assert total == counters[rank]["bytes_sent"]
        assert counters[rank]["calls"] == len(moe[moe["rank"] == rank])  # one dispatch per layer and lock-step
    assert moe.intra_node_bytes.sum() == 0 and (moe.dispatch_bytes + moe.combine_bytes == moe.inter_node_bytes).all()


def test_measured_copies_and_bytes_equal_the_what_if_for_the_same_placement(run):
    t = run.tables
    measured = t.rank_moe.set_index(KEY).sort_index()
    computed = t.ep_ranks.set_index(KEY).sort_index()
    assert (measured.copies_in == computed.copies).all()
    assert ((measured.dispatch_bytes + measured.combine_bytes) == computed.send_bytes).all()
    locality = ["same_rank_bytes", "intra_node_bytes", "inter_node_bytes"]
    per_step = t.rank_moe.groupby(["step", "layer"])[locality].sum().sort_index()
    assert (per_step.to_numpy() == t.ep_traffic.set_index(["step", "layer"]).sort_index()[locality].to_numpy()).all()


def test_merged_tables_and_trace_hold_every_ranks_tokens(run):
    t, trace = run.tables, run.trace
    assert trace.token_rank is not None and len(trace.token_rank) == len(trace.topk_ids)
    assert np.array_equal(replay_counts(trace).reshape(-1),
                          t.expert_load.sort_values(["step", "layer", "expert"]).tokens.to_numpy())
    rows = t.moe.set_index(["step", "layer"]).rows
    assert (t.rank_moe.groupby(["step", "layer"]).copies_in.sum() == rows).all()
    assert (t.rank_moe.groupby(["step", "layer"]).copies_sent.sum() == rows).all()
    assert (t.rank_moe[t.rank_moe["rank"] == 1].merge(t.rank_steps, on=["step", "rank"])
            .query("rank_kind == 'idle'").copies_sent == 0).all()


def test_waits_and_balancedness_are_summarised_per_rank_and_layer(run):
    moe = run.tables.rank_moe
    assert (moe.wait_seconds >= 0).all() and moe.transfer_seconds.sum() > 0
    assert (moe.dispatch_seconds >= moe.wait_seconds).all()  # the wait is inside the dispatch phase
    ranks = run.summary["kinds"]["decode"]["ranks"]
    assert [r["rank"] for r in ranks["per_rank"]] == [0, 1]
    waited = sum(sum(layer["waited_for"].values()) for layer in ranks["per_layer"])
    assert waited == len(moe[moe.kind == "decode"]) // 2  # one slowest rank per lock-step and layer
    for layer in ranks["per_layer"]:
        assert layer["balancedness_measured"] == pytest.approx(layer["balancedness_computed"])
        assert 0 < layer["balancedness_without_replicas"] <= 1
    assert 0 < ranks["dispatch_combine_share_of_moe"] < 1 and ranks["bytes_per_step"] > 0
