"""Model card (README.md) of the trained model, generated from the recipe and metrics.json."""
from __future__ import annotations

import json
from pathlib import Path


def arch_section(r: dict, m: dict, model_dir: Path) -> list[str]:
    c, p = r["model"], m["params"]
    size = (model_dir / "model.safetensors").stat().st_size / 1e6
    rows = [("model_type", "`qwen3_moe` (`Qwen3MoeForCausalLM`)"), ("layers", c["num_hidden_layers"]),
            ("hidden size", c["hidden_size"]),
            ("attention", f"{c['num_attention_heads']} heads x {c['head_dim']}, {c['num_key_value_heads']} KV heads (GQA), q/k RMSNorm, RoPE theta {c['rope_theta']}"),
            ("MoE", f"{c['num_experts']} routed experts per layer, top-{c['num_experts_per_tok']}, softmax router, norm_topk_prob=True, no shared expert, all layers sparse"),
            ("expert FFN", f"SwiGLU, moe_intermediate_size {c['moe_intermediate_size']}"),
            ("vocab", f"{m['data'].get('vocab_size', r['tokenizer']['vocab_size'])} (byte-level BPE)"),
            ("embeddings", "tied (lm_head = embed_tokens)" if c["tie_word_embeddings"] else "untied"),
            ("trained context", r["train"]["context_length"]),
            ("max_position_embeddings", c["max_position_embeddings"]),
            ("parameters", f"{p['total']:,} total ({p['embedding']:,} embedding, {p['experts']:,} expert), {p['active']:,} active per token"),
            ("weights", f"bf16 safetensors, {size:.1f} MB")]
    return ["## Architecture", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows] + [""]


def data_section(r: dict, m: dict) -> list[str]:
    c, d = r["corpus"], m["data"]
    return [
        "## Data", "",
        f"The `*.py` files of the Python standard library of the interpreter that runs the recipe "
        f"(`sysconfig.get_paths()[\"stdlib\"]`; trained with Python {d['python']}). Paths are relative to that root.",
        "",
        f"* excluded top-level directories: {', '.join(f'`{x}`' for x in c['exclude_top_dirs'])}, and any `config-*`;",
        f"* excluded at any depth: directories named {', '.join(f'`{x}`' for x in c['exclude_dir_names'])};",
        f"* excluded files: names starting with {', '.join(f'`{x}`' for x in c['exclude_file_prefixes'])};",
        f"* held out iff `int(sha1(relpath).hexdigest(), 16) % {c['heldout_modulus']} == {c['heldout_bucket']}` "
        f"(relpath '/'-separated, UTF-8); files processed in sorted relpath order.",
        "",
        f"Split: {d['train_files']} train files ({d['train_chars']:,} chars, {d['train_tokens']:,} tokens), "
        f"{d['heldout_files']} held-out files ({d['heldout_chars']:,} chars, {d['heldout_tokens']:,} tokens). "
        f"Held-out files: {', '.join(f'`{x}`' for x in d['heldout_paths'])}.",
        "",
        "Each document is its text (UTF-8, undecodable bytes replaced, CRLF -> LF) followed by "
        f"`{d['eos_token']}`; documents are concatenated into one token stream.", "",
    ]


def tokenizer_section(r: dict, m: dict) -> list[str]:
    t, d = r["tokenizer"], m["data"]
    return ["## Tokenizer", "",
            f"Byte-level BPE (`tokenizers`), vocab {t['vocab_size']}, min_frequency {t['min_frequency']}, "
            "ByteLevel pre-tokenizer (GPT-2 regex, no prefix space) and decoder, trained on the train split. "
            f"Special token `{d['eos_token']}` = id {d['eos_id']}: EOS, BOS and PAD, and the document separator. "
            "Encoding adds no special tokens.", ""]


def training_section(r: dict, m: dict, log: list[dict]) -> list[str]:
    t, tr = r["train"], m["training"]
    mc = m["machine"]
    lines = ["## Training", "",
             f"AdamW (betas {t['betas']}, weight decay {t['weight_decay']}), lr {t['lr']} with {t['warmup_steps']} "
             f"warmup steps then cosine over the {t['max_steps']} steps to {t['min_lr_ratio']}x (a function of the step "
             f"only; max_wall_s {t['max_wall_s']} is a safety stop), grad clip {t['grad_clip']}, batch {t['batch_size']} x "
             f"{t['context_length']} tokens, fp32, seed {r['seed']}. Loss = LM cross-entropy + "
             f"{r['model']['router_aux_loss_coef']} x load-balancing loss (Switch-style, transformers' `router_aux_loss_coef`).",
             "",
             f"{tr['steps']} steps, {tr['tokens_seen']:,} tokens seen "
             f"({tr['tokens_seen'] / m['data']['train_tokens']:.2f} epochs), {tr['wall_s'] / 60:.1f} min of training "
             f"({m['total_wall_s'] / 60:.1f} min for the whole recipe) on {mc['processor']}, {mc['threads']} threads, "
             f"torch {mc['torch']}, {mc['platform']}." + (" Stopped early by max_wall_s." if tr["stopped_early"] else ""),
             "", "| step | tokens seen | train loss | held-out loss (first windows) | lr |", "|---|---|---|---|---|"]
    for row in curve_rows(log):
        held = f"{row['heldout_loss']:.3f}" if "heldout_loss" in row else ""
        lines.append(f"| {row['step']} | {row['tokens_seen']:,} | {row['train_loss']:.3f} | {held} | {row['lr']:.2e} |")
    return lines + ["", "Full curve: `training_log.json` / `training_log.csv`.", ""]


def curve_rows(log: list[dict], n: int = 10) -> list[dict]:
    evals = [row for row in log if "heldout_loss" in row]
    stride = max(1, len(evals) // n)
    picked = [log[0]] + evals[::stride]
    if evals and evals[-1] not in picked:
        picked.append(evals[-1])
    return picked


def results_section(m: dict) -> list[str]:
    h, u, s = m["heldout"], m["unigram_heldout"], m["eval_sample"]
    lines = ["## Results (bf16 weights as shipped, fp32 compute)", "",
             "| text | tokens scored | model ppl | unigram baseline ppl |", "|---|---|---|---|",
             f"| held-out split | {h['tokens_scored']:,} | {h['ppl']:.2f} | {u['ppl']:.1f} |",
             f"| `heldout-sample.txt` | {s['tokens_scored']:,} | {s['ppl']:.2f} | {s['unigram_ppl']:.1f} |", "",
             f"Protocol: {m['protocol']} Unigram baseline: train-split token frequencies, add-one smoothing "
             "over the whole vocab, on the same scored tokens.", "",
             "Routing on the held-out split (top-k selections per expert over all tokens):", "",
             "| layer | min | mean | max | imbalance (max/mean) | balancedness (mean/max) |", "|---|---|---|---|---|---|"]
    for L in m["routing_heldout"]:
        lines.append(f"| {L['layer']} | {L['min']:,} | {L['mean']:,.0f} | {L['max']:,} | {L['imbalance']:.2f} | {L['balancedness']:.2f} |")
    lines += ["", "Greedy continuations (48 new tokens). A model this small repeats itself under greedy "
              "decoding on short prompts; a prompt that ends in a space (`def `) also ends in a lone-space "
              "token, which training text only has before another space or `#`. Longer prompts ending at a "
              "line end (as in `stdlib-heldout.jsonl`) continue with plausible code.", ""]
    for g in m["greedy"]:
        lines += ["```python", g["prompt"] + g["completion"], "```", ""]
    return lines


def rerun_section(r: dict) -> list[str]:
    return ["## Re-run", "", "```bash", "python -m moetune.train recipes/train-stdlib-moe.yaml            # overwrites the shipped assets",
            "python -m moetune.train recipes/train-stdlib-moe.yaml --out /tmp/stdlib-moe   # everything under /tmp/stdlib-moe",
            "python -m moetune.train recipes/train-stdlib-moe.yaml --card-only             # only regenerate this README",
            "python -m moetune.train recipes/train-stdlib-moe.yaml --stage mtp             # only the MTP head (target frozen)",
            "```", "",
            "The split and tokenizer are deterministic for a given stdlib; the result depends on the Python version "
            "(its stdlib), and on the torch version and CPU (floating point). Other outputs: "
            f"`{r['outputs']['prompts']}` ({r['samples']['n_prompts']} held-out prompts) and "
            f"`{r['outputs']['eval_sample']}` (perplexity regression sample).", ""]


def files_section() -> list[str]:
    return ["## Checkpoint layout", "",
            "Released-Qwen3-MoE tensor names: `model.layers.{l}.mlp.gate.weight` [E, D] (router), "
            "`model.layers.{l}.mlp.experts.{e}.{gate,up}_proj.weight` [I, D] and `.down_proj.weight` [D, I], "
            "attention `q/k/v/o_proj` plus `q_norm`/`k_norm`. Embeddings are tied: there is no `lm_head.weight`. "
            "config.json carries both `num_experts` and `num_local_experts`, `rope_theta` and `rope_parameters`.", ""]


def mtp_section(r: dict, m: dict) -> list[str]:
    """The multi-token-prediction head (moetune/train/mtp.py), when the `mtp` stage has run."""
    got = m.get("mtp")
    if not got:
        return []
    t, h, c = got["training"], got["heldout"], r["mtp"]
    lines = ["## MTP head (speculative decoding)", "",
             f"`mtp.safetensors` ({got['file_bytes'] / 1e6:.1f} MB bf16, {got['params']:,} parameters) holds one "
             "multi-token-prediction module in the DeepSeek-V3 layout at layer index "
             f"{r['model']['num_hidden_layers']} (`enorm`, `hnorm`, `eh_proj`, `shared_head.norm` and a qwen3_moe "
             "decoder block; head and embedding are the tied target's), announced by `num_nextn_predict_layers: 1` "
             "in config.json. transformers loads `model.safetensors` alone and never opens it; "
             "`moetune generate --speculative mtp:K` drafts with it (README: Speculative decoding; docs/architecture.md §3h).", "",
             f"Trained with the target frozen, {t['steps']} steps of {t['batch_size']} x {t['context_length']} "
             f"tokens ({t['wall_s'] / 60:.1f} min, {r['threads']} threads), AdamW lr {c['lr']} (warmup "
             f"{c['warmup_steps']}, cosine to 10 %), to match the target's next-position distribution (soft "
             "cross-entropy); the block starts as a copy of the target's last layer. Held-out windows "
             f"({got['eval_windows']} x {got['window_tokens']} tokens): top-1 agreement with the target one position "
             f"on {h['top1_agreement']:.3f}, soft cross-entropy {h['soft_ce']:.3f} nats.", "",
             "Through moetune's engine (greedy, the first held-out prompts of `stdlib-heldout.jsonl` decoded at once):",
             "", "| K | prompts x tokens | drafts | accepted | acceptance | tokens per verify |", "|---|---|---|---|---|---|"]
    for e in got.get("engine", []):
        lines.append(f"| {e['k']} | {e['prompts']} x {e['max_tokens']} | {e['draft_tokens']:,} | "
                     f"{e['accepted_tokens']:,} | {e['acceptance_rate']:.3f} | {e['tokens_per_verify']:.2f} |")
    return lines + [""]


def write_card(model_dir: Path, r: dict, m: dict) -> None:
    model_dir = Path(model_dir)
    log = json.loads((model_dir / "training_log.json").read_text())
    head = ["# stdlib-moe", "",
            "A tiny Mixture-of-Experts code model bundled with moetune as its default model: "
            "a Hugging Face `qwen3_moe` checkpoint trained from scratch on the Python standard library. "
            "It exists to exercise MoE inference and routing profiling with real (skewed) routing, not to write code.", ""]
    parts = [head, arch_section(r, m, model_dir), data_section(r, m), tokenizer_section(r, m),
             training_section(r, m, log), results_section(m), mtp_section(r, m), files_section(), rerun_section(r)]
    (model_dir / "README.md").write_text("\n".join(line for part in parts for line in part))
