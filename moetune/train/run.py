"""The whole recipe: corpus -> tokenizer -> samples -> model -> train -> export -> eval -> card."""
from __future__ import annotations

import hashlib
import json
import platform
import random
import time
from pathlib import Path

import torch
import yaml

from . import corpus, samples, tokenizer, train
from . import evaluate as ev


def load_recipe(path: Path) -> dict:
    return yaml.safe_load(Path(path).read_text())


def output_paths(r: dict, out: Path | None) -> dict:
    """Model dir, prompts and eval sample; with --out everything goes under that dir."""
    if out is None:
        return {"model": Path(r["outputs"]["model_dir"]), "prompts": Path(r["outputs"]["prompts"]),
                "sample": Path(r["outputs"]["eval_sample"])}
    out = Path(out)
    return {"model": out, "prompts": out / "stdlib-heldout.jsonl", "sample": out / "heldout-sample.txt"}


def prepare_data(r: dict, paths: dict, root: Path | None = None) -> dict:
    """Split, tokenizer (saved), token streams, prompts and eval sample (written)."""
    rule = corpus.CorpusRule.from_dict(r["corpus"])
    split = corpus.make_split(rule, root)
    train_docs = corpus.read_docs(split.root, split.train)
    held_docs = corpus.read_docs(split.root, split.heldout)
    tk = r["tokenizer"]
    tok = tokenizer.train_bpe(train_docs, int(tk["vocab_size"]), tk["special_tokens"], int(tk["min_frequency"]))
    eos_text = tk["special_tokens"][0]
    eos_id = tok.token_to_id(eos_text)
    tokenizer.save_tokenizer(tok, paths["model"], eos_text, int(r["model"]["max_position_embeddings"]))
    s = r["samples"]
    prompts = samples.make_prompts(split.heldout, held_docs, int(s["n_prompts"]), int(r["seed"]),
                                   int(s["prompt_min_chars"]), int(s["prompt_max_chars"]))
    samples.write_jsonl(prompts, paths["prompts"])
    sample_text = samples.make_eval_sample(held_docs, int(s["eval_piece_chars"]), eos_text)
    paths["sample"].parent.mkdir(parents=True, exist_ok=True)
    paths["sample"].write_text(sample_text, encoding="utf-8")
    return {"split": split, "tok": tok, "eos_id": eos_id, "eos_text": eos_text,
            "train_ids": ev.stream(tokenizer.encode_docs(tok, train_docs), eos_id),
            "held_ids": ev.stream(tokenizer.encode_docs(tok, held_docs), eos_id),
            "train_chars": sum(map(len, train_docs)), "held_chars": sum(map(len, held_docs)),
            "sample_text": sample_text, "n_prompts": len(prompts)}


def final_eval(model_dir: Path, d: dict, r: dict) -> dict:
    """Metrics of the model as shipped (bf16 weights, upcast to fp32 compute)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(str(model_dir))
    S, cfg = int(r["train"]["context_length"]), model.config
    held_wins = ev.windows(d["held_ids"], S)
    sample_ids = hf_tok(d["sample_text"], add_special_tokens=False)["input_ids"]
    sample_wins = ev.windows(sample_ids, S)
    return {
        "heldout": {**ev.perplexity(model, held_wins), "window_tokens": S},
        "unigram_heldout": ev.unigram_ppl(d["train_ids"], ev.scored_targets(held_wins), cfg.vocab_size),
        "eval_sample": {**ev.perplexity(model, sample_wins), "tokens": len(sample_ids), "window_tokens": S,
                        "sha256": hashlib.sha256(d["sample_text"].encode("utf-8")).hexdigest(),
                        "unigram_ppl": ev.unigram_ppl(d["train_ids"], ev.scored_targets(sample_wins),
                                                      cfg.vocab_size)["ppl"]},
        "routing_heldout": ev.routing_load(model, held_wins, cfg.num_experts_per_tok, cfg.num_experts),
        "greedy": greedy_samples(model, hf_tok, r["samples"]["greedy_prompts"]),
    }


def greedy_samples(model, hf_tok, prompts: list[str], n_new: int = 48) -> list[dict]:
    out = []
    for p in prompts:
        x = hf_tok(p, return_tensors="pt", add_special_tokens=False)
        g = model.generate(**x, max_new_tokens=n_new, do_sample=False)
        out.append({"prompt": p, "completion": hf_tok.decode(g[0, x["input_ids"].shape[1]:])})
    return out


def run_recipe(recipe_path: Path, out: Path | None = None) -> dict:
    r = load_recipe(recipe_path)
    torch.set_num_threads(int(r["threads"]))
    random.seed(int(r["seed"]))
    paths, t_start = output_paths(r, out), time.time()
    d = prepare_data(r, paths)
    print(f"train tokens {len(d['train_ids'])} heldout tokens {len(d['held_ids'])}", flush=True)
    config = train.build_config(r["model"], d["tok"].get_vocab_size(), d["eos_id"])
    model = train.build_model(config, int(r["seed"]))
    params = train.count_params(model, config)
    print(json.dumps(params), flush=True)
    S = int(r["train"]["context_length"])
    eval_wins = ev.windows(d["held_ids"], S)[: int(r["train"]["eval_windows"])]
    stream = torch.tensor(d["train_ids"], dtype=torch.long)  # [N_train]
    result = train.train_loop(model, stream, eval_wins, r["train"], int(r["seed"]), train.Logger(paths["model"]))
    train.export(model, paths["model"], d["eos_id"])
    metrics = {**final_eval(paths["model"], d, r), "params": params, "training": result,
               "data": data_summary(d), "machine": machine(), "recipe": str(recipe_path),
               "total_wall_s": time.time() - t_start, "protocol": PROTOCOL}
    (paths["model"] / "metrics.json").write_text(json.dumps(metrics, indent=1))
    if "mtp" in r:  # the MTP head, on the model just exported (moetune/train/mtp.py)
        from .mtp import run_and_record

        metrics = run_and_record(r, paths["model"], paths["prompts"])
    write_card_safely(paths["model"], r, metrics)
    return metrics


PROTOCOL = ("ppl = exp(mean NLL): token stream cut into non-overlapping windows of context_length tokens "
            "(tail window kept if >= 2 tokens); in each window tokens 1.. are scored given only earlier "
            "tokens of the same window; bf16 weights upcast to fp32, fp32 compute (transformers default "
            "implementations: grouped_mm experts, sdpa attention). eval_sample: tokenizer(text, add_special_tokens=False) of "
            "heldout-sample.txt, whose '<|endoftext|>' strings become the EOS id. heldout: each held-out "
            "file's tokens followed by EOS, concatenated in sorted path order.")


def data_summary(d: dict) -> dict:
    sp = d["split"]
    return {"stdlib_root": str(sp.root), "python": platform.python_version(),
            "train_files": len(sp.train), "heldout_files": len(sp.heldout), "heldout_paths": sp.heldout,
            "train_chars": d["train_chars"], "heldout_chars": d["held_chars"],
            "train_tokens": len(d["train_ids"]), "heldout_tokens": len(d["held_ids"]),
            "n_prompts": d["n_prompts"], "eos_id": d["eos_id"], "eos_token": d["eos_text"]}


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def write_card_safely(model_dir: Path, r: dict, metrics: dict) -> None:
    try:
        from .card import write_card

        write_card(model_dir, r, metrics)
    except Exception as e:  # the trained model must survive a card bug; rerun with --card-only
        print(f"model card failed: {e!r}", flush=True)
