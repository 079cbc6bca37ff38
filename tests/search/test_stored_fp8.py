"""A checkpoint's own fp8 weights (config.json quantization_config quant_method fp8, DeepSeek-V3's):
its baseline precision is fp8, not bf16. Priced exactly as the bf16 twin with fp8 experts and fp8
dense layers (the reference), a low-bit mix keeps its hot experts at fp8, nothing is counted as low
precision that the checkpoint stores, and winner.yaml says the precision priced (the report: the routing priced)."""

import json

import pytest

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.scale import stored_format
from moetune.search.study.setup import Inputs, prepare

FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


@pytest.fixture(scope="module")
def fp8_config(big_config, tmp_path_factory):
    cfg = json.loads(big_config.read_text())
    path = tmp_path_factory.mktemp("fp8") / "config.json"
    path.write_text(json.dumps({**cfg, "quantization_config": FP8}))
    return path


def _setup(run_dir, config):
    return roofline(prepare(Inputs(str(run_dir), "8xH200", scale_model=str(config), num_requests=16, input_len=64,
                                   output_len=8)))


def roofline(setup):
    """The roofline's pricing, with or without the gpu-db extra: the twin claim is the roofline's (the measured
    tables price a checkpoint's block-wise fp8 experts with other kernels' rows than online per-tensor fp8)."""
    from moetune.search.cost.op_tables import UNMEASURED, TableChoice

    setup.sim.tables = TableChoice("vllm", None, None, UNMEASURED)
    return setup


def test_an_fp8_checkpoint_is_priced_as_its_bf16_twin_with_both_fp8_knobs(run_dir, big_config, fp8_config):
    assert stored_format(fp8_config) == "fp8" and stored_format(big_config) == "none"
    fp8, bf16 = _setup(run_dir, fp8_config).sim, _setup(run_dir, big_config).sim
    d = Deployment(ep_size=8, max_num_seqs=8)
    twin = Deployment(ep_size=8, max_num_seqs=8, quant_low_format="fp8", dense_format="fp8")
    assert fp8.memory(d) == bf16.memory(twin) and fp8.memory(d).total < bf16.memory(d).total
    mine, ref = fp8.evaluate(d), bf16.evaluate(twin)
    assert mine.phases_ms == ref.phases_ms and mine.output_tok_s == ref.output_tok_s
    assert mine.detail["low_precision_share"] == 0.0 < ref.detail["low_precision_share"]  # stored, not lowered
    assert mine.detail["stored_weights"] == "fp8" and bf16.evaluate(d).detail["stored_weights"] == "none"
    mix = Deployment(ep_size=8, max_num_seqs=8, quant_low_format="int4", quant_hot_fraction=0.25)
    assert bf16.memory(mix).experts > fp8.memory(mix).experts > fp8.memory(replace_low(mix)).experts
    assert 0 < fp8.evaluate(mix).detail["low_precision_share"] < 1


def test_the_checkpoints_fp8_experts_compute_at_the_fp8_rate(run_dir, big_config, fp8_config):
    """Where the experts' GEMMs are compute-bound (2,048-token prefill chunks) the stored fp8 experts
    run at the fp8 rate as the twin's fp8 experts do; an int4 mix keeps its hot experts' fp8 rate."""
    long = Inputs(str(run_dir), "8xH200", scale_model=str(fp8_config), num_requests=32, input_len=2048,
                  output_len=4)
    fp8 = roofline(prepare(long)).sim
    bf16 = roofline(prepare(Inputs(**{**long.__dict__, "scale_model": str(big_config)}))).sim
    d = Deployment(ep_size=8, max_num_seqs=4, max_num_batched_tokens=8192)
    twin = Deployment(ep_size=8, max_num_seqs=4, max_num_batched_tokens=8192, quant_low_format="fp8",
                      dense_format="fp8")
    mine, ref = fp8.evaluate(d), bf16.evaluate(twin)
    assert mine.phases_ms == ref.phases_ms
    slower = bf16.evaluate(Deployment(ep_size=8, max_num_seqs=4, max_num_batched_tokens=8192, dense_format="fp8"))
    assert slower.phases_ms["prefill"]["experts"] > 1.5 * mine.phases_ms["prefill"]["experts"]  # the fp8 rate shows
    hot = Deployment(ep_size=8, max_num_seqs=4, max_num_batched_tokens=8192, quant_low_format="int4",
                     quant_hot_fraction=0.5)
    assert fp8.prepare(fp8.stored(hot)).fp8_slot.mean() == pytest.approx(0.5, abs=0.1)  # the hot half stays fp8


def replace_low(d: Deployment) -> Deployment:
    from dataclasses import replace

    return replace(d, quant_hot_fraction=0.0)


def test_the_winner_recipe_of_an_fp8_checkpoint_says_fp8(run_dir, fp8_config, tmp_path):
    from moetune.config import load_recipe
    from moetune.search.study.optuna_study import StudySettings
    from moetune.search.study.run import SearchSettings, run_search

    runs = {}
    for low in ("none", "int4"):
        space = tmp_path / f"{low}.yaml"
        space.write_text(f"ep_size: 8\nreplicas: 1\nquant_low_format: {low}\nquant_hot_fraction: 0.25\n"
                         "offload_resident_fraction: 1\nmax_num_seqs: 8\nredundant_experts: 0\n")
        out = tmp_path / low
        st = StudySettings("s", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", 1, 0)
        inputs = Inputs(str(run_dir), "8xH200", scale_model=str(fp8_config), input_len=64, output_len=8,
                        num_requests=16)
        result = run_search(SearchSettings(inputs, st, out, "simulate", str(space), hf_id="deepseek-ai/DeepSeek-V3"))
        if low == "int4":  # a hot/low mix on GPU hardware: no engine serves it (study/engine_formats.py)
            assert result.winner is None and "per-expert mixed formats" in (result.rows[0].reason or "")
            continue
        runs[low] = load_recipe(out / "winner.yaml").quant
        report = " ".join((out / "report.md").read_text().split())  # and it says the routing priced (balance.py)
        assert "Winner: Priced on the routing scaled by stats: rank imbalance" in report and "perfect balance" in report
    assert runs["none"].experts == "fp8"
    from moetune.search.study.space import quant_section  # the mix's recipe, as moetune's own engine reads it

    mix = quant_section(Deployment(quant_low_format="int4", quant_hot_fraction=0.25), str(run_dir), "fp8")
    assert (mix["high"], mix["low"], mix["hot_fraction"]) == ("fp8", "int4-g64", 0.25)
