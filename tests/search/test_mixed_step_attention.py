"""A mixed step's attention from the measured tables (search/cost/op_tables.py `mixed_split`): a rank's prompt
tokens go through the context kernel and its decode rows through the generation kernel at their own KV
length, as the engines run them and as AIConfigurator prices a mixed step (context attention + generation
attention). Folding the decode rows into the prompts' (query, key) pairs priced their KV reads at the
context kernel's compute rate: on Qwen3-30B-A3B's steady state at 384 in flight on one H200 that took
~12 ms out of a 49 ms step (docs/search-numbers.md, "the 1-GPU replica beside the peer").
"""

from pathlib import Path

import numpy as np
import pytest

from moetune.search.cost import op_tables, phase_costs
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.op_tables import mixed_split
from moetune.search.cost.schedule import Replay, SimWorkload
from tests.search.test_op_tables import BilinearAttention

SCALE = Path(__file__).resolve().parents[2] / "recipes" / "scale"


def _gqa_tables():
    from dataclasses import replace

    from tests.search.test_estimates_unchanged import synthetic_source

    m = replace(synthetic_source().model, heads=4, kv_heads=2)  # GQA: 4 heads, 2 KV heads of 64
    return op_tables.Measured(BilinearAttention(), m, m, 1, 1, 1, "bfloat16", "bfloat16", "bfloat16")


def test_a_mixed_step_is_its_prompts_context_attention_plus_its_decode_rows_generation_attention():
    """Two fresh prompts of 1,024 tokens beside 382 decode rows at KV 1,152 (the schedule's counts: a decode
    row's pairs = KV = computed + 1). On a table whose kernels cost b·s µs: context (2, 1,024) 2,048 µs +
    generation (382, 1,152) 440,064 µs. The fold priced it as 1.98 prompts of 1,226: 2,430 µs."""
    meas = _gqa_tables()
    prefill, decode, kv = 2048.0, 382.0, 1152.0
    pairs = 2 * 1024 * 1025 / 2 + decode * kv
    context = prefill + decode * kv
    T = np.array([prefill + decode, decode, prefill])  # mixed; the decode rows alone; the prompts alone
    got = meas.attention(T, np.array([prefill, 0.0, prefill]), np.array([pairs, decode * kv, 2 * 1024 * 1025 / 2]),
                         np.array([context, decode * kv, prefill]))
    ctx, gen = prefill * 1e-6, decode * kv * 1e-6  # context: b·s = the prompt tokens; generation: rows × KV
    np.testing.assert_allclose(got, [ctx + gen, gen, ctx], rtol=1e-9)
    assert got[0] >= got[1]  # a prompt beside the decode rows never makes their attention cheaper


def test_the_decode_rows_kv_is_the_schedules_own_over_by_the_continued_chunks_prefixes():
    """Replayed by the engine's scheduler (chunked prompts, decodes beside them), each step's decode rows read
    exactly the KV `mixed_split` gives them, less the prefixes of the prompt chunks that continue a prompt."""
    w = SimWorkload(tuple([40, 7, 25, 60, 3, 33] * 3), 9)
    r = Replay(w, 1, max_num_seqs=5, max_num_batched_tokens=24)
    for i in range(w.num_requests):
        r.arrive(i)
    plen = np.array(w.prompt_lens)
    checked = continued = 0
    while r.has_work():
        before = r.computed.copy()
        row, _ = r.step()
        prefill, dec, pairs, context = (float(x) for x in row[0, :4])
        took = r.computed - before
        is_dec = (took > 0) & (before >= plen)
        is_pre = (took > 0) & (before < plen)
        true_kv = float((before[is_dec] + 1).sum())
        prefixes = float(before[is_pre].sum())
        d, dec_len, _, _ = mixed_split(np.array([prefill + dec]), np.array([prefill]), np.array([pairs]),
                                       np.array([context]))
        assert d[0] == is_dec.sum()
        assert d[0] * dec_len[0] == pytest.approx(true_kv + (prefixes if d[0] else 0.0))
        checked += bool(prefill and dec)
        continued += bool(prefill and dec and prefixes)
    assert checked >= 5 and continued >= 1  # mixed steps, some with a continued chunk


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_qwen3_one_gpu_mixed_step_attention_agrees_with_the_peer(run_dir):
    """Qwen3-30B-A3B on one H200, vLLM 0.24.0 tables: a mixed step of 2,048 prompt tokens (two fresh prompts)
    and 382 decode rows at KV 1,152, the step AIConfigurator 0.12.0 prices at 384 in flight with
    ctx_tokens 2,048 (its `estimate_mixed_step_breakdown_with_rust`, balanced MoE). Its attention ops there:
    qkv GEMM 3.433 + o GEMM 2.455 + context attention 4.742 + generation attention 12.038 = 22.67 ms (its
    add-norms, 1.28 ms, are its empirical formula, not a table; moetune prices none). moetune was 10.3 ms."""
    from moetune.search.cost.hardware import BUILTIN
    from moetune.search.cost.simulate import Simulator
    from moetune.search.cost.source import load_source

    sim = Simulator(load_source(run_dir, str(SCALE / "qwen3-30b-a3b.json")), BUILTIN["H200"])
    sim.tables = op_tables.choose("H200", "vllm", "0.24.0")
    sim.pricing(Deployment(max_num_seqs=512, max_num_batched_tokens=2048))  # one GPU: TP 1, EP 1
    prefill, decode, kv = 2048.0, 382.0, 1152.0
    T = np.array([prefill + decode, decode])
    st = phase_costs.StepRows(T, 0 * T, np.array([1024 * 1025 + decode * kv, decode * kv]),
                              np.array([prefill + decode * kv, decode * kv]), np.array([decode + 2, decode]), 1, None,
                              np.array([prefill, 0.0]))
    mixed, alone = phase_costs.attention(sim, st) * sim.src.model.L * 1e3  # ms over the model's layers
    assert mixed == pytest.approx(22.67, rel=0.10)
    assert mixed > alone  # the decode rows' KV reads are not free beside a prompt
    assert sim.measured.sources["attention"] == sim.tables.label
