"""Scheduler and BlockManager alone (no model): budgets, caps, priorities, block accounting."""

from moetune.config import EngineConfig
from moetune.engine.block_manager import BlockManager
from moetune.engine.sampling import SamplingParams
from moetune.engine.scheduler import Scheduler
from moetune.engine.sequence import Sequence
from moetune.model.batch import StepKind


def _seq(i: int, n: int, priority: int = 0) -> Sequence:
    first = 3 + 100 * i  # distinct prompts: no prefix-cache hits between them
    return Sequence(i, list(range(first, first + n)), SamplingParams(max_tokens=8), frozenset(), 10_000, priority, i)


def _finish_step(sched, out) -> None:
    """What the engine's postprocess does: count computed tokens, sample a token where a prompt ended."""
    for e in out.entries:
        e.seq.num_computed_tokens += e.num_tokens
        sched.blocks.commit(e.seq)
        if e.seq.num_computed_tokens == e.seq.num_tokens:
            e.seq.in_prefill = False
            e.seq.output_ids.append(7)


def test_the_token_budget_and_the_sequence_cap_hold_every_step():
    sched = Scheduler(EngineConfig(max_num_seqs=3, max_num_batched_tokens=20), BlockManager(100, 4))
    for i, n in enumerate([30, 5, 9, 2, 1]):
        sched.add(_seq(i, n))
    kinds = []
    for _ in range(6):
        out = sched.schedule()
        assert out.num_tokens <= 20 and len(sched.running) <= 3
        kinds.append(out.kind)
        _finish_step(sched, out)
    assert kinds[0] == StepKind.PREFILL and StepKind.MIXED in kinds
    assert [s.seq_id for s in sched.running] == [0, 1, 2]  # FCFS: the first three hold the slots


def test_lower_priority_numbers_are_admitted_first():
    sched = Scheduler(EngineConfig(max_num_seqs=1), BlockManager(100, 4))
    sched.add(_seq(0, 5))
    sched.add(_seq(1, 5, priority=2))
    sched.add(_seq(2, 5, priority=1))
    assert [s.seq_id for s in sched.waiting] == [0, 2, 1]


def test_preemption_frees_the_latest_arrival_and_requeues_it_first():
    blocks = BlockManager(4, 4, prefix_caching=False)
    sched = Scheduler(EngineConfig(), blocks)
    a, b = _seq(0, 8), _seq(1, 8)  # two blocks each: the pool is full after their prefill
    sched.add(a)
    sched.add(b)
    _finish_step(sched, sched.schedule())
    out = sched.schedule()  # both need a third block for their next token
    assert out.preempted == [b] and [e.seq for e in out.entries] == [a]
    assert list(sched.waiting) == [b] and b.num_computed_tokens == 0 and b.block_table == []


def test_prefix_blocks_are_shared_and_reference_counted():
    blocks = BlockManager(10, 4)
    a, b = _seq(0, 10), _seq(0, 10)  # same tokens
    blocks.admit(a)
    blocks.grow(a, 10)
    a.num_computed_tokens = 10
    blocks.commit(a)
    assert blocks.admit(b) == 8  # two full blocks; the last token is always computed
    assert b.block_table == a.block_table[:2] and blocks.ref_counts[a.block_table[0]] == 2
    blocks.free(a)
    blocks.free(b)
    assert blocks.num_free == 10 and not any(blocks.ref_counts)
    c = _seq(0, 10)
    assert blocks.admit(c) == 8  # freed blocks keep their prefix until they are reused
