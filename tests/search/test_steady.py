"""Steady-state workloads in the simulator (schedule.py, steady.py): a closed loop keeps C requests
in flight per replica, Poisson arrivals have the asked rate, a lone request's TTFT is one prefill,
goodput counts only requests meeting both SLOs, and `simulate` / `search` say which workload ran."""

import csv
from dataclasses import replace

import numpy as np
import pytest

from moetune.search.cost.schedule import SimWorkload, first_arrivals, simulate_schedule
from moetune.search.cost.steady import poisson_arrivals
from moetune.search.study.setup import Inputs, prepare
from moetune.search.study.space import Deployment
from tests.cli_run import assert_one_line_error, moetune


@pytest.fixture(scope="module")
def sim(run_dir):
    return prepare(Inputs(str(run_dir), "H200")).sim


@pytest.mark.parametrize("stagger", [True, False])
@pytest.mark.parametrize("ranks,C", [(1, 3), (2, 5), (4, 2)])
def test_closed_loop_never_holds_more_than_c_in_flight(ranks, C, stagger):
    """C per replica = over the R data-parallel ranks together; the loop keeps it full, once the first wave
    has joined (at step 0 unstaggered; at ⌊i·O / C⌋ staggered, or earlier when nothing ran), until the drain."""
    lens = tuple(int(x) for x in np.random.default_rng(1).integers(3, 60, size=23))  # awkward prompt lengths
    w = SimWorkload(lens, 5, "concurrency", C, stagger=stagger)
    s = simulate_schedule(w, ranks, max_num_seqs=8, max_num_batched_tokens=40)
    flight = s.in_flight()  # [S]
    assert flight.max() == C  # reached, never exceeded
    assert (flight[s.arrive_step[:C].max(): s.arrive_step[-1]] == C).all()  # full until the last has arrived
    assert s.sampled.sum() == 23 * 5 and (s.last_step >= 0).all()
    assert (s.arrive_step[C:] > 0).all() and (s.arrive_step[:C] <= first_arrivals(w, ranks)).all()
    assert (s.arrive_step[:C] == 0).all() != (stagger and C > ranks)  # staggered: rounds of one a rank
    for i in range(C, 23):  # request i joins the step after the (i − C + 1)-th finish
        assert s.arrive_step[i] == np.sort(s.last_step)[i - C] + 1


def test_burst_schedule_is_the_unstaggered_closed_loop_with_c_at_least_n():
    w = SimWorkload((40, 7, 19, 33, 2), 4)
    a = simulate_schedule(w, 2, 3, 30)
    b = simulate_schedule(replace(w, mode="concurrency", concurrency=5, stagger=False), 2, 3, 30)
    for f in ("prefill", "decode", "pairs", "context", "sampled", "seqs", "first_step", "last_step"):
        assert (getattr(a, f) == getattr(b, f)).all(), f


@pytest.mark.parametrize("rate,seed", [(0.5, 0), (40.0, 3), (1000.0, 11)])
def test_poisson_arrivals_have_the_asked_mean_rate(rate, seed):
    """n = 4000 gaps: the estimated rate's relative standard error is 1/√n ≈ 1.6 %; the bound is 5 % (> 3σ)."""
    t = poisson_arrivals(4000, rate, seed)
    assert t[0] == 0 and (np.diff(t) >= 0).all()
    assert abs((len(t) - 1) / t[-1] / rate - 1) < 0.05
    gaps = np.diff(t)
    assert abs(gaps.std() / gaps.mean() - 1) < 0.1  # exponential gaps: coefficient of variation 1
    assert (poisson_arrivals(50, rate, seed) == t[:50]).all()  # seeded, a prefix of the longer draw


def test_steady_ttft_at_a_low_rate_is_one_prefill_far_below_the_burst(sim):
    """A burst of 64 × 1,024-token prompts under a 2,048-token budget prefills two a step (32 steps);
    at a rate where requests never overlap each one's TTFT is its own prefill step."""
    d = Deployment(max_num_seqs=64, max_num_batched_tokens=2048)
    n, base = 64, sim.src.workload
    lens = (1024,) * n
    burst = sim.evaluate(d, SimWorkload(lens, base.output_len))
    lone = sim.evaluate(d, SimWorkload(lens[:1], base.output_len))
    rate = 1.0 / (50 * lone.latency_ms["e2e"]["p50"] / 1e3)  # a request every 50 request lifetimes
    steady = sim.evaluate(d, SimWorkload(lens, base.output_len, "rate", rate=rate, seed=2, warmup=8))
    assert steady.workload.startswith("rate") and burst.workload.startswith("burst")
    prefill_step = steady.phases_ms["prefill"]["step"]
    assert steady.latency_ms["ttft"]["p99"] == pytest.approx(prefill_step, rel=0.05)  # every request: one prefill
    assert steady.ttft_ms == pytest.approx(lone.ttft_ms, rel=0.05)
    assert burst.ttft_ms > 5 * steady.ttft_ms
    assert steady.detail["steady"] == {"measured_requests": n - 16, "excluded_each_end": 8,
                                       "window_s": pytest.approx(steady.detail["steady"]["window_s"])}
    assert steady.request_s == pytest.approx(rate, rel=0.5)  # the window's completions follow the arrivals
    assert steady.estimated


def test_goodput_is_at_most_the_request_rate_and_falls_when_an_slo_tightens(sim):
    """Prompts of 20–300 tokens under a 256-token budget queue unevenly, so TTFTs spread."""
    d = Deployment(max_num_seqs=16, max_num_batched_tokens=256)
    lens = tuple(int(x) for x in np.random.default_rng(5).integers(20, 300, size=80))
    w = SimWorkload(lens, sim.src.workload.output_len, "concurrency", 12, warmup=12)
    loose = sim.evaluate(d, replace(w, slo_ttft_ms=1e9, slo_tpot_ms=1e9))
    assert loose.goodput_rps == pytest.approx(loose.request_s) and loose.request_s > 0
    ttft, tpot = loose.latency_ms["ttft"], loose.latency_ms["tpot"]
    assert ttft["p50"] < ttft["p99"] and tpot["p50"] < tpot["p99"]  # a spread to cut into
    at_p50 = sim.evaluate(d, replace(w, slo_ttft_ms=ttft["p50"], slo_tpot_ms=1e9))
    none = sim.evaluate(d, replace(w, slo_ttft_ms=1e-6, slo_tpot_ms=1e9))
    tpot_cut = sim.evaluate(d, replace(w, slo_ttft_ms=1e9, slo_tpot_ms=tpot["p50"]))
    assert none.goodput_rps == 0 < at_p50.goodput_rps < loose.goodput_rps
    assert 0.5 * loose.request_s <= at_p50.goodput_rps  # the median request meets its SLO
    assert tpot_cut.goodput_rps < loose.goodput_rps
    for m in (loose, at_p50, none, tpot_cut):
        assert m.goodput_rps <= m.request_s and m.request_s == loose.request_s  # SLOs do not change the load
    assert loose.detail["steady"]["excluded_each_end"] == 12


def test_more_concurrency_raises_throughput_and_ttft(sim):
    base = sim.src.workload
    lens = (base.prompt_lens * 96)[:96]
    d = Deployment(max_num_seqs=64)
    low = sim.evaluate(d, SimWorkload(lens, base.output_len, "concurrency", 2, warmup=2))
    high = sim.evaluate(d, SimWorkload(lens, base.output_len, "concurrency", 24, warmup=24))
    assert high.output_tok_s > 2 * low.output_tok_s
    assert high.tpot_ms > low.tpot_ms


def test_simulate_cli_labels_the_workload_and_prints_percentiles(run_dir):
    out = moetune("simulate", "--trace", str(run_dir), "--hardware", "H200", "--concurrency", "4",
                  "--num-requests", "24")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # rich wraps long cells and lines
    assert "concurrency 4 per replica" in text and "all figures estimated" in text
    assert "TTFT ms P50 / P90 / P99" in text and "E2E ms P50 / P90 / P99" in text
    assert "16 requests measured" in text and "goodput SLOs: none set" in text
    burst = moetune("simulate", "--trace", str(run_dir), "--hardware", "H200", "--burst")
    assert burst.returncode == 0 and "burst (every request" in burst.stdout
    plain = moetune("simulate", "--trace", str(run_dir), "--hardware", "H200")  # GPU hardware: a steady state
    assert plain.returncode == 0 and "concurrency 256 per replica" in " ".join(plain.stdout.split())
    found = moetune("simulate", "--trace", str(run_dir), "--hardware", "H200", "--slo-ttft-ms", "1.2",
                    "--slo-tpot-ms", "1", "--input-len", "64", "--output-len", "16")
    text = " ".join(found.stdout.split())
    assert found.returncode == 0 and "the highest concurrency meeting TTFT P90 ≤ 1.2 ms and TPOT P90 ≤ 1 ms" in text
    assert "concurrency per replica (found)" in text and "probes" in text
    both = moetune("simulate", "--trace", str(run_dir), "--hardware", "H200", "--burst", "--concurrency", "4")
    assert_one_line_error(both, "--burst sends every request at t=0")
    pct = moetune("simulate", "--trace", str(run_dir), "--hardware", "H200", "--slo-percentile", "100")
    assert_one_line_error(pct, "--slo-percentile must be above 0 and below 100")


def test_search_with_goodput_objective_at_a_rate(run_dir, tmp_path):
    out = tmp_path / "o"
    got = moetune("search", "--trace", str(run_dir), "--hardware", "H200", "--request-rate", "50",
                  "--num-requests", "40", "--objective", "goodput", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "50",
                  "--n-trials", "4", "--out", str(out), "--space", str(_space(tmp_path)))
    assert got.returncode == 0, got.stderr
    rows = list(csv.DictReader((out / "trials.csv").open()))
    done = [r for r in rows if r["state"] == "COMPLETE"]
    assert done and all(float(r["goodput"]) > 0 for r in done)


def _space(tmp_path):
    p = tmp_path / "space.yaml"
    p.write_text("ep_size: [1, 2]\nmax_num_seqs: [8, 16]\nquant_low_format: none\noffload_resident_fraction: 1.0\n")
    return p
