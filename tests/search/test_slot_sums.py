"""The compiled slot sums (cost/slots_fast.py) equal vector.slots_of's numpy reference within float
rounding, on awkward shapes: ranks that do not divide the experts evenly without redundant slots,
replicas of hot experts, a low-format share, fp8 slots, windows that wrap around the pools, halves."""

import numpy as np
import pytest

from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.vector import Windows, slots_of
from moetune.search.study.space import Deployment
from tests.search.test_estimates_unchanged import synthetic_source


SLOT_CASES = [
    (Deployment(max_num_seqs=8), 1),
    (Deployment(ep_size=3, redundant_experts=2, placement="eplb", max_num_seqs=5, quant_low_format="int4",
                quant_hot_fraction=0.25), 1),
    (Deployment(ep_size=4, redundant_experts=4, placement="round_robin", max_num_seqs=7, quant_low_format="fp8"), 2),
    (Deployment(ep_size=2, placement="eplb", redundant_experts=6, max_num_seqs=64, max_num_batched_tokens=256), 2),
]  # (deployment, halves): awkward EP sizes, replicas, placements, low formats


@pytest.mark.parametrize("d,halves", SLOT_CASES)
def test_the_compiled_slot_sums_equal_the_numpy_reference(d, halves):
    src = synthetic_source()
    sim = Simulator(src, BUILTIN["H200"])
    lens = tuple(int(x) for x in np.random.default_rng(3).integers(3, 700, size=57))  # windows wrap the pools
    s = sim.schedule(d, SimWorkload(lens, 9, "concurrency", 11, warmup=3))
    win, prep = Windows.of(sim, s), sim.prepare(sim.stored(d))
    fast, _ = slots_of(win, prep, d.ep_size, halves)
    plain, _ = slots_of(win, prep, d.ep_size, halves, plain=True)
    for name in ("rows_q", "act_bytes_q", "act_n_q", "fp8_rows_q", "low", "all"):
        a, b = getattr(fast, name), getattr(plain, name)
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-12, atol=1e-9), name
    assert plain.rows_q.sum() > 0 and (plain.act_n_q > 0).any()


@pytest.mark.parametrize("d", [Deployment(ep_size=3, redundant_experts=2, placement="eplb", max_num_seqs=5),
                               Deployment(ep_size=4, redundant_experts=4, placement="round_robin", max_num_seqs=64,
                                          max_num_batched_tokens=256)])
def test_the_compiled_sent_copies_equal_the_numpy_reference(d):
    src = synthetic_source()
    sim = Simulator(src, BUILTIN["H200"])
    lens = tuple(int(x) for x in np.random.default_rng(5).integers(3, 900, size=41))  # windows wrap the pools
    s = sim.schedule(d, SimWorkload(lens, 7, "concurrency", 9, warmup=2))
    win, prep = Windows.of(sim, s), sim.prepare(sim.stored(d))
    fast, plain = win.sent(prep.to_rank), win.sent(prep.to_rank, plain=True)
    assert fast.shape == plain.shape and np.allclose(fast, plain, rtol=1e-12, atol=1e-9) and plain.sum() > 0
