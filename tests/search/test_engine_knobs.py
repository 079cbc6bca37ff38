"""The serving engines' knobs the simulator prices on GPUs (precision.py, overlap.py, CUDA graphs in
simulate.py's `launch_s`): each moves the estimate the way its mechanism says, DeepSeek-V3 on
8×H200 finds a feasible deployment (fp8 weights), and every emitted launch parses with the flag tables."""

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.hardware import BUILTIN
from moetune.search.cost.overlap import serial_layer, tbo_layer
from moetune.search.cost.simulate import Simulator
from moetune.search.study.emit import launch_text
from moetune.search.study.flag_table import check, commands_of
from moetune.search.study.space import Limits, canonical
from tests.search.test_engine_flags import DSV3, QWEN3, flags, launches
from tests.search.test_estimates_unchanged import synthetic_source

ROOT = Path(__file__).resolve().parents[2]


def _sim(hw=None) -> Simulator:
    return Simulator(synthetic_source(), hw or BUILTIN["H200"])


def _phases(sim, d, kind="decode"):
    return sim.evaluate(d).phases_ms[kind]


def test_fp8_kv_halves_the_cache_so_twice_the_sequences_fit():
    sim = _sim()
    d = Deployment(max_num_seqs=8)
    bf16, fp8 = sim.memory(d), sim.memory(replace(d, kv_format="fp8"))
    assert fp8.kv * 2 == pytest.approx(bf16.kv)  # same budget, 2× the sequences
    assert fp8.dense == bf16.dense and fp8.experts == bf16.experts
    # and a decode step reads half the context bytes: attention cannot get slower
    assert _phases(sim, replace(d, kv_format="fp8"))["attention"] < _phases(sim, d)["attention"]


def test_fp8_dense_weights_halve_their_bytes_and_compute_at_the_fp8_rate():
    sim = _sim()
    d = Deployment(max_num_seqs=8)
    fp8 = replace(d, dense_format="fp8")
    m = sim.src.model
    saved = sim.memory(d).dense - sim.memory(fp8).dense
    assert saved == pytest.approx(m.dense_projections() * (2 - (1 + 4 / 128)))  # embedding / LM head stay bf16
    assert _phases(sim, fp8)["attention"] < _phases(sim, d)["attention"]
    # compute-bound prefill: with no fp8 tensor cores only the bytes change, with them the GEMMs run 2× faster
    no_fp8 = _sim(replace(BUILTIN["H200"], fp8_flops=0.0))
    assert _phases(sim, fp8, "prefill")["attention"] < _phases(no_fp8, fp8, "prefill")["attention"]
    assert _phases(no_fp8, d, "prefill")["attention"] == _phases(sim, d, "prefill")["attention"]


def test_fp8_experts_compute_at_the_fp8_rate_int8_stays_weight_only():
    slow = replace(BUILTIN["H200"], flops=1e10, fp8_flops=2e10)  # compute-bound even on the toy model's shapes
    sim, no_fp8 = _sim(slow), _sim(replace(slow, fp8_flops=0.0))
    fp8, int8 = Deployment(max_num_seqs=8, quant_low_format="fp8"), Deployment(max_num_seqs=8, quant_low_format="int8")
    assert _phases(sim, fp8, "prefill")["experts"] < _phases(no_fp8, fp8, "prefill")["experts"]
    assert _phases(sim, int8, "prefill")["experts"] == _phases(no_fp8, int8, "prefill")["experts"]


def test_two_batch_overlap_never_beats_max_compute_comm_nor_loses_to_the_halves_back_to_back():
    rng = np.random.default_rng(0)
    for _ in range(200):
        pre, disp, exp, comb, post = rng.exponential(1.0, (5, 7))  # [Lm] one half's stages
        t = tbo_layer(pre, disp, exp, comb, post)
        assert np.all(t >= np.maximum(2 * (pre + exp + post), 2 * (disp + comb)) - 1e-12)
        assert np.all(t <= serial_layer(pre, disp, exp, comb, post) + 1e-12)
    sim = _sim()
    d = Deployment(ep_size=4, max_num_seqs=4)
    on = sim.evaluate(replace(d, overlap=1)).phases_ms["decode"]
    off = _phases(sim, d)
    assert on["overlap_hidden"] > 0
    # each half reads the experts' weights again: the halves' experts cost more than the whole batch's
    assert on["experts"] > off["experts"]
    assert "overlap_hidden" not in off


def test_overlap_is_moot_at_one_rank_and_a_graph_size_is_kept_as_sampled():
    lim = Limits(16, 2, 8, 8, True)
    d, notes = canonical(Deployment(ep_size=1, overlap=1), lim)
    assert d.overlap == 0 and any("overlap" in n for n in notes)
    d, _ = canonical(Deployment(ep_size=2, max_num_seqs=8, cuda_graph_max_bs=512), lim)
    assert d.cuda_graph_max_bs == 512  # kept: the launch flags say the size the user's engine captures


def test_cuda_graphs_remove_launch_cost_only_below_the_capture_size():
    sim = _sim()
    d = Deployment(max_num_seqs=8)
    legacy, eager = _phases(sim, d), _phases(sim, replace(d, cuda_graph_max_bs=0))
    captured, small = _phases(sim, replace(d, cuda_graph_max_bs=8)), _phases(sim, replace(d, cuda_graph_max_bs=1))
    assert captured["step"] == legacy["step"]  # every decode batch (≤ 8) replays a graph: the 2 µs gap only
    assert eager["step"] > captured["step"]  # launching each kernel from the CPU bounds the short kernels
    assert captured["step"] < small["step"] <= eager["step"]  # batches above 1 launch eagerly
    cpu = _sim(replace(BUILTIN["H200"], eager_launch_s=0.0))  # no eager figure (this-machine): not priced
    assert _phases(cpu, replace(d, cuda_graph_max_bs=0))["step"] == _phases(cpu, d)["step"]


def test_a_deepseek_v3_search_on_8_h200_finds_a_feasible_fp8_deployment(run_dir, tmp_path):
    from moetune.search.study.optuna_study import Constraints, StudySettings
    from moetune.search.study.run import SearchSettings, run_search
    from moetune.search.study.setup import Inputs

    space = tmp_path / "space.yaml"
    space.write_text("ep_size: 8\nreplicas: 1\nredundant_experts: 0\nplacement: contiguous\nmax_num_seqs: 8\n"
                     "max_num_batched_tokens: 512\nquant_low_format: [none, fp8]\nquant_hot_fraction: 0\n"
                     "offload_resident_fraction: 1\ndense_format: fp8\nkv_format: fp8\noverlap: 0\n"
                     "cuda_graph_max_bs: 32\n")
    out = tmp_path / "dsv3"
    st = StudySettings("d", f"sqlite:///{out / 'study.db'}", ("throughput_per_gpu",), "grid", 2, 0,
                       Constraints(max_ttft_ms=1000.0, max_tpot_ms=50.0))
    inputs = Inputs(str(run_dir), "8xH200", scale_model=str(ROOT / "recipes/scale/deepseek-v3.json"),
                    input_len=256, output_len=16, concurrency=16)
    result = run_search(SearchSettings(inputs, st, out, "simulate", str(space)))
    reasons = {r.params["quant_low_format"]: r.reason or "" for r in result.rows}
    assert not any(r.startswith("memory:") for r in reasons.values()), reasons  # the checkpoint is fp8 (its
    # quantization_config): `none` keeps its own fp8 experts (671 GB), which fit 8 × 141 GB, priced as stored
    w = result.winner
    assert w is not None and w.metrics["detail"]["stored_weights"] == "fp8" and w.deployment.dense_format == "fp8"
    assert w.metrics["peak_mem_gb"] < 141 * 0.9
    sglang = (out / "winner.sglang.sh").read_text()
    assert "--quantization fp8" in sglang and "--kv-cache-dtype fp8_e4m3" in sglang


KNOBS = [Deployment(ep_size=r, tp_size=g, expert_tp_size=g, quant_low_format=q, dense_format=df, kv_format=kv,
                    overlap=o, cuda_graph_max_bs=c)
         for r, g, q, df, kv, o, c in itertools.product((1, 8), (1, 2), ("none", "fp8", "int8"), ("none", "fp8"),
                                                         ("none", "fp8"), (0, 1), (-1, 0, 128))]


@pytest.mark.parametrize("target", [QWEN3, DSV3], ids=lambda t: t.model_type)
def test_the_engine_knobs_emit_flags_the_engines_parse(target):
    for d in KNOBS:
        for launch in launches(d, target):
            text = launch_text(launch, target, d.label(), {"output_tok_s": 1.0, "estimated": True})
            for argv in commands_of(text):
                assert check(launch.engine, argv) is None, (d, argv)
            f = flags(launch.nodes[0])
            vllm = launch.engine == "vllm"
            if d.kv_format == "fp8":
                assert f["--kv-cache-dtype"] == ("fp8" if vllm else "fp8_e4m3")
            if d.cuda_graph_max_bs == 0:
                assert ("--enforce-eager" if vllm else "--disable-decode-cuda-graph") in f
            if d.cuda_graph_max_bs > 0:
                assert f["--max-cudagraph-capture-size" if vllm else "--cuda-graph-max-bs-decode"] == "128"
            overlap = "--enable-dbo" if vllm else "--enable-two-batch-overlap"
            assert (overlap in f) == (launch.as_run.overlap == 1)
            if d.overlap and d.ep_size > 1 and (vllm or d.tp_size == 1):
                assert overlap in f
            if "--quantization" in f and f["--quantization"] == "fp8":  # both dense and experts, re-priced so
                assert launch.as_run.dense_format == launch.as_run.quant_low_format == "fp8"
            if d.dense_format == "fp8" and d.quant_low_format == "int8":
                assert launch.as_run.dense_format == "none" and "NOT as priced" in text


def test_cuda_graph_memory_grows_with_the_capture_size_so_a_memory_limit_picks_a_smaller_one():
    """memory.py graph_bytes: SGLang's reservation per captured batch size (server_args.py, 2 MB · n, and
    with DP attention + 3 MB · n · R, + 1.5 MB · n · R above n = 300), n the capture size up to max_num_seqs
    (no engine captures a batch larger than a rank runs); the step is the same for every size above the
    decode batch, so only a memory limit tells 128 from 512, and it picks 128."""
    from moetune.search.study.optuna_study import Constraints

    sim, MB = _sim(), 2 ** 20
    d = Deployment(max_num_seqs=512)
    assert sim.memory(d).graphs == 0 == sim.memory(replace(d, cuda_graph_max_bs=0)).graphs
    assert sim.memory(replace(d, cuda_graph_max_bs=32)).graphs == 32 * 2 * MB
    few = Deployment(ep_size=2, max_num_seqs=8)  # capture stops at the 8 sequences a rank runs
    assert sim.memory(replace(few, cuda_graph_max_bs=128)).graphs == sim.memory(replace(few, cuda_graph_max_bs=8)).graphs
    assert sim.memory(replace(few, cuda_graph_max_bs=512)).graphs == 8 * (2 + 3 * 2) * MB
    wide = Deployment(ep_size=2, max_num_seqs=512)
    assert sim.memory(replace(wide, cuda_graph_max_bs=128)).graphs == 128 * (2 + 3 * 2) * MB
    assert sim.memory(replace(wide, cuda_graph_max_bs=512)).graphs == 512 * (2 + 3 * 2 + 1.5 * 2) * MB
    small, big = sim.evaluate(replace(wide, cuda_graph_max_bs=128)), sim.evaluate(replace(wide, cuda_graph_max_bs=512))
    assert small.phases_ms["decode"]["step"] == big.phases_ms["decode"]["step"]  # both capture every batch of 8
    assert big.peak_mem_gb - small.peak_mem_gb == pytest.approx((512 * 11 - 128 * 8) * MB / 1e9)
    assert big.detail["memory"]["graphs"] > small.detail["memory"]["graphs"]
    limit = Constraints(max_mem_gb=(small.peak_mem_gb + big.peak_mem_gb) / 2)
    assert limit.violations(small) == [] and limit.violations(big)
