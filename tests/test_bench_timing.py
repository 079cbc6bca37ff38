"""`measure_alternating`: two workloads' runs take turns, setups stay off the clock, and each side's
timing is its own."""

import types

import pytest
import torch

from moetune.bench import timing
from moetune.bench.timing import Work, measure_alternating


def test_runs_take_turns_and_setups_are_untimed(monkeypatch):
    """On a clock of the test's own, moved only by the work (a sleeping workload on the real clock made
    the check a race with the machine's load): each side's median is exactly its own run."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    order = []

    def make(name, seconds):
        def setup():
            order.append(name + " setup")
            clock.now += 0.03  # untimed
            return name

        def fn(arg):
            assert arg == name
            order.append(name)
            clock.now += seconds
        return Work(fn, setup)

    fast, slow = measure_alternating(make("a", 0.002), make("b", 0.012), torch.device("cpu"), runs=3, warmup=1)
    runs = [x for x in order if not x.endswith("setup")]
    assert runs == ["a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up pair, then three timed pairs
    assert fast.runs == slow.runs == 3
    # neither side's setup nor the other side is counted
    assert fast.median_s == pytest.approx(0.002) and slow.median_s == pytest.approx(0.012)
    assert fast.min_s == pytest.approx(0.002) and fast.max_s == pytest.approx(0.002)


def test_a_limit_is_sampled_right_before_each_run_and_kept_per_workload(monkeypatch):
    from moetune.bench import roofline
    from moetune.bench.roofline import LimitSampler

    monkeypatch.setattr(roofline, "STREAM_BYTES", 64 * 2**12)  # small buffers: this checks the order, not the rate
    monkeypatch.setattr(roofline, "MATMUL_N", 32)
    sampler, order = LimitSampler(torch.device("cpu")), []
    sample = sampler.sample

    def recording(kind):
        order.append("sample " + kind)
        return sample(kind)

    monkeypatch.setattr(sampler, "sample", recording)
    decode = sampler.beside(Work(lambda arg: order.append(f"run {arg}"), lambda: "prepared"), "decode b=1", "read")
    prefill = sampler.beside(Work(lambda: order.append("prefill")), "prefill", "matmul")
    for _ in range(2):
        decode.fn(decode.setup())
        prefill.fn(prefill.setup())
    assert order == ["sample read", "run prepared", "sample matmul", "prefill"] * 2
    assert len(sampler.samples["decode b=1"]) == len(sampler.samples["prefill"]) == 2
    assert sampler.median("decode b=1") > 0 and sampler.median("elsewhere") == 0.0
