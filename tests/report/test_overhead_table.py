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
