"""The `moetune profile --overhead` table: the probes' cost, and the fused path beside it when the model has one."""

from moetune.profile.overhead import OverheadResult
from moetune.report.overhead import overhead_table


def _result(fused_s=None) -> OverheadResult:
    return OverheadResult(runs=3, steps=100, off_s=[1.2, 1.0, 1.1], on_s=[1.1, 1.3, 1.2], null_scope_ns=50.0,
                          scopes_per_step=30, fused_s=fused_s)


def test_without_a_fused_path_the_table_is_probes_on_vs_off():
    r = _result()
    assert r.unfused_cost is None and r.fused_median is None
    assert abs(r.overhead - (1.2 / 1.1 - 1)) < 1e-12
    table = overhead_table(r)
    assert not any("fused" in str(row[0]) for row in table.rows)


def test_with_a_fused_path_the_unfused_cost_is_reported_beside_the_overhead():
    r = _result(fused_s=[0.9, 0.8, 1.0])
    assert abs(r.unfused_cost - (1.1 / 0.9 - 1)) < 1e-12
    table = overhead_table(r)
    assert table.rows[0][0].startswith("probes off, fused decode layers") and table.rows[0][1] == "0.900 s"
    assert table.rows[-1][1] == "+22.2% (medians)"
    assert "(unfused layers)" in table.rows[1][0]


def test_the_per_round_overhead_compares_each_rounds_adjacent_runs():
    r = OverheadResult(runs=3, steps=10, off_s=[1.2, 1.0, 1.1], on_s=[1.3, 1.05, 1.15], null_scope_ns=50.0,
                       scopes_per_step=30)
    assert abs(r.overhead - (1.15 / 1.1 - 1)) < 1e-12  # medians of each side
    assert abs(r.overhead_paired - (1.05 / 1.0 - 1)) < 1e-12  # rounds: 1.083, 1.05, 1.045
    assert any(row[1] == "+5.0% (median of on ÷ off)" for row in overhead_table(r).rows)


def test_in_run_blocks_pair_adjacent_blocks_and_cancel_a_steady_drift():
    from moetune.profile.overhead import BLOCK, StepBlocks, _SIDES

    n = 8 * BLOCK
    on = [_SIDES[(i // BLOCK) % len(_SIDES)] for i in range(n)]
    drift = [1.0 + 0.01 * i for i in range(n)]  # the machine slows down step by step
    seconds = [d * (1.04 if o else 1.0) for d, o in zip(drift, on)]  # probes cost 4 %
    blocks = StepBlocks(["decode"] * n, seconds, on)
    assert len(blocks.pairs("decode")) == 4
    assert abs(blocks.overhead("decode") - 0.04) < 0.003  # off/on and on/off pairs: the drift cancels
    assert abs(blocks.overhead_median("decode") - 0.04) < 0.01
    assert blocks.kinds_seen() == ["decode"]


def test_in_run_blocks_compare_a_step_kind_only_where_both_blocks_have_it():
    from moetune.profile.overhead import BLOCK, StepBlocks, _SIDES

    n = 4 * BLOCK
    on = [_SIDES[(i // BLOCK) % len(_SIDES)] for i in range(n)]
    kinds = ["decode"] * n
    kinds[0] = "prefill"  # an off block's prefill step with no probed prefill beside it
    seconds = [50.0 if k == "prefill" else (1.1 if o else 1.0) for k, o in zip(kinds, on)]
    blocks = StepBlocks(kinds, seconds, on)
    assert blocks.pairs("prefill") == [] and blocks.overhead("prefill") is None
    assert abs(blocks.overhead("decode") - 0.1) < 1e-9
    r = OverheadResult(runs=3, steps=10, off_s=[1.0] * 3, on_s=[1.1] * 3, null_scope_ns=50.0, scopes_per_step=30,
                       blocks=blocks)
    rows = [row for row in overhead_table(r).rows if "switched" in row[0]]
    assert len(rows) == 1 and rows[0][0].startswith("overhead on vs off, decode steps")
    assert rows[0][1] == "+10.0% (Σ on ÷ Σ off, 2 block pairs)"
