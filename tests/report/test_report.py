"""Report renderers: pure functions of a run's summary and tables."""

import base64

import pytest

from moetune.config import parse_config
from moetune.profile.rundir import read_run
from moetune.profile.runner import ProfileSettings, run_profile
from moetune.profile.workload import Workload
from moetune.report.html import render_html
from moetune.report.markdown import render_markdown
from moetune.report.plots import all_plots
from moetune.report.tables import all_tables
from tests.html_check import assert_self_contained


@pytest.fixture(scope="module")
def run(checkpoint, tmp_path_factory):
    cfg = parse_config({"model": {"path": str(checkpoint("deepseek_v3", shard=False))}})
    workload = Workload(num_requests=2, batch_size=2, input_len=10, output_len=3, warmup_steps=0)
    out = tmp_path_factory.mktemp("runs") / "ds"
    return read_run(run_profile(ProfileSettings(cfg, workload, ep_size=4, ranks_per_node=2, out=out, what_if=True)).path)


@pytest.fixture(scope="module")
def ranked(checkpoint, tmp_path_factory):
    """Two ranks run for real, 1 per node; three requests: rank 1 idles through the second batch."""
    cfg = parse_config({"model": {"path": str(checkpoint("deepseek_v3", shard=False))}})
    workload = Workload(num_requests=3, batch_size=2, input_len=10, output_len=3, warmup_steps=0)
    out = tmp_path_factory.mktemp("runs") / "ds2"
    return read_run(run_profile(ProfileSettings(cfg, workload, ep_size=2, ranks_per_node=1, out=out)).path)


def test_every_plot_is_a_png(run):
    plots = all_plots(run.tables)
    assert [stem for stem, _, _ in plots] == ["phases", "expert_load", "rank_load", "gemm_m_shapes"]
    for _, _, png in plots:
        assert png.startswith(b"\x89PNG") and len(png) > 2000


def test_html_is_self_contained(run):
    plots = all_plots(run.tables)
    html = render_html(run.summary, run.env, plots)
    assert html.count('src="data:image/png;base64,') == len(plots)
    assert_self_contained(html)
    assert base64.b64encode(plots[0][2]).decode() in html
    for table in all_tables(run.summary):
        assert table.title.split(" (")[0] in html


def test_markdown_has_tables_and_plot_links(run):
    captions = [(stem, caption) for stem, caption, _ in all_plots(run.tables)]
    md = render_markdown(run.summary, run.env, captions, {"phases": "r_files/phases.png"})
    assert "![Phase breakdown, prefill vs decode (% of step time)](r_files/phases.png)" in md
    assert "| kind | layer | max/mean |" in md and "mean of layers" in md
    assert "R=4, 2 ranks/node" in md


def test_ep_table_reports_intra_and_inter_node_bytes(run):
    ep = run.summary["kinds"]["decode"]["ep"]
    assert len(ep["per_rank"]) == 4
    assert ep["intra_node_bytes"] > 0 and ep["inter_node_bytes"] > 0


def test_a_run_on_ranks_gets_the_per_rank_timeline_and_tables(ranked):
    plots = all_plots(ranked.tables)
    assert [stem for stem, _, _ in plots][-1] == "rank_timeline" and plots[-1][2].startswith(b"\x89PNG")
    md = render_markdown(ranked.summary, ranked.env, [(stem, caption) for stem, caption, _ in plots])
    assert "### Measured per rank (R=2 ranks run" in md and "### Which rank everyone waited for, per layer" in md
    assert "run on 2 ranks" in md and "(computed, not run)" not in md
    rows = [line for line in md.splitlines() if line.startswith("| decode | rank ") and "idle steps)" in line]
    assert len(rows) == 2 and "(2 idle steps)" in rows[1]  # rank 1 idles through batch 2 (2 decodes)
    html = render_html(ranked.summary, ranked.env, plots)
    assert "Which rank everyone waited for" in html and html.count("<img") == len(plots)


def test_a_one_process_run_has_no_rank_view(run):
    titles = [t.title for t in all_tables(run.summary)]
    assert not any(t.startswith("Measured per rank") for t in titles)


@pytest.fixture(scope="module")
def one_rank(checkpoint, tmp_path_factory):
    """R = 1 on the CPU, experts in two formats, offloaded, with a capacity factor."""
    import json

    ck = checkpoint("qwen3_moe", shard=False)
    d = tmp_path_factory.mktemp("runs")
    (d / "t.json").write_text(json.dumps({"default": ["int8", "fp32", "int8", "int8", "fp32", "int8", "int8"]}))
    cfg = parse_config({"model": {"path": str(ck)}, "quant": {"table": str(d / "t.json")},
                        "offload": {"resident_experts": 4, "prefetch_depth": 1}})
    workload = Workload(num_requests=2, batch_size=2, input_len=10, output_len=3, warmup_steps=0)
    return read_run(run_profile(ProfileSettings(cfg, workload, out=d / "r1", capacity_factor=1.0)).path)


def test_at_one_rank_on_the_cpu_rank_load_and_block_m_are_left_out(one_rank):
    assert "rank_load" not in [stem for stem, _, _ in all_plots(one_rank.tables, one_rank.summary)]
    tables = {t.title: t for t in all_tables(one_rank.summary)}
    assert tables["Expert GEMM rows"].columns == ["kind", "rows", "token drops"]
    assert "bal. ranks" not in tables["Most imbalanced layers"].columns
    assert not any(title.startswith(("Expert parallel load", "Expert parallel bytes")) for title in tables)


def test_at_four_ranks_the_rank_columns_stay(run):
    tables = {t.title: t for t in all_tables(run.summary)}
    assert "bal. ranks" in tables["Most imbalanced layers"].columns
    assert "Expert parallel bytes by locality" in tables


def test_the_deployment_table_says_formats_offload_and_drops(one_rank):
    from moetune.report.tables import deployment_table

    assert one_rank.summary["quant"]["formats"] == {"int8": 15, "fp32": 6}  # 3 MoE layers × (5 int8 + 2 fp32)
    rows = dict(deployment_table(one_rank.summary).rows)
    assert rows["expert formats"].startswith("int8 15 (71%), fp32 6 (29%)")
    hit = one_rank.summary["offload"]["total"]["hit_rate"]
    assert rows["offload"].startswith(f"hit rate {hit:.2f}")
    assert "over capacity factor 1.0" in rows["decode capacity drops"]


def test_html_renders_code_spans_not_backticks(one_rank):
    html = render_html(one_rank.summary, one_rank.env, all_plots(one_rank.tables, one_rank.summary))
    assert "`" not in html and "<code>other</code>" in html


def test_the_rank_timeline_splits_computing_transfer_and_waiting(ranked):
    """Dispatch and combine moving rows used to be drawn as computing (67-88 % of MoE time at R = 2 here)."""
    import numpy as np

    from moetune.report.ranks.plots import lane_segments

    seg = lane_segments(ranked.tables.rank_steps, ranked.tables.rank_moe)
    total = seg["computing"] + seg["transfer"] + seg["waiting"]
    assert np.allclose(total.to_numpy(), seg["step"].to_numpy())  # the three parts make each rank's step
    moe = ranked.tables.rank_moe
    assert seg["transfer"].to_numpy().sum() == pytest.approx(1e3 * moe.transfer_seconds.sum(), rel=1e-6)
    assert seg["transfer"].to_numpy().sum() > 0 and seg["waiting"].to_numpy().sum() > 0
