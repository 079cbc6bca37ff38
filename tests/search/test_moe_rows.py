"""Which measured fused-MoE rows price an engine's expert format (search/cost/moe_rows.py): the rows of the
kernel the engine runs for moetune's launch, the asked version's where it holds them, said in the trial's
`op_sources` where they are not.

vLLM 0.24.0's per-tensor fp8 rows on H200 are ModelOpt's static-scale method through FlashInfer CUTLASS
(`vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts`); the launch's `--quantization fp8` (online,
dynamic activation scales) runs vLLM's Triton fused MoE, whose newest rows are 0.19.0's `vllm_fused_moe`.
"""

from pathlib import Path

import numpy as np
import pytest

from moetune.search.cost import moe_rows, op_tables
from moetune.search.cost.deployment import Deployment

SCALE = Path(__file__).resolve().parents[2] / "recipes" / "scale"
KEY = ("fp8", 2048, 768, 8, 128, 1, 1)  # Qwen3-30B-A3B's experts at EP 1
MODELOPT = "vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts"


def test_the_asked_versions_own_rows_of_the_engines_kernel_need_no_note():
    sources = [("0.24.0", {KEY: "vllm_fp8moe_triton_tritonexperts"}), ("0.19.0", {KEY: "vllm_fused_moe"})]
    assert moe_rows.pick(sources, "vllm", "0.24.0", KEY) == (None, None)


def test_a_shape_the_asked_version_lacks_is_the_older_versions_said():
    version, note = moe_rows.pick([("0.24.0", {}), ("0.19.0", {KEY: "vllm_fused_moe"})], "vllm", "0.24.0", KEY)
    assert version is None  # the asked tables' own fill reads those rows
    assert note == "fp8 fused-MoE rows of vllm 0.19.0: the asked version has none for this shape"


def test_another_methods_kernel_gives_way_to_the_newest_rows_of_the_engines_kernel():
    sources = [("0.27.0", {KEY: MODELOPT}), ("0.24.0", {KEY: MODELOPT}), ("0.19.0", {KEY: "vllm_fused_moe"})]
    version, note = moe_rows.pick(sources, "vllm", "0.27.0", KEY)
    assert version == "0.19.0"
    assert "vllm_fused_moe, what the launch runs" in note and MODELOPT in note


def test_only_another_methods_rows_are_kept_and_said():
    version, note = moe_rows.pick([("0.24.0", {KEY: MODELOPT})], "vllm", "0.24.0", KEY)
    assert version is None and "not what the launch runs" in note


def test_formats_and_engines_without_a_rule_keep_the_tables_rows():
    bf16 = ("bfloat16",) + KEY[1:]
    assert moe_rows.pick([("0.24.0", {bf16: "vllm_unquantizedfusedmoe_triton_tritonexperts"})], "vllm", "0.24.0",
                         bf16) == (None, None)
    assert moe_rows.pick([("0.5.14", {KEY: "sglang_cutlass"})], "sglang", "0.5.14", KEY) == (None, None)


@pytest.mark.skipif(not op_tables.installed(), reason="needs the gpu-db extra (aiconfigurator-core)")
def test_vllm_fp8_experts_are_priced_from_the_triton_rows_the_launch_runs(run_dir):
    """Qwen3-30B-A3B at EP 1, 64 tokens a layer: bf16 0.31 ms; 0.24.0's ModelOpt fp8 rows 1.10 ms (3.5×); the
    Triton fp8 rows 0.17 ms — about the half weight read fp8 saves."""
    from moetune.search.cost import tp as tp_costs
    from moetune.search.cost.hardware import BUILTIN
    from moetune.search.cost.precision import precision
    from moetune.search.cost.simulate import Simulator
    from moetune.search.cost.source import load_source

    sim = Simulator(load_source(run_dir, str(SCALE / "qwen3-30b-a3b.json")), BUILTIN["H200"])
    sim.tables = op_tables.choose("H200", "vllm", "0.24.0")
    m = sim.src.model

    def bound(d):
        d = sim.stored(d)
        return op_tables.bind(sim.tables, m, tp_costs.tp_model(m, d), d, precision(d, sim.hw, sim.b))

    rows = np.array([[64.0 * m.K]])  # [Lm, R]: N = rows · EP / K = 64 tokens at EP 1
    fp8, bf16 = bound(Deployment(quant_low_format="fp8")), bound(Deployment())
    fp8_s, bf16_s = fp8.experts(rows)[0, 0], bf16.experts(rows)[0, 0]
    assert fp8_s < 0.7 * bf16_s  # 0.24.0's own fp8 rows: 3.5× bf16
    assert "vllm_fused_moe, what the launch runs" in fp8.sources["experts"]
    assert "experts" not in bf16.sources  # bf16: 0.24.0's own rows, nothing to say
