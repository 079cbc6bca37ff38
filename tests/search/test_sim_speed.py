"""The simulator's speed paths keep every figure (issue 38: trials at most 0.5 s, fidelity kept):
- the compiled slot sums (cost/slots_fast.py: windows in parallel, one division per expert, each rank's
  slots summed in registers) equal a slot-by-slot sum bit for bit, on awkward shapes;
- the pools' prefix counts (vector.PoolCounts: one pass, the second copy added) equal a count over the
  pool written twice;
- warming a simulator before the first trial (cost/warm.py) changes no trial value and no load hint, on
  the roofline (no gpu-db extra needed), on a measured table (the parquet layout) and, where the extra
  is installed, on NVIDIA's tables.
"""

import numpy as np
import pytest

from moetune.search.cost import op_tables
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simulate import Simulator
from moetune.search.cost.slots_fast import slot_sums
from moetune.search.cost.vector import PoolCounts, Windows
from moetune.search.cost.warm import warm
from moetune.search.study.space import Deployment
from tests.search.test_estimates_unchanged import synthetic_source
from tests.search.test_op_tables import table  # noqa: F401 - the module's parquet table fixture
from tests.search.test_slot_sums import SLOT_CASES


def slot_by_slot(win, keys, prep, R: int, halves: int) -> list[np.ndarray]:
    """slots_fast's module formula, one slot at a time into the arrays (the order the sums are defined in)."""
    Lm, P = prep.phy2log.shape
    out = [np.zeros((len(keys), Lm, R)) for _ in range(4)] + [np.zeros(len(keys)), np.zeros(len(keys)),
                                                               np.zeros((len(keys), Lm, R))]
    rows_q, bytes_q, n_q, fp8_q, low, all_, low_q = out
    for u, (ps, pn, ds, dn) in enumerate(keys):
        total = (win.pre.window(win.pre.prefix, np.array(ps), np.array(pn))
                 + win.dec.window(win.dec.prefix, np.array(ds), np.array(dn))).astype(np.int64)  # [Lm·E]
        for j in range(Lm):
            for p in range(P):
                c = int(total[j * win.pre.E + prep.phy2log[j, p]]) / halves
                rows, q = c / prep.reps_slot[j, p], p // (P // R)
                rows_q[u, j, q] += rows
                fp8_q[u, j, q] += rows * prep.fp8_slot[j, p]
                low_q[u, j, q] += rows * prep.low_share_slot[j, p]
                if c > prep.replica_idx[j, p]:
                    bytes_q[u, j, q] += prep.slot_bytes[j, p]
                    n_q[u, j, q] += 1.0
                low[u] += rows * prep.low_share_slot[j, p]
                all_[u] += rows
    return out


@pytest.mark.parametrize("d,halves", SLOT_CASES)
def test_the_compiled_slot_sums_equal_a_slot_by_slot_sum_bit_for_bit(d, halves):
    sim = Simulator(synthetic_source(), BUILTIN["H200"])
    lens = tuple(int(x) for x in np.random.default_rng(3).integers(3, 700, size=31))  # windows wrap the pools
    s = sim.schedule(d, SimWorkload(lens, 9, "concurrency", 11, warmup=3))
    win, prep = Windows.of(sim, s), sim.prepare(sim.stored(d))
    keys, _ = win.step_keys()
    fast, plain = slot_sums(win, keys, prep, d.ep_size, halves), slot_by_slot(win, keys, prep, d.ep_size, halves)
    for name, a, b in zip(("rows_q", "act_bytes_q", "act_n_q", "fp8_rows_q", "low", "all", "low_rows_q"), fast, plain,
                           strict=True):
        assert a.shape == b.shape and np.array_equal(a, b), name
    assert plain[0].sum() > 0 and (plain[2] > 0).any() and len(keys) > 20


@pytest.mark.parametrize("n", [1, 2, 57])
def test_the_prefix_counts_equal_a_count_over_the_pool_written_twice(n):
    rng = np.random.default_rng(n)
    Lm, E, K = 3, 7, 2
    pool = rng.integers(0, E, size=(n, Lm, K)).astype(np.uint16)  # repeats within a row too
    twice = np.concatenate([pool, pool])
    plain = np.zeros((2 * n + 1, Lm * E), dtype=np.int64)
    for i, row in enumerate(twice):
        plain[i + 1] = plain[i]
        for j in range(Lm):
            for e in row[j]:
                plain[i + 1, j * E + int(e)] += 1
    got = PoolCounts(pool, Lm, E).prefix
    assert got.dtype == np.int32 and np.array_equal(got, plain)


DEPLOYMENTS = [Deployment(ep_size=4, placement="eplb", redundant_experts=4, max_num_seqs=32,
                          max_num_batched_tokens=256, cuda_graph_max_bs=32),
               Deployment(ep_size=2, max_num_seqs=16, quant_low_format="fp8", overlap=1),
               Deployment(max_num_seqs=64, offload_resident_fraction=0.5, offload_prefetch_depth=1),
               Deployment(ep_size=4, placement="round_robin", max_num_seqs=64, max_num_batched_tokens=512)]


def _study_like(tables, warmed: bool):
    """The figures of a few trials priced in order as a search prices them (the SLO load found per trial,
    the hints carried from one to the next), on a fresh simulator, warmed first or not."""
    src = synthetic_source()
    sim = Simulator(src, BUILTIN["H200"])
    sim.tables = tables
    if warmed:
        warm(sim)
        assert sim.pool_cache and not sim.load_hints  # it loaded the prefix counts and found no load
    w = SimWorkload(tuple(np.random.default_rng(1).integers(8, 300, size=64).tolist()), 12, "concurrency", 64,
                    slo_ttft_ms=40.0, slo_tpot_ms=2.0, find_load=True)
    return [sim.evaluate(d, w).as_dict() for d in DEPLOYMENTS], dict(sim.load_hints)


def _same_trials(tables):
    (cold, cold_hints), (warm_, warm_hints) = _study_like(tables, False), _study_like(tables, True)
    assert cold == warm_ and cold_hints == warm_hints
    assert len({m["detail"]["load"]["concurrency"] for m in cold}) > 1  # the loads found differ: a real search


def test_warming_changes_no_trial_on_the_roofline():
    _same_trials(None)


def test_warming_changes_no_trial_on_a_measured_table(table):  # noqa: F811 - the fixture
    _same_trials(table)


@pytest.mark.skipif(not op_tables.installed(), reason="needs aiconfigurator_core (the gpu-db extra), absent in CI")
def test_warming_changes_no_trial_on_nvidias_tables():
    choice = op_tables.choose("H200", "vllm")
    assert choice.backend is not None
    _same_trials(choice)


DISAGG = [Deployment(ep_size=2, max_num_seqs=32, prefill_workers=1, prefill_ep=2, prefill_tokens=512),
          Deployment(ep_size=4, max_num_seqs=16, prefill_workers=2, prefill_ep=2, prefill_tokens=1024),
          Deployment(ep_size=2, max_num_seqs=32, prefill_workers=1, prefill_ep=4, prefill_tokens=512)]


@pytest.mark.parametrize("memo", [True, False])
def test_a_disaggregated_worker_step_is_priced_once_with_the_same_figures(memo):
    """disagg.one_step kept per (worker, step rows) on the simulator equals it priced each time (the plain
    twin: step_memo None), over a load search of several deployments sharing workers."""
    def trials(keep: bool):
        sim = Simulator(synthetic_source(), BUILTIN["H200"].with_nodes(2))
        sim.step_memo = {} if keep else None
        w = SimWorkload((60, 80, 100, 120) * 8, 12, "concurrency", 32, slo_ttft_ms=30.0, slo_tpot_ms=1.5,
                        find_load=True)
        return [sim.evaluate(d, w).as_dict() for d in DISAGG], sim
    kept, sim = trials(memo)
    plain, _ = trials(False)
    assert kept == plain
    assert (len(sim.step_memo) > 0) if memo else sim.step_memo is None
    assert all(m["output_tok_s"] > 0 for m in plain)
