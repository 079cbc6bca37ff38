"""Measured GPU op costs (search/cost/op_tables.py): a table op is priced from the table when the table
holds it and by the roofline, labelled, when not; the vectorised pricing equals the per-step loop with
tables bound; without the gpu-db extra every figure says `roofline (unmeasured)`.

The tiny table is real: rows of NVIDIA's measured H200 GEMM table (aiconfigurator-core 0.12.0,
systems/data/h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet, bfloat16, torch.nn.functional.linear), written in
that file's own format (columns gemm_dtype, m, n, k, latency in ms), for the synthetic model's LM head
(4096 × 256) and dense MLP (gate/up 2048 × 256, down 256 × 1024). Its router (16 × 256) and attention
are not in it: those stay roofline.
"""

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moetune.search.cost import op_tables, phase_costs, table_curves
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.op_tables import UNMEASURED, ParquetBackend, TableChoice
from moetune.search.cost.simulate import Simulator
from tests.cli_run import assert_one_line_error, moetune
from tests.search.test_estimates_unchanged import hardware_of, synthetic_source
from tests.search.test_vector_price import BURST, LOOP, _close

ROWS = [  # (m, n, k, ms) copied from the package's H200 vLLM 0.24.0 GEMM table
    (1, 4096, 256, 0.003143), (8, 4096, 256, 0.003126), (32, 4096, 256, 0.003204), (128, 4096, 256, 0.003535),
    (512, 4096, 256, 0.0049), (2048, 4096, 256, 0.011193), (8192, 4096, 256, 0.040651),
    (1, 2048, 256, 0.003003), (8, 2048, 256, 0.002981), (32, 2048, 256, 0.003077), (128, 2048, 256, 0.003251),
    (512, 2048, 256, 0.003947), (2048, 2048, 256, 0.00674), (8192, 2048, 256, 0.021136),
    (1, 256, 1024, 0.003886), (8, 256, 1024, 0.003882), (32, 256, 1024, 0.003979), (128, 256, 1024, 0.00402),
    (512, 256, 1024, 0.004223), (2048, 256, 1024, 0.00467), (8192, 256, 1024, 0.008197),
]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemm") / "gemm_perf.parquet"
    m, n, k, ms = zip(*ROWS)
    pq.write_table(pa.table({"framework": ["VLLM"] * len(ROWS), "version": ["0.24.0"] * len(ROWS),
                             "device": ["NVIDIA H200"] * len(ROWS), "op_name": ["gemm"] * len(ROWS),
                             "kernel_source": ["torch.nn.functional.linear"] * len(ROWS),
                             "gemm_dtype": ["bfloat16"] * len(ROWS), "m": list(m), "n": list(n), "k": list(k),
                             "latency": list(ms)}), path)
    return TableChoice("vllm", "0.24.0", ParquetBackend(path, "h200 vllm 0.24.0 gemm rows"), "measured: test rows")


def _sim(choice, reference=False, workload=BURST) -> Simulator:
    sim = Simulator(synthetic_source(11, 170, 90).with_workload(workload), hardware_of("H200"))
    sim.tables, sim.reference = choice, reference
    return sim


def _ms(n, k):
    rows = sorted((m, ms) for m, nn, kk, ms in ROWS if (nn, kk) == (n, k))
    return np.array([r[0] for r in rows], float), np.array([r[1] for r in rows])


def test_a_gemm_in_the_table_is_priced_from_it_and_one_outside_by_the_roofline(table):
    sim = _sim(table)
    d = Deployment(ep_size=2, max_num_seqs=8)
    sim.pricing(d)  # binds the tables to d's per-rank shapes
    T = np.array([[1.0, 5.0], [77.0, 3000.0]])  # [S, R] tokens of two steps on two ranks
    st = phase_costs.StepRows(T, 0 * T, T * 40, T * 40, T, 2, None, 0 * T)
    m_rows, ms = _ms(4096, 256)
    head = phase_costs.other(sim, st, 0.0)
    calls = sim.roof(0 * T, 0 * T, phase_costs.CALLS["step"][0], 2, "other")  # the engine's per-step calls
    np.testing.assert_allclose(head, np.interp(T, m_rows, ms) * 1e-3 + calls, rtol=1e-9)
    up, down = _ms(2048, 256), _ms(256, 1024)
    np.testing.assert_allclose(phase_costs.dense_mlp(sim, st),
                               (np.interp(T, *up) + np.interp(T, *down)) * 1e-3, rtol=1e-9)
    roof = _sim(None)
    roof.pricing(d)
    np.testing.assert_allclose(phase_costs.router(sim, st), phase_costs.router(roof, st))  # 16 × 256: no rows
    assert sim.measured.sources["router"] == "roofline (no table entry)"
    assert sim.measured.sources["other"] == "h200 vllm 0.24.0 gemm rows"


def test_a_trial_records_its_sources_and_measured_share(table):
    m = _sim(table).evaluate(Deployment(ep_size=2, max_num_seqs=8))
    assert m.detail["cost_source"] == "h200 vllm 0.24.0 gemm rows"
    assert m.detail["op_sources"]["dense_mlp"] == "h200 vllm 0.24.0 gemm rows"
    assert m.detail["op_sources"]["attention"] == "roofline (no table entry)"
    assert 0.0 < m.detail["measured_share"] < 1.0
    assert "% of the step time from measured tables" in op_tables.cost_sentence(m.detail)
    plain = _sim(TableChoice("vllm", None, None, f"{UNMEASURED}: no tables")).evaluate(Deployment(ep_size=2,
                                                                                                 max_num_seqs=8))
    assert plain.detail["cost_source"] == UNMEASURED and plain.detail["measured_share"] == 0.0
    assert "cost_source" not in _sim(None).evaluate(Deployment(ep_size=2, max_num_seqs=8)).detail  # this-machine
    assert m.tpot_ms != plain.tpot_ms  # the table's LM head and MLP are not the roofline's


@pytest.mark.parametrize("workload", [BURST, LOOP], ids=["burst", "closed-loop"])
@pytest.mark.parametrize("d", [Deployment(ep_size=4, max_num_seqs=8, overlap=1, cuda_graph_max_bs=4),
                               Deployment(ep_size=2, tp_size=2, expert_tp_size=2, max_num_seqs=8)],
                         ids=["ep4-tbo", "tp2"])
def test_the_vectorised_pricing_equals_the_per_step_loop_with_tables(table, d, workload):
    fast, ref = _sim(table, False, workload).evaluate(d), _sim(table, True, workload).evaluate(d)
    assert _close(fast.as_dict(), ref.as_dict()) == []


def test_the_roofline_prices_hardware_the_tables_lack():
    choice = op_tables.choose("this-machine")
    assert choice.backend is None and choice.label == UNMEASURED
    assert UNMEASURED in choice.note


@pytest.mark.skipif(op_tables.installed(), reason="the gpu-db extra is installed: figures are measured")
def test_without_the_extra_every_figure_is_labelled_unmeasured(run_dir, big_config):
    choice = op_tables.choose("H200", "vllm")
    assert choice.backend is None and "install moetune[gpu-db]" in choice.note
    out = moetune("simulate", "--trace", str(run_dir), "--hardware", "8xH200", "--scale-model", str(big_config),
                  "--input-len", "64", "--output-len", "4", "--engine", "sglang")
    assert out.returncode == 0, out.stderr
    assert f"GPU op costs: {UNMEASURED}: install moetune[gpu-db]" in " ".join(out.stdout.split())


def test_an_unknown_engine_is_one_line(run_dir):
    assert_one_line_error(moetune("simulate", "--trace", str(run_dir), "--hardware", "H200", "--engine", "trtllm"),
                          "--engine 'trtllm' is not one of vllm, sglang")


def test_the_real_package_prices_a_gemm_from_its_tables():
    pytest.importorskip("aiconfigurator_core")
    choice = op_tables.choose("H200", "vllm")
    assert choice.backend is not None and "h200_sxm vllm" in choice.label
    op = op_tables.Gemm(4096, 4096, "bfloat16")
    c = op_tables.curve(choice.backend, op)
    for x in (1, 64, 1000):
        assert table_curves.at(c, x) == pytest.approx(choice.backend.latency_ms(op, x) * 1e-3, rel=0.02)
    assert choice.backend.latency_ms(op_tables.Gemm(4096, 4096, "nvfp4_wo"), 8) is None  # no rows: roofline
    assert json.dumps(op_tables.choose("H200", "vllm", "0.0.1").note).startswith(f'"{UNMEASURED}')


@pytest.mark.skipif(op_tables.installed(), reason="the gpu-db extra is installed: figures are measured")
def test_without_the_extra_a_search_labels_its_trials_and_winner_unmeasured(run_dir, big_config, tmp_path):
    out = tmp_path / "o"
    got = moetune("search", "--trace", str(run_dir), "--hardware", "8xH200", "--scale-model", str(big_config),
                  "--input-len", "64", "--output-len", "4", "--n-trials", "3", "--out", str(out))
    assert got.returncode == 0, got.stderr
    import csv

    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert rows and all(r["cost_source"] == UNMEASURED for r in rows if r["state"] == "COMPLETE")
    assert all(float(r["measured_share"]) == 0.0 for r in rows if r["state"] == "COMPLETE")
    assert "GPU op costs: roofline (unmeasured)" in (out / "report.md").read_text()
    assert "GPU op costs: roofline (unmeasured)" in (out / "winner.yaml").read_text()
    assert "GPU op costs: roofline (unmeasured)" in (out / "winner.vllm.sh").read_text()


class BilinearAttention:
    """A table whose attention kernel costs b·s µs (exactly bilinear): the grid sampler and its
    interpolation must give it back at any point, inside the grid, past its last batch, below one."""

    label = "b·s µs"

    def latency_ms(self, op, x, y=1):
        if isinstance(op, op_tables.Attention):
            return None if op.module else x * y * 1e-3
        return {op_tables.Gemm: 0.0, op_tables.MlaBmm: 2e-3}.get(type(op))  # each absorbed BMM 2 µs; no modules


def test_the_attention_grid_interpolates_a_bilinear_table_exactly():
    g = op_tables.grid(BilinearAttention(), op_tables.Attention(False, 8, 2, 64, "bfloat16"))
    b = np.array([1.0, 3.0, 37.5, 700.0, 2048.0, 0.25])  # inside, between points, past 1024, a share of one
    s = np.array([16.0, 100.0, 3000.0, 5000.0, 777.0, 4096.0])
    np.testing.assert_allclose(table_curves.at2(g, b, s), b * s * 1e-6, rtol=1e-9)
    assert table_curves.at2(g, np.zeros(1), np.ones(1) * 64)[0] == 0.0


def test_a_prompt_step_is_priced_as_its_prompts():
    """A rank's prompt tokens are b prompts of s tokens (b·s tokens, b·s²/2 pairs) at the context table's
    (b, s); a decode-only rank is its sequences at their mean KV length (projections: 0 s in this table)."""
    m = replace(synthetic_source().model, heads=4, kv_heads=2)  # GQA: 4 heads, 2 KV heads of 64
    meas = op_tables.Measured(BilinearAttention(), m, m, 1, 1, 1, "bfloat16", "bfloat16", "bfloat16")
    T = np.array([4 * 512.0, 0.25 * 512, 64.0])  # 4 prompts of 512; a 128-token chunk after a 192 prefix; decode
    prefill = np.array([4 * 512.0, 128.0, 0.0])
    pairs = np.array([4 * 512.0 ** 2 / 2, 128 * 192 + 128 ** 2 / 2, 64 * 300.0])
    got = meas.attention(T, prefill, pairs, np.array([0.0, 0.0, 64 * 300.0]))
    np.testing.assert_allclose(got, [4 * 512 * 1e-6, 128 * 1e-6, 64 * 300 * 1e-6], rtol=1e-9)  # b·s µs


def test_mla_is_priced_as_its_op_list_where_the_engine_has_no_module_rows():
    """SGLang's MLA (no module rows): kernel + the two absorbed BMMs (+ GEMMs, 0 s in this table)."""
    m = replace(synthetic_source().model, heads=16, kv_heads=0, mla=(64, 32, 16, 8, 16))
    meas = op_tables.Measured(BilinearAttention(), m, m, 1, 1, 1, "bfloat16", "bfloat16", "bfloat16", engine="sglang")
    T = np.array([32.0, 0.0])
    got = meas.attention(T, 0 * T, T * 1000, T * 1000)
    np.testing.assert_allclose(got, [32 * 1000 * 1e-6 + 2 * 2e-6, 0.0], rtol=1e-9)
