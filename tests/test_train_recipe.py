"""Tests of the stdlib-moe training recipe (moetune.train) and of the shipped model folder."""
from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from moetune.train import corpus, evaluate, tokenizer, train

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO / "moetune/assets/models/stdlib-moe"
PROMPTS = REPO / "moetune/assets/prompts/stdlib-heldout.jsonl"
SAMPLE = REPO / "moetune/assets/eval/heldout-sample.txt"
RULE = corpus.CorpusRule(exclude_top_dirs=("site-packages", "test", "idlelib"))


def make_tree(root: Path) -> None:
    files = ["a.py", "b.txt", "pkg/__init__.py", "pkg/mod.py", "pkg/tests/t.py", "pkg/test/t.py",
             "site-packages/x.py", "test/y.py", "idlelib/z.py", "config-3.11/c.py",
             "_sysconfigdata__linux.py", "pkg/__pycache__/m.py", "deep/er/still.py"]
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\nx = 1\n")


def test_file_selection(tmp_path):
    make_tree(tmp_path)
    assert corpus.list_files(tmp_path, RULE) == ["a.py", "deep/er/still.py", "pkg/__init__.py", "pkg/mod.py"]


def test_split_disjoint_deterministic_hash_rule(tmp_path):
    rels = [f"m{i:03d}/f{i}.py" for i in range(400)]
    split = corpus.split_files(list(reversed(rels)), corpus.CorpusRule(), tmp_path)
    again = corpus.split_files(rels, corpus.CorpusRule(), tmp_path)
    assert (split.train, split.heldout) == (again.train, again.heldout)
    assert split.train == sorted(split.train) and not set(split.train) & set(split.heldout)
    assert sorted(split.train + split.heldout) == sorted(rels)
    expect = [r for r in sorted(rels) if int(hashlib.sha1(r.encode()).hexdigest(), 16) % 20 == 0]
    assert split.heldout == expect and 5 <= len(expect) <= 40


def test_real_stdlib_split_matches_shipped():
    import yaml

    r = yaml.safe_load((REPO / "recipes/train-stdlib-moe.yaml").read_text())
    split = corpus.make_split(corpus.CorpusRule.from_dict(r["corpus"]))
    assert split.heldout and len(split.train) > 10 * len(split.heldout)
    assert not any("site-packages" in p or "/test/" in f"/{p}" for p in split.train + split.heldout)
    metrics = json.loads((MODEL_DIR / "metrics.json").read_text())
    if metrics["data"]["python"] != ".".join(map(str, sys.version_info[:3])):
        pytest.skip("stdlib differs from the one the model was trained on")
    assert split.heldout == metrics["data"]["heldout_paths"]


TINY_TEXTS = ["def add(a, b):\n    return a + b\n", "class Foo:\n\tpass  # tab\n", "s = 'héllo ✓'\n"] * 20


def test_tokenizer_deterministic_round_trip(tmp_path):
    a = tokenizer.train_bpe(TINY_TEXTS, 300, ["<|endoftext|>"], 2)
    b = tokenizer.train_bpe(TINY_TEXTS, 300, ["<|endoftext|>"], 2)
    assert a.to_str() == b.to_str() and a.token_to_id("<|endoftext|>") == 0
    for text in TINY_TEXTS[:3] + ["x = {'k': [1, 2]}\n\n    y"]:
        assert a.decode(a.encode(text).ids) == text
    tokenizer.save_tokenizer(a, tmp_path, "<|endoftext|>", 2048)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == 0
    assert hf("a<|endoftext|>b", add_special_tokens=False)["input_ids"][1] == 0


def tiny_model_cfg() -> dict:
    return dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                intermediate_size=64, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                max_position_embeddings=128, rope_theta=10000, rms_norm_eps=1e-6, tie_word_embeddings=True,
                initializer_range=0.02, router_aux_loss_coef=0.001)


def test_tiny_training_run(tmp_path):
    t = dict(context_length=16, batch_size=2, max_steps=3, max_wall_s=60, lr=1e-3, min_lr_ratio=0.1,
             warmup_steps=1, weight_decay=0.1, betas=[0.9, 0.95], grad_clip=1.0, log_every=1,
             eval_every=3, eval_windows=2)
    config = train.build_config(tiny_model_cfg(), 64, 0)
    model = train.build_model(config, 0)
    stream = torch.randint(0, 64, (400,))  # [N]
    eval_wins = evaluate.windows(torch.randint(0, 64, (40,)).tolist(), 16)
    result = train.train_loop(model, stream, eval_wins, t, 0, train.Logger(tmp_path))
    log = json.loads((tmp_path / "training_log.json").read_text())
    assert result["steps"] == 3 and len(log) == 3 and "heldout_loss" in log[-1]
    assert all(math.isfinite(row["train_loss"]) for row in log)
    train.export(model, tmp_path, 0)
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert back.config.model_type == "qwen3_moe" and next(back.parameters()).dtype == torch.bfloat16


def test_an_exported_mtp_head_is_what_the_engine_computes_and_transformers_ignores(tmp_path):
    """The mtp stage's head (transformers' decoder block, moetune/train/mtp.py) exported beside a
    tiny model: moetune's loader reads it back (load_mtp) and its logits over a sequence equal the
    training module's; transformers loads the directory with no unexpected or missing keys."""
    from transformers import AutoModelForCausalLM

    from moetune.engine.model_runner import ModelRunner
    from moetune.model.batch import StepKind
    from moetune.model.loader import load_model, load_mtp
    from moetune.train.mtp import MTPHead, export_head
    from tests.checkpoints import VOCAB, build_tokenizer

    train.export(train.build_model(train.build_config(tiny_model_cfg(), VOCAB, 0), 0), tmp_path, 0)
    build_tokenizer(tmp_path)
    target = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    torch.manual_seed(1)
    head = MTPHead(target, 0.2)
    with torch.no_grad():
        for name in ("enorm", "hnorm", "norm"):  # not all ones: the norms' order and place matter
            getattr(head, name).weight.uniform_(0.5, 1.5)
    export_head(head, target, tmp_path)
    head = head.to(torch.bfloat16).float().eval()  # the weights as stored
    x = torch.randint(1, VOCAB, (1, 20))  # [1, S]
    with torch.no_grad():
        ref = head(target, x, target.model(input_ids=x).last_hidden_state)[0]  # [S-1, V]
    model = load_model(tmp_path)
    module = load_mtp(model)
    runner = ModelRunner(model, 4, 16)
    hidden = runner.forward_prompts([x[0].tolist()])  # [S, D]
    cache = module.new_cache(4, 16)
    cache.zero_blocks([1, 2])
    batch = runner.build_batch([(x[0, 1:].tolist(), 0, [1, 2])], StepKind.PREFILL)
    got = module.logits(module.forward(batch.input_ids, hidden[:-1], batch, cache))  # [S-1, V]
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-3), (got - ref).abs().max()
    back, info = AutoModelForCausalLM.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]
    assert json.loads((tmp_path / "config.json").read_text())["num_nextn_predict_layers"] == 1


def test_batches_deterministic():
    stream = torch.arange(1000)
    a = [x for _, x in zip(range(5), train.batches(stream, 10, 4, seed=7))]
    b = [x for _, x in zip(range(5), train.batches(stream, 10, 4, seed=7))]
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_shipped_folder_config_and_size():
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["dtype"] == "bfloat16"
    n_experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    assert n_experts >= 16 and cfg["num_experts_per_tok"] >= 2 and cfg["num_hidden_layers"] >= 4
    assert cfg["norm_topk_prob"] and cfg["decoder_sparse_step"] == 1 and cfg["mlp_only_layers"] == []
    assert (MODEL_DIR / "model.safetensors").stat().st_size <= 20 * 1024 * 1024
    assert sum(f.stat().st_size for f in MODEL_DIR.iterdir()) <= 25 * 10**6  # with mtp.safetensors: ≤ 25 MB
    assert cfg["num_nextn_predict_layers"] == 1 and (MODEL_DIR / "mtp.safetensors").exists()
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (MODEL_DIR / name).exists()


def test_shipped_prompts():
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    heldout = set(json.loads((MODEL_DIR / "metrics.json").read_text())["data"]["heldout_paths"])
    assert len(rows) >= 250 and len({r["id"] for r in rows}) == len(rows)
    assert all(r["source"] in heldout and 16 <= len(r["prompt"]) <= 400 for r in rows)


def test_shipped_model_sample_perplexity():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    metrics = json.loads((MODEL_DIR / "metrics.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    ids = tok(SAMPLE.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    assert len(ids) == metrics["eval_sample"]["tokens"]
    wins = evaluate.windows(ids, metrics["eval_sample"]["window_tokens"])
    ppl = evaluate.perplexity(model, wins)["ppl"]
    assert ppl <= metrics["eval_sample"]["ppl"] * 1.02
    assert ppl < metrics["eval_sample"]["unigram_ppl"]
