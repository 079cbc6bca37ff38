"""The bundled default model, through moetune: it ships in the package, matches transformers,
keeps its held-out quality, and is what every command uses when no --model is given."""

import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from moetune.config import RunConfig
from moetune.engine.build import build_generator
from moetune.engine.sampling import SamplingParams
from moetune.model.loader import load_model
from moetune.model.registry import DEFAULT_MODEL, bundled_asset, resolve_model
from tests.forward import prompt_hidden


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model(None)


@pytest.fixture(scope="module")
def model(model_dir):
    return load_model(model_dir)


def _logits(model, ids: list[int]) -> torch.Tensor:
    return model.logits(prompt_hidden(model, [ids]))  # [n, V]


def test_the_default_is_the_bundled_model_and_it_ships_in_the_wheel(model_dir, tmp_path):
    assert resolve_model(DEFAULT_MODEL) == model_dir and (model_dir / "model.safetensors").exists()
    root = Path(__file__).resolve().parents[1]  # the project folder holding pyproject.toml
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(root)], check=True, capture_output=True)
    names = zipfile.ZipFile(next(tmp_path.glob("moetune-*.whl"))).namelist()
    for required in ("moetune/assets/models/stdlib-moe/model.safetensors",
                     "moetune/assets/models/stdlib-moe/mtp.safetensors",
                     "moetune/assets/models/stdlib-moe/tokenizer.json",
                     "moetune/assets/models/stdlib-moe/README.md",
                     "moetune/assets/prompts/stdlib-heldout.jsonl"):
        assert required in names


def test_logits_match_transformers_on_the_same_files(model_dir, model):
    from transformers import AutoModelForCausalLM

    ref_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = list(range(5, 300, 3))
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    got = _logits(model, ids)
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_heldout_sample_perplexity_stays_within_2_percent_of_the_model_card(model_dir, model):
    metrics = json.loads((model_dir / "metrics.json").read_text())["eval_sample"]
    gen = build_generator(RunConfig())
    text = bundled_asset("eval/heldout-sample.txt").read_text(encoding="utf-8")
    ids = gen.tokenizer(text, add_special_tokens=False)["input_ids"]
    S = metrics["window_tokens"]
    nll, scored = 0.0, 0
    for start in range(0, len(ids), S):
        window = ids[start:start + S]
        if len(window) < 2:
            continue
        logits = _logits(model, window)
        nll += F.cross_entropy(logits[:-1], torch.tensor(window[1:]), reduction="sum").item()
        scored += len(window) - 1
    ppl = math.exp(nll / scored)
    assert scored == metrics["tokens_scored"]
    assert ppl <= metrics["ppl"] * 1.02, f"held-out ppl {ppl:.3f} vs card {metrics['ppl']:.3f}"
    assert ppl < 0.25 * metrics["unigram_ppl"]


def test_greedy_generation_is_deterministic():
    gen = build_generator(RunConfig())
    prompts = ["def ", "import os\n", "class Config:\n    def __init__(self"]
    params = SamplingParams(max_tokens=24)
    first = [c.text for c in gen.generate(prompts, params)]
    assert first == [c.text for c in gen.generate(prompts, params)]
    assert all(len(t) > 0 for t in first)


def test_generate_without_model_prints_a_continuation():
    out = subprocess.run([sys.executable, "-m", "moetune", "generate", "--prompt", "def ", "--max-tokens", "20"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) > 0


def test_models_lists_the_bundled_model():
    out = subprocess.run([sys.executable, "-m", "moetune", "models"], capture_output=True, text=True)
    assert out.returncode == 0 and DEFAULT_MODEL in out.stdout


def test_bundled_prompts_are_heldout_jsonl():
    lines = bundled_asset("prompts/stdlib-heldout.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    assert len(rows) >= 200 and all(r["prompt"] and r["source"].endswith(".py") for r in rows)
