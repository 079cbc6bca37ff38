"""The steady state the SLOs allow (cost/slo_load.py): the load search finds the boundary of a
monotone latency model (within its tolerance, from above never), says when no load meets the SLOs
and when the cap does; on the simulator the concurrency found meets the SLOs and the lowest missed
does not; a probe's schedule that skips the drain is the compiled and the reference scheduler's
alike; and the workload a GPU search runs by default is that steady state."""

import math
import random

import numpy as np
import pytest

from moetune.search.cost.schedule import SimWorkload, simulate_schedule
from moetune.search.cost.schedule_fast import compiled_schedule
from moetune.search.cost.slo_load import (DEFAULT_CONCURRENCY, REL_TOL, Slo, at_concurrency, max_load, slo_score)
from moetune.search.study.setup import Inputs, prepare
from moetune.search.study.space import Deployment


def latency_model(boundary: float, kind: str, alpha: float = 1.0):
    """A synthetic cost model: score(c) = log(latency(c) / SLO), growing with c, 0 at `boundary`."""
    if kind == "power":  # latency ∝ c^alpha
        return lambda c: alpha * math.log(c / boundary)
    if kind == "floor":  # latency = a fixed cost + a part growing with c (decode steps: weights, then rows)
        return lambda c: math.log((40 + c) / (40 + boundary))
    if kind == "cliff":  # met, then missed at once (a queue forms)
        return lambda c: -1.0 if c <= boundary else 1.0
    return lambda c: alpha * (c - boundary) / boundary  # linear


@pytest.mark.parametrize("kind", ["power", "floor", "cliff", "linear"])
def test_the_search_brackets_and_converges_to_the_true_boundary(kind):
    rng = random.Random(kind)
    for _ in range(300):
        cap = rng.choice([2, 3, 64, 256, 2048, 16384])
        boundary = rng.uniform(1.0, cap - 0.5)
        score = latency_model(boundary, kind, rng.uniform(0.3, 3.0))
        calls = []
        guess = rng.choice([None, rng.randint(1, 2 * cap), max(1, round(boundary * rng.uniform(0.7, 1.3)))])
        found = max_load(lambda c: calls.append(c) or score(c), cap, guess=guess)  # a start anywhere
        truth = math.floor(boundary)  # the highest integer load meeting the SLO
        assert found.ended == "boundary"
        assert 1 <= found.concurrency <= truth and score(found.concurrency) <= 0  # met, never above the boundary
        missed = found.lowest_missed  # the bracket: met at concurrency, missed at lowest_missed
        assert missed > truth and score(missed) > 0
        assert missed - found.concurrency <= 1 or missed <= found.concurrency * (1 + REL_TOL) + 1e-9
        assert calls == [c for c, _ in found.probes] and len(set(calls)) == len(calls)  # no load priced twice
        assert len(calls) <= 14


def test_a_smooth_latency_needs_few_probes_and_a_good_guess_two():
    probes = [len(max_load(latency_model(b, "power", 1.0), 8192).probes) for b in (17.3, 240.5, 1999.9, 6000.2)]
    assert max(probes) <= 6, probes
    guessed = [max_load(latency_model(b, "power", 1.0), 8192, guess=round(b * 1.03)) for b in (240.5, 1999.9, 5000.3)]
    assert [len(g.probes) for g in guessed] == [2, 2, 2]  # missed just above the boundary, then met just under
    assert all(g.ended == "boundary" and g.concurrency >= b / 1.1 for g, b in zip(guessed, (240.5, 1999.9, 5000.3)))


def test_infeasible_even_at_concurrency_one_and_feasible_at_the_cap():
    never = max_load(lambda c: 0.5, 4096)
    assert never.concurrency == 0 and never.ended == "not met at concurrency 1"
    assert never.probes[0] == (4096, False) and never.probes[-1] == (1, False)
    always = max_load(lambda c: -0.5, 4096)
    assert always.concurrency == 4096 and always.ended == "at the cap" and always.probes == ((4096, True),)
    one = max_load(lambda c: 0.5, 1)  # the cap is 1 and missed: one probe says it
    assert one.concurrency == 0 and len(one.probes) == 1


def test_the_score_is_the_worst_slo_at_its_percentile():
    lat = {"ttft": {"p50": 100.0, "p90": 400.0}, "tpot": {"p50": 10.0, "p90": 30.0}}
    assert slo_score(Slo(500, 50, 90), lat) == pytest.approx(math.log(0.8))  # TTFT is the tighter one
    assert slo_score(Slo(None, 20, 90), lat) == pytest.approx(math.log(1.5))
    assert slo_score(Slo(500, 50, 50), lat) == pytest.approx(math.log(0.2))
    assert Slo(300, 50, 90).misses(lat) == ["TTFT P90 400 ms over 300 ms"]


@pytest.mark.parametrize("ranks,seqs,tokens,c", [(1, 4, 64, 3), (2, 8, 50, 7), (3, 2, 16, 5), (4, 16, 256, 40)])
def test_a_probe_without_its_drain_is_the_same_in_both_schedulers(ranks, seqs, tokens, c):
    lens = tuple(int(x) for x in np.random.default_rng(ranks).integers(3, 90, size=3 * c))  # awkward lengths
    w = SimWorkload(lens, 6, "concurrency", c, warmup=c, drain=False)
    ref, fast = simulate_schedule(w, ranks, seqs, tokens), compiled_schedule(w, ranks, seqs, tokens, True)
    for name in ("prefill", "decode", "pairs", "context", "sampled", "seqs", "first_step", "last_step", "arrive_step"):
        assert np.array_equal(getattr(ref, name), getattr(fast, name)), name
    assert (ref.last_step[: 2 * c] >= 0).all()  # every request before the drain finished
    full = simulate_schedule(SimWorkload(lens, 6, "concurrency", c, warmup=c), ranks, seqs, tokens)
    assert ref.num_steps <= full.num_steps  # the drain's steps skipped, the steps before it the same
    assert np.array_equal(ref.prefill, full.prefill[: ref.num_steps])


@pytest.fixture(scope="module")
def found(run_dir):
    """A GPU setup given both SLOs and no load: the load is found per deployment."""
    setup = prepare(Inputs(str(run_dir), "H200", input_len=64, output_len=16, slo_ttft_ms=1.2, slo_tpot_ms=0.843))
    setup.sim.tables = None  # the roofline, with or without the gpu-db extra installed (this tests the load search)
    return setup  # TPOT P90 0.8386 ms at 4, 0.8414 at 32, 0.8438 at 64 (the staggered loop): a boundary under the cap


def test_on_the_simulator_the_load_found_meets_the_slos_and_the_next_does_not(found):
    w = found.workload
    assert w.find_load and w.slo_percentile == 90
    d = Deployment(ep_size=2, max_num_seqs=64, max_num_batched_tokens=512)
    m = found.sim.evaluate(d, w)
    load = m.detail["load"]
    c, missed = load["concurrency"], load["lowest_missed"]
    assert load["met"] and load["ended"] == "boundary" and load["cap"] == 2 * 64, load
    assert "the highest concurrency meeting TTFT P90 ≤ 1.2 ms and TPOT P90 ≤ 0.843 ms" in m.workload
    slo = Slo(1.2, 0.843, 90)
    at_c = found.sim.evaluate(d, at_concurrency(w, c))  # priced on its own: the same figures
    assert slo_score(slo, at_c.latency_ms) <= 0 and at_c.output_tok_s == m.output_tok_s
    assert slo_score(slo, found.sim.evaluate(d, at_concurrency(w, missed)).latency_ms) > 0
    assert missed - c <= 1 or missed <= c * (1 + REL_TOL)


def test_no_load_meets_impossible_slos_and_the_trial_says_so(run_dir):
    setup = prepare(Inputs(str(run_dir), "H200", input_len=64, output_len=16, slo_ttft_ms=1e-6, slo_tpot_ms=1e-6))
    m = setup.sim.evaluate(Deployment(max_num_seqs=8, max_num_batched_tokens=512), setup.workload)
    load = m.detail["load"]
    assert not load["met"] and load["concurrency"] == 0 and load["missed"]
    assert "not met even at concurrency 1" in m.workload


def test_the_default_workload_on_gpu_hardware_is_a_steady_state(run_dir):
    plain = prepare(Inputs(str(run_dir), "H200")).workload
    assert plain.mode == "concurrency" and plain.concurrency == DEFAULT_CONCURRENCY and not plain.find_load
    assert prepare(Inputs(str(run_dir), "H200", burst=True)).workload.mode == "burst"
    assert prepare(Inputs(str(run_dir), "this-machine")).workload.mode == "burst"  # measure runs bursts here
    given = prepare(Inputs(str(run_dir), "H200", concurrency=4, slo_ttft_ms=5.0)).workload
    assert given.mode == "concurrency" and given.concurrency == 4 and not given.find_load
