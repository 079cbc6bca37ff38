"""`moetune quantize` and `moetune eval` through the real console script on a tiny checkpoint."""

import json

import pytest

from tests.cli_run import moetune


@pytest.fixture(scope="module")
def run_dir(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("qrun") / "run"
    r = moetune("profile", "-m", str(checkpoint("qwen3_moe", shard=False)), "--num-requests", "2", "--batch-size", "2",
                "--input-len", "8", "--output-len", "3", "--warmup-steps", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_quantize_hot_fraction_from_a_run_then_eval_against_the_source(checkpoint, run_dir, tmp_path):
    ck = checkpoint("qwen3_moe", shard=False)
    r = moetune("quantize", "-m", str(ck), "--policy", "hot=0.3,high=fp32,low=int8", "--loads", str(run_dir),
                "--out", str(tmp_path / "q"))
    assert r.returncode == 0, r.stderr
    assert "experts: fp32 9, int8 12" in r.stdout  # ceil(0.3 · 7) = 3 of 7 experts hot, 3 MoE layers
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    assert cfg["quantization"]["quant_method"] == "moetune-experts"
    r = moetune("eval", "-m", str(tmp_path / "q"), "--reference", str(ck), "--max-windows", "2", "--window", "64",
                "--num-prompts", "3", "--greedy-tokens", "4", "--json", "-")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    a = got["agreement"]
    assert 0 < a["kl"] < 1 and 0.5 < a["top1_agreement"] <= 1 and 0 <= a["greedy_match"] <= 1
    assert got["perplexity"]["tokens_scored"] == got["reference_perplexity"]["tokens_scored"] > 0
    r = moetune("eval", "-m", str(tmp_path / "q"))
    assert r.returncode == 1 and "give --reference" in r.stderr


def test_eval_of_a_recipe_against_itself_unquantized_and_offloaded(checkpoint, tmp_path):
    ck = checkpoint("qwen3_moe", shard=False)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model:\n  path: {ck}\noffload:\n  resident_experts: 3\n  prefetch_depth: 2\n")
    r = moetune("eval", "-r", str(recipe), "--max-windows", "2", "--window", "64", "--num-prompts", "3",
                "--greedy-tokens", "4", "--json", str(tmp_path / "e.json"))
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "e.json").read_text())
    assert got["agreement"]["kl"] == pytest.approx(0.0, abs=1e-7)  # offloading changes nothing
    assert got["agreement"]["top1_agreement"] == 1.0 and got["agreement"]["greedy_match"] == 1.0
    assert got["perplexity"]["ppl"] == pytest.approx(got["reference_perplexity"]["ppl"], rel=1e-6)
    assert "perplexity" in r.stdout


def test_quantize_dense_then_eval_reports_each_mix(checkpoint, tmp_path):
    """--dense int8 alone (experts left fp32), and with int8 experts: eval's JSON names each part's
    format and the dense bytes; a dense-only checkpoint is still refused without --reference."""
    ck = checkpoint("qwen3_moe", shard=False)
    r = moetune("quantize", "-m", str(ck), "--dense", "int8", "--out", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert "dense projections: int8" in r.stdout and "experts:" not in r.stdout
    r = moetune("quantize", "-m", str(ck), "--policy", "int8", "--dense", "int8", "--out", str(tmp_path / "m"))
    assert r.returncode == 0 and "experts: int8 21" in r.stdout and "dense projections: int8" in r.stdout
    runs = {}
    for name in ("d", "m"):
        r = moetune("eval", "-m", str(tmp_path / name), "--reference", str(ck), "--max-windows", "2", "--window", "64",
                    "--num-prompts", "3", "--greedy-tokens", "4", "--json", "-")
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads(r.stdout)
    assert runs["d"]["precision"] == {"experts": "fp32", "attention": "int8", "lm_head": "int8", "router": "fp32",
                                      "embedding": "fp32"}
    assert runs["m"]["precision"]["experts"] == "int8"
    assert runs["m"]["expert_bytes"] < runs["d"]["expert_bytes"] and runs["m"]["dense_bytes"] == runs["d"]["dense_bytes"]
    for got in runs.values():
        assert 0 < got["agreement"]["kl"] < 1 and got["agreement"]["top1_agreement"] > 0.5
    r = moetune("eval", "-m", str(tmp_path / "d"))
    assert r.returncode == 1 and "give --reference" in r.stderr
    r = moetune("quantize", "-m", str(tmp_path / "d"), "--dense", "int8", "--out", str(tmp_path / "again"))
    assert r.returncode == 1 and "already quantized" in r.stderr and not (tmp_path / "again").exists()
