"""Replicas of a deployment across the hardware's GPUs (replicas.py, space.py): invalid pairs pruned
with the reason, each replica priced on its share of the load, throughput per GPU over every GPU,
max_num_seqs up to 1024, and a search that covers replicas × EP on 8 GPUs."""

import csv
from dataclasses import replace

import pytest

from moetune.search.cost.schedule import SimWorkload
from moetune.search.study.setup import Inputs, prepare
from moetune.search.study.space import Deployment, Limits, canonical, default_knobs, prune
from tests.cli_run import moetune


@pytest.fixture(scope="module")
def sim(run_dir):
    return prepare(Inputs(str(run_dir), "H200")).sim  # one node of 8 GPUs


LIM = Limits(num_experts=16, top_k=2, max_ranks=8, requests=64)


@pytest.mark.parametrize("replicas,ep,ok", [(2, 4, True), (4, 2, True), (8, 1, True), (1, 8, True), (1, 2, True),
                                            (2, 2, False), (4, 4, False), (3, 2, False), (8, 2, False)])
def test_replicas_times_ranks_must_be_the_gpus(replicas, ep, ok):
    reason = prune(Deployment(ep_size=ep, replicas=replicas), LIM)
    assert (reason is None) == ok, reason
    if not ok:
        assert f"{replicas} replicas × ep_size {ep}" in reason and "8" in reason


def test_ep_size_not_dividing_the_experts_is_pruned_with_replicas_too():
    assert "does not divide the 16 experts" in prune(Deployment(ep_size=3, replicas=2), Limits(16, 2, 6, 64))


def test_steady_replicas_multiply_one_replicas_rates_and_keep_its_latency(sim):
    base = sim.src.workload
    w = SimWorkload((base.prompt_lens * 32)[:32], base.output_len, "concurrency", 8, warmup=8)
    one = sim.evaluate(Deployment(ep_size=2, max_num_seqs=8), w)
    four = sim.evaluate(Deployment(ep_size=2, replicas=4, max_num_seqs=8), w)
    assert four.replicas == 4 and one.replicas == 1
    assert four.output_tok_s == pytest.approx(4 * one.output_tok_s)
    assert four.request_s == pytest.approx(4 * one.request_s)
    assert four.latency_ms == one.latency_ms and four.peak_mem_gb == one.peak_mem_gb
    assert four.output_tok_s_per_rank == one.output_tok_s_per_rank
    assert four.output_tok_s_per_gpu == pytest.approx(four.output_tok_s / 8)  # 4 × EP2 = all 8 GPUs
    assert one.output_tok_s_per_gpu == pytest.approx(one.output_tok_s / 8)  # 6 GPUs idle count too


@pytest.mark.parametrize("n", [16, 17])
def test_burst_replicas_each_run_their_share(sim, n):
    """Request i on replica i mod 2; replica 0 holds ⌈n/2⌉ and sets the makespan."""
    base = sim.src.workload
    lens = tuple((base.prompt_lens * n)[:n])
    d = Deployment(max_num_seqs=16)
    two = sim.evaluate(replace(d, replicas=2), SimWorkload(lens, base.output_len))
    share = sim.evaluate(d, SimWorkload(lens[::2], base.output_len))  # what replica 0 runs
    assert two.output_tok_s == pytest.approx(share.output_tok_s * n / len(lens[::2]))
    assert two.ttft_ms == share.ttft_ms


def test_max_num_seqs_reaches_1024_and_holds_a_replicas_share():
    seqs = next(k for k in default_knobs(16, 8) if k.name == "max_num_seqs").values
    assert seqs[-2:] == (512, 1024)
    steady = Limits(16, 2, 8, requests=2048, per_replica=True)  # C = 2048 per replica
    assert canonical(Deployment(ep_size=2, replicas=4, max_num_seqs=1024), steady)[0].max_num_seqs == 1024
    burst = Limits(16, 2, 8, requests=1024)  # 1,024 in total: 256 per replica of 4, 128 per rank at EP2
    assert canonical(Deployment(ep_size=2, replicas=4, max_num_seqs=1024), burst)[0].max_num_seqs == 128


def test_a_grid_over_replicas_and_ep_repairs_the_pairs_that_do_not_fill_the_gpus(run_dir, tmp_path):
    """replicas > 1 are copies filling the GPUs: a pair that does not fill them runs (and says it runs)
    as GPUs / R copies, with the figures of that deployment."""
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: [1, 2, 4, 8]\nreplicas: [1, 2, 4, 8]\nredundant_experts: 0\nplacement: contiguous\n"
                     "max_num_seqs: 16\nmax_num_batched_tokens: 2048\nquant_low_format: none\n"
                     "offload_resident_fraction: 1.0\ndense_format: none\nkv_format: none\noverlap: 0\n"
                     "attn_dp: 0\nexpert_tp_size: 1\n")  # the parallel mesh's grid (meshes: test_space.py)
    out = tmp_path / "o"
    got = moetune("search", "--trace", str(run_dir), "--hardware", "H200", "--sampler", "grid", "--n-trials", "16",
                  "--concurrency", "8", "--objective", "throughput_per_gpu", "--space", str(space), "--out", str(out))
    assert got.returncode == 0, got.stderr
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert len(rows) == 16 and {r["state"] for r in rows} == {"COMPLETE"}
    pairs = {(int(r["replicas"]), int(r["ep_size"])): r for r in rows}
    valid = {(1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (4, 2), (8, 1)}
    for (n, R), r in pairs.items():
        if (n, R) in valid:
            assert "replicas" not in r["reason"], (n, R, r["reason"])
        else:
            runs = 8 // R
            assert f"replicas {n} → {runs}" in r["reason"], (n, R, r["reason"])
            assert r["deployment"].startswith(f"{runs} replicas ×" if runs > 1 else f"R={R}"), r["deployment"]
            if (runs, R) in pairs:  # the grid sampler may visit a point twice and leave another out
                assert r["throughput_per_gpu"] == pairs[(runs, R)]["throughput_per_gpu"]
    best = max((r for r in rows if r["state"] == "COMPLETE"), key=lambda r: float(r["throughput_per_gpu"]))
    import re

    ran = re.match(r"(?:(\d+) replicas × )?R=(\d+)", best["deployment"])  # the deployment it ran
    assert int(ran.group(1) or 1) * int(ran.group(2)) == 8  # idle GPUs never win per GPU
