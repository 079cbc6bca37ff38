"""A general mesh's and a disaggregated trial's ops priced through the measured tables (cost/mesh.py,
cost/collective_tables.py, cost/disagg.py), and the primary launch file following --engine.

Without the gpu-db extra (CI) the table logic runs on tables whose figures are known exactly: the GEMM
rows of NVIDIA's H200 table (test_op_tables.py's fixture) and `LinearCollectives` below (every collective
α + bytes / B, the form a link has); with the extra, the real package's NCCL and DeepEP rows.
"""

import csv

import numpy as np
import pytest

from moetune.search.cost import collective_tables, op_tables
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.op_tables import Measured, TableChoice
from moetune.search.cost.phase_costs import AllToAll
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simmodel import SimModel
from tests.cli_run import moetune
from tests.search.test_op_tables import _sim, table  # noqa: F401 (the fixture)

LOOP = SimWorkload((170,) * 48, 12, mode="concurrency", concurrency=16)


class LinearCollectives:
    """Every NCCL collective and custom all-reduce α + x·D·2 bytes / B (x tokens of D bf16 elements),
    with its own (α, B) per op; no other op: everything else keeps the roofline."""

    label = "linear collectives"
    LINKS = {"all_gather": (10e-3, 300e9), "reduce_scatter": (12e-3, 250e9), "all_reduce": (15e-3, 200e9),
             "alltoall": (9e-3, 150e9), "custom": (5e-3, 400e9)}

    def latency_ms(self, op, x, y=1):
        kind = op.op if isinstance(op, op_tables.Nccl) else "custom" if isinstance(op, op_tables.AllReduce) else None
        if kind is None or op.G > 16:
            return None
        alpha, bw = self.LINKS[kind]
        return alpha + x * op.D * 2 / bw * 1e3

    @classmethod
    def seconds(cls, kind, x, D):
        alpha, bw = cls.LINKS[kind]
        return alpha * 1e-3 + x * D * 2 / bw


def _meas(backend, D=4096, ep=1, etp=1, tp=1, nodes=1, E=8, K=2, engine="vllm"):
    m = SimModel("m", D=D, E=E, K=K, I=1024, I_shared=0, L=2, moe_layers=(0, 1), dense_I=(), V=1000,
                 attn_weights=D * D, kv_elems=256, pair_flops=64, tied=False, kv_heads=4)
    return Measured(backend, m, m, tp, etp, ep, "bfloat16", "bfloat16", "bfloat16", engine=engine, nodes=nodes)


def test_gather_mode_collectives_come_from_the_tables_at_the_real_message_sizes():
    """DP-4 attention × TP-2 over 8 GPUs, TP-8 experts: moe_in is the all-gather of all T rows among the 4
    groups, moe_out the reduce-scatter of T rows among 8 plus the all-gather of the largest group's rows
    among its 2; under TP attention (a = 1): one all-reduce of T rows among 8."""
    D = 4096
    T, T_max = np.array([64.0, 4096.0]), np.array([20.0, 1500.0])
    roof = (np.full(2, 7.0), np.full(2, 9.0))  # what the roofline said: replaced wherever a table holds the piece
    meas = _meas(LinearCollectives(), D, etp=8, tp=2)
    d = Deployment(ep_size=1, expert_tp_size=8, tp_size=2, attn_dp=4, moe_a2a=0)
    moe_in, moe_out = collective_tables.gather_exchange(meas, d, 8, T, T_max, *roof)
    lin = LinearCollectives.seconds
    np.testing.assert_allclose(moe_in, lin("all_gather", T, D), rtol=1e-6)
    np.testing.assert_allclose(moe_out, lin("reduce_scatter", T, D) + lin("all_gather", T_max, D), rtol=1e-6)
    assert meas.sources["dispatch"] == meas.sources["combine"] == "linear collectives"
    assert meas.share_of("dispatch") == pytest.approx(1.0) and meas.share_of("combine") == pytest.approx(1.0)
    tp = Deployment(ep_size=1, expert_tp_size=8, tp_size=8, attn_dp=1, moe_a2a=0)
    meas = _meas(LinearCollectives(), D, etp=8, tp=8)
    moe_in, moe_out = collective_tables.gather_exchange(meas, tp, 8, T, T, *roof)
    np.testing.assert_allclose(moe_out, lin("custom", T, D), rtol=1e-6)  # one node: the custom all-reduce
    np.testing.assert_array_equal(moe_in, roof[0])


def test_a_collective_without_rows_at_its_node_span_keeps_the_roofline():
    """DP-2 attention × TP-8 over 16 GPUs: the 2 ranks of each all-gather sit on two nodes, and the table's
    2-rank rows are one node's: moe_in stays the roofline (labelled); the 16-rank reduce-scatter (two nodes,
    as the table's 16-rank rows) and the 8-rank all-gather inside a node come from the table."""
    D, T = 4096, np.array([100.0])
    meas = _meas(LinearCollectives(), D, etp=16, tp=8, nodes=2)
    d = Deployment(ep_size=1, expert_tp_size=16, tp_size=8, attn_dp=2, moe_a2a=0)
    moe_in, moe_out = collective_tables.gather_exchange(meas, d, 8, T, T, np.array([3.0]), np.array([5.0]))
    assert moe_in[0] == 3.0 and meas.sources["dispatch"] == collective_tables.ROOF and meas.share_of("dispatch") == 0
    lin = LinearCollectives.seconds
    assert moe_out[0] == pytest.approx(lin("reduce_scatter", 100.0, D) + lin("all_gather", 100.0, D))
    assert meas.share_of("combine") == pytest.approx(1.0)
    big = _meas(LinearCollectives(), D, etp=32, tp=8, nodes=4)  # 32 ranks: no rows; the split roofline part stays
    d32 = Deployment(ep_size=1, expert_tp_size=32, tp_size=8, attn_dp=4, moe_a2a=0)
    _, out32 = collective_tables.gather_exchange(big, d32, 8, T, T, np.array([3.0]), np.array([5.0]))
    share = 31 / 32 * 100 / (31 / 32 * 100 + 7 / 8 * 100)  # the reduce-scatter's part of the roofline's bytes
    assert out32[0] == pytest.approx(5.0 * share + lin("all_gather", 100.0, D))
    assert 0 < big.share_of("combine") < 1


class OneNodeDeepEP:
    """DeepEP rows measured on one node at EP 8 only (as vLLM's H200 tables): each kernel c + x µs, its own c."""

    label = "one-node deepep"
    C = {(True, True): 10.0, (True, False): 20.0, (False, True): 30.0, (False, False): 40.0}  # (ll, dispatch) → µs

    def latency_ms(self, op, x, y=1):
        if not isinstance(op, op_tables.DeepEP) or (op.ep, op.nodes) != (8, 1):
            return None
        return (self.C[(op.low_latency, op.dispatch)] + x) * 1e-3


def test_inter_node_deepep_is_priced_from_one_nodes_rows_and_says_so():
    """EP-16 on two nodes with one-node EP-8 rows only: those rows at the rank's tokens (the peer's substitution),
    the dispatch / combine source naming it; EP-4 (no rows at all): None (the caller's next table or roofline)."""
    meas = _meas(OneNodeDeepEP(), 7168, ep=16, nodes=2, E=256, K=8)
    tokens, prefill = np.array([1.0, 64.0, 512.0]), np.array([False, False, True])
    dispatch, combine = meas.dispatch(tokens, prefill)
    np.testing.assert_allclose(dispatch, (np.where(prefill, 30.0, 10.0) + tokens) * 1e-6, rtol=1e-9)
    np.testing.assert_allclose(combine, (np.where(prefill, 40.0, 20.0) + tokens) * 1e-6, rtol=1e-9)
    assert "EP-8 one-node rows for EP-16 on 2 nodes" in meas.sources["dispatch"]
    assert meas.sources["dispatch"].startswith("one-node deepep")  # listed among the measured ops
    assert _meas(OneNodeDeepEP(), 7168, ep=4, nodes=1, E=256, K=8).deepep_curves() is None


def test_a_tp_attention_mesh_dispatches_each_gpus_own_rows_through_deepep():
    """TP-8 attention × EP-8 experts: each GPU sends T / 8 of its group's rows; the DeepEP rows at that count."""
    meas = _meas(OneNodeDeepEP(), 7168, ep=8, tp=8, E=256, K=8)
    d = Deployment(ep_size=8, tp_size=8, attn_dp=1)
    roof = AllToAll(np.ones((2, 3)), np.ones((2, 3)), np.zeros(2), np.zeros(2))
    T = np.array([64.0, 4096.0])  # the group's rows in a decode and a prompt step
    got = collective_tables.a2a_exchange(meas, d, 8, roof, T / 8, np.zeros((2, 3)), np.array([False, True]))
    np.testing.assert_allclose(got.dispatch[:, 0], (np.array([10.0, 30.0]) + T / 8) * 1e-6, rtol=1e-9)
    assert got.dispatch.shape == (2, 3) and meas.share_of("combine") == pytest.approx(1.0)


def test_a_mesh_trial_binds_the_tables_to_its_own_mesh(table):  # noqa: F811
    """A general mesh prices its LM head and dense MLP from the GEMM table like any trial (the mesh path
    bound no tables: its trials recorded no source), and its measured share counts them."""
    for d in (Deployment(ep_size=1, expert_tp_size=4, attn_dp=4, moe_a2a=0, max_num_seqs=4),
              Deployment(ep_size=2, expert_tp_size=2, attn_dp=4, moe_a2a=0, max_num_seqs=4)):  # t 1: rows' shapes
        m = _sim(table, workload=LOOP).evaluate(d)
        assert m.detail["cost_source"] == "h200 vllm 0.24.0 gemm rows"
        assert m.detail["op_sources"]["dense_mlp"] == "h200 vllm 0.24.0 gemm rows"
        assert m.detail["op_sources"]["dispatch"] == collective_tables.ROOF  # GEMM rows only: no collective
        assert 0.0 < m.detail["measured_share"] < 1.0


def test_a_disaggregated_trial_records_each_workers_sources_and_its_measured_share(table):  # noqa: F811
    d = Deployment(ep_size=2, max_num_seqs=16, prefill_workers=1, decode_workers=1, prefill_ep=1)
    m = _sim(table, workload=LOOP).evaluate(d)
    dis = m.detail["disagg"]
    assert m.detail["cost_source"] == "h200 vllm 0.24.0 gemm rows"
    ops = m.detail["op_sources"]
    assert ops["decode:other"] == ops["prefill:other"] == "h200 vllm 0.24.0 gemm rows"
    assert 0 < dis["prefill_measured_share"] < 1 and 0 < dis["decode_measured_share"] < 1
    lo, hi = sorted((dis["prefill_measured_share"], dis["decode_measured_share"]))
    assert lo <= m.detail["measured_share"] <= hi  # the two weighted by a request's seconds in each
    assert "% of the step time from measured tables" in op_tables.cost_sentence(m.detail)
    plain = _sim(TableChoice("vllm", None, None, f"{op_tables.UNMEASURED}: no tables"), workload=LOOP).evaluate(d)
    assert plain.detail["cost_source"] == op_tables.UNMEASURED and plain.detail["measured_share"] == 0.0


def test_search_csv_and_launch_files_say_the_cost_source_of_disaggregated_trials(run_dir, tmp_path):
    """Every completed trial, aggregated or disaggregated, has cost_source and measured_share in trials.csv;
    the disaggregated winner's launch files say which tables priced it."""
    space = tmp_path / "space.yaml"
    space.write_text("ep_size: [1, 2]\nprefill_workers: 1\ndecode_workers: 1\nreplicas: 1\n")
    out = tmp_path / "o"
    r = moetune("search", "--trace", str(run_dir), "--hardware", "8xH200", "--concurrency", "8", "--num-requests",
                "32", "--output-len", "8", "--n-trials", "3", "--seed", "1", "--space", str(space), "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [x for x in csv.DictReader((out / "trials.csv").open()) if x["state"] == "COMPLETE"]
    assert all(x["cost_source"] and x["measured_share"] != "" for x in rows), rows
    assert all("1P[EP" in x["deployment"] for x in rows)  # prefill_workers 1: every trial disaggregated
    for engine in ("vllm", "sglang"):
        assert "GPU op costs:" in (out / f"winner.{engine}.sh").read_text()
    assert "GPU op costs:" in (out / "report.md").read_text()


def test_the_primary_launch_file_follows_engine(run_dir, big_config, tmp_path):
    out = tmp_path / "o"
    r = moetune("search", "--trace", str(run_dir), "--hardware", "8xH200", "--scale-model", str(big_config),
                "--input-len", "64", "--output-len", "4", "--n-trials", "2", "--engine", "sglang", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    listed = [line.split(": ", 1) for line in r.stdout.splitlines() if line.strip().startswith(("launch:", "vllm:",
                                                                                                  "sglang:"))]
    names = [name.strip() for name, _ in listed]
    assert names[:2] == ["launch", "sglang"] and listed[0][1].strip().endswith("winner.sglang.sh")
    assert "# primary launch file (--engine sglang" in (out / "winner.sglang.sh").read_text()
    assert "priced on sglang's op tables" in (out / "winner.vllm.sh").read_text()


def _real(engine="vllm"):
    """The real package's tables (the gpu-db extra); CI, without it, skips the test."""
    pytest.importorskip("aiconfigurator_core", reason="the gpu-db extra (aiconfigurator-core) is not installed")
    choice = op_tables.choose("H200", engine)
    assert choice.backend is not None
    return choice.backend


def test_the_real_nccl_rows_price_a_mesh_gather():
    backend = _real()
    meas = _meas(backend, 4096, etp=4)
    d = Deployment(ep_size=1, expert_tp_size=4, attn_dp=4, moe_a2a=0)
    T = np.array([256.0])
    moe_in, moe_out = collective_tables.gather_exchange(meas, d, 8, T, T / 4, np.ones(1), np.ones(1))
    assert moe_in[0] == pytest.approx(backend.latency_ms(op_tables.Nccl("all_gather", 4096, 4), 256) * 1e-3, rel=0.02)
    assert moe_out[0] == pytest.approx(backend.latency_ms(op_tables.Nccl("reduce_scatter", 4096, 4), 256) * 1e-3,
                                       rel=0.02)
    assert meas.sources["dispatch"].startswith("aiconfigurator-core")


def test_inter_node_deepep_uses_one_nodes_rows_where_the_tables_lack_two_nodes():
    """vLLM's tables hold DeepEP at EP-8 on one node only: EP-16 on two nodes is priced from those rows (as
    AIConfigurator substitutes them), said in its source; SGLang's hold two-node rows: those."""
    vllm = _meas(_real("vllm"), 7168, ep=16, nodes=2, E=256, K=8)
    one = _meas(_real("vllm"), 7168, ep=8, nodes=1, E=256, K=8)
    tokens = np.array([1.0, 64.0, 700.0])
    got, ref = vllm.dispatch(tokens, np.zeros(3, bool)), one.dispatch(tokens, np.zeros(3, bool))
    np.testing.assert_allclose(got[0], ref[0])
    np.testing.assert_allclose(got[1], ref[1])
    assert "one-node rows for EP-16 on 2 nodes" in vllm.sources["dispatch"]
    sglang = _meas(_real("sglang"), 7168, ep=16, nodes=2, E=256, K=8, engine="sglang")
    assert sglang.deepep_curves() is not None and "dispatch" not in sglang.sources  # measured on two nodes
