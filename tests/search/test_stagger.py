"""A closed loop at concurrency C is priced in its desynchronised steady state (schedule.py, `stagger`):
the first wave joins spread over one output, so a measured request waits for one prompt's prefill, not its
whole wave's; the requests and tokens are those of the unstaggered loop, and the window's throughput is
Little's law's C / (TTFT + (O − 1)·TPOT)."""

import numpy as np
import pytest

from moetune.search.cost.schedule import SimWorkload, first_arrivals, simulate_schedule
from moetune.search.study.setup import Inputs, prepare
from moetune.search.study.space import Deployment

C, O = 32, 64  # in flight per replica; output tokens


@pytest.fixture(scope="module")
def deepseek(run_dir, big_config):
    """DeepSeek-V3-shaped (scaled) on one H200: a 1,024-token prompt's prefill is many decode steps' time."""
    return prepare(Inputs(str(run_dir), "H200", scale_model=str(big_config))).sim


def loop(stagger: bool) -> SimWorkload:
    return SimWorkload((1024,) * (3 * C), O, "concurrency", C, warmup=C, stagger=stagger)


def test_the_first_wave_joins_spread_over_one_output():
    assert list(first_arrivals(SimWorkload((5,) * 12, 8, "concurrency", 4))) == [0, 2, 4, 6]
    assert list(first_arrivals(SimWorkload((5,) * 12, 8, "concurrency", 4), 2)) == [0, 0, 4, 4]  # a round a rank
    assert list(first_arrivals(SimWorkload((5,) * 12, 8, "concurrency", 4, stagger=False))) == [0] * 4
    assert list(first_arrivals(SimWorkload((5,) * 3, 8))) == [0] * 3  # a burst: everyone at t = 0
    assert SimWorkload((5,), 8, "concurrency", 4).stagger  # the default


@pytest.mark.parametrize("ranks,seqs,tokens", [(1, 8, 64), (3, 5, 40), (4, 64, 16384)])
def test_staggering_keeps_the_requests_and_their_tokens(ranks, seqs, tokens):
    lens = tuple(int(x) for x in np.random.default_rng(ranks).integers(3, 300, size=41))  # awkward lengths
    runs = [simulate_schedule(SimWorkload(lens, 9, "concurrency", 11, stagger=s), ranks, seqs, tokens)
            for s in (True, False)]
    for s in runs:
        assert s.sampled.sum() == 41 * 9 and (s.last_step >= 0).all()
        assert s.prefill.sum() == sum(lens) and s.in_flight().max() == 11
    assert runs[0].arrive_step[:11].max() > 0 == runs[1].arrive_step[:11].max()


def test_the_steady_ttft_is_one_prefill_not_the_waves(deepseek):
    """16,384 tokens a step: the unstaggered loop prefills its 32 prompts in two steps and re-enters them
    together, so a measured request waits for its wave's prefill; staggered, about one prompt joins a step."""
    d = Deployment(max_num_seqs=64, max_num_batched_tokens=16384)
    lone = deepseek.evaluate(d, SimWorkload((1024,), O))
    waves, steady = deepseek.evaluate(d, loop(False)), deepseek.evaluate(d, loop(True))
    assert waves.latency_ms["ttft"]["p50"] > 4 * lone.ttft_ms  # the wave's prefill: many prompts ahead
    assert steady.latency_ms["ttft"]["p50"] < 0.4 * waves.latency_ms["ttft"]["p50"]
    assert steady.latency_ms["ttft"]["p90"] < 2 * lone.ttft_ms  # one prompt's prefill, beside the decodes
    assert steady.detail["steady"]["measured_requests"] == C


@pytest.mark.parametrize("stagger", [True, False])
def test_the_window_follows_littles_law(deepseek, stagger):
    """C in flight, each for TTFT + (O − 1)·TPOT: requests/s and output tokens/s of the window within 5 %."""
    d = Deployment(max_num_seqs=64, max_num_batched_tokens=16384)
    m = deepseek.evaluate(d, loop(stagger))
    t, p = m.latency_ms["ttft"]["p50"], m.latency_ms["tpot"]["p50"]
    little = C / ((t + (O - 1) * p) / 1e3)  # requests/s
    if stagger:  # every measured request alike: the medians are the means
        assert m.request_s == pytest.approx(little, rel=0.05)
    assert m.output_tok_s == pytest.approx(little * O, rel=0.05 if stagger else 0.15)


def test_unstaggered_on_the_command_line_prices_the_synchronized_waves(run_dir, big_config):
    """`moetune simulate --unstaggered` is the loop of `stagger=False` (through the console script, --json -):
    the waves' TTFT; the staggered default the steady one. Given without a closed loop: one line, exit 2."""
    import json

    from tests.cli_run import moetune

    def figures(*extra):
        got = moetune("simulate", "--trace", str(run_dir), "--hardware", "H200", "--scale-model", str(big_config),
                      "--input-len", "1024", "--output-len", str(O), "--concurrency", str(C), "--json", "-", *extra)
        assert got.returncode == 0, got.stderr
        return json.loads(got.stdout)["latency_ms"]["ttft"]["p50"]

    waves, steady = figures("--unstaggered"), figures()  # the trace's recipe: 4 sequences, 8,192 tokens a step
    assert steady < 0.5 * waves
    bad = moetune("simulate", "--trace", str(run_dir), "--hardware", "H200", "--unstaggered", "--burst")
    assert bad.returncode != 0 and "--unstaggered" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
