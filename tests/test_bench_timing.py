"""`measure_alternating`: two workloads' runs take turns, setups stay off the clock, and each side's
timing is its own."""

import time

import torch

from moetune.bench.timing import Work, measure_alternating


def test_runs_take_turns_and_setups_are_untimed():
    order = []

    def make(name, seconds):
        def setup():
            order.append(name + " setup")
            time.sleep(0.03)  # untimed
            return name

        def fn(arg):
            assert arg == name
            order.append(name)
            time.sleep(seconds)
        return Work(fn, setup)

    fast, slow = measure_alternating(make("a", 0.002), make("b", 0.012), torch.device("cpu"), runs=3, warmup=1)
    runs = [x for x in order if not x.endswith("setup")]
    assert runs == ["a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up pair, then three timed pairs
    assert fast.runs == slow.runs == 3
    assert fast.median_s < 0.009 < slow.median_s < 0.03  # neither side's setup nor the other side is counted
    assert fast.min_s <= fast.median_s <= fast.max_s
