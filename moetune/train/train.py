"""Model config, training loop, final evaluation and export of the stdlib MoE model.

Data layout: each document's tokens followed by EOS, concatenated into one stream; training
windows are non-overlapping S-token slices of that stream (random offset per epoch), shuffled
by a seeded torch.Generator. Loss = mean LM cross-entropy + aux_loss_coef * load-balancing loss.
"""
from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import torch


def build_config(m: dict, vocab_size: int, eos_id: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=m["hidden_size"], num_hidden_layers=m["num_hidden_layers"],
        num_attention_heads=m["num_attention_heads"], num_key_value_heads=m["num_key_value_heads"],
        head_dim=m["head_dim"], intermediate_size=m["intermediate_size"],
        moe_intermediate_size=m["moe_intermediate_size"], num_experts=m["num_experts"],
        num_experts_per_tok=m["num_experts_per_tok"], norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=m["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": float(m["rope_theta"])},
        rms_norm_eps=m["rms_norm_eps"], tie_word_embeddings=m["tie_word_embeddings"],
        initializer_range=m["initializer_range"], router_aux_loss_coef=m["router_aux_loss_coef"],
        output_router_logits=False, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        attention_bias=False, hidden_act="silu", use_cache=True,
    )


def build_model(config, seed: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    return model


def count_params(model, config) -> dict:
    """Total (unique, so tied embeddings count once) and active-per-token parameters."""
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = total - experts + experts * config.num_experts_per_tok // config.num_experts
    embed = model.get_input_embeddings().weight.numel()
    return {"total": total, "active": active, "experts": experts, "embedding": embed,
            "non_embedding": total - embed}


def epoch_windows(stream: torch.Tensor, S: int, epoch: int, gen: torch.Generator) -> torch.Tensor:
    """Shuffled non-overlapping windows [N, S]; offset and order drawn from gen."""
    offset = 0 if epoch == 0 else int(torch.randint(0, S, (1,), generator=gen))
    n = (stream.numel() - offset) // S
    wins = stream[offset:offset + n * S].view(n, S)  # [N, S]
    return wins[torch.randperm(n, generator=gen)]


def batches(stream: torch.Tensor, S: int, B: int, seed: int):
    """Infinite iterator of [B, S] batches, deterministic given seed."""
    gen = torch.Generator().manual_seed(seed)
    epoch = 0
    while True:
        wins = epoch_windows(stream, S, epoch, gen)
        for i in range(0, wins.shape[0] - B + 1, B):
            yield epoch, wins[i:i + B]
        epoch += 1


def lr_at(step: int, t: dict) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr over max_steps. A function of the step
    only, so a re-run follows the same schedule however fast the machine is."""
    lr, warm, total = float(t["lr"]), int(t["warmup_steps"]), int(t["max_steps"])
    if step < warm:
        return lr * (step + 1) / warm
    frac = min(1.0, (step - warm) / max(1, total - warm))
    floor = lr * float(t["min_lr_ratio"])
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * frac))


def make_optimizer(model, t: dict):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    groups = [{"params": decay, "weight_decay": float(t["weight_decay"])},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=float(t["lr"]), betas=tuple(t["betas"]), eps=1e-8)


def train_step(model, opt, x: torch.Tensor, lr: float, t: dict) -> tuple[float, float]:
    """One optimizer step on x [B, S]; returns (lm_loss, aux_loss)."""
    for g in opt.param_groups:
        g["lr"] = lr
    out = model(input_ids=x, labels=x, output_router_logits=True, use_cache=False)
    aux = out.aux_loss
    lm = out.loss - model.router_aux_loss_coef * aux
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), float(t["grad_clip"]))
    opt.step()
    opt.zero_grad(set_to_none=True)
    return lm.item(), aux.item()


class Logger:
    """Accumulates curve rows; rewrites training_log.json and .csv after every row."""

    def __init__(self, out_dir: Path, name: str = "training_log",
                 keys: tuple[str, ...] = ("step", "epoch", "tokens_seen", "elapsed_s", "lr", "train_loss", "aux_loss",
                                          "heldout_loss")):
        self.out_dir, self.rows, self.name, self.keys = Path(out_dir), [], name, keys

    def add(self, row: dict) -> None:
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"{self.name}.json").write_text(json.dumps(self.rows, indent=1))
        with open(self.out_dir / f"{self.name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.keys), extrasaction="ignore")
            w.writeheader()
            w.writerows(self.rows)


def train_loop(model, train_stream: torch.Tensor, eval_wins: list[list[int]], t: dict,
               seed: int, logger: Logger) -> dict:
    """Runs t['max_steps'] steps; max_wall_s is only a safety stop (recorded as stopped_early)."""
    from .evaluate import perplexity

    S, B = int(t["context_length"]), int(t["batch_size"])
    opt, data = make_optimizer(model, t), batches(train_stream, S, B, seed)
    t0, acc, step = time.time(), [], 0
    for step in range(int(t["max_steps"])):
        epoch, x = next(data)  # x: [B, S]
        model.train()
        lr = lr_at(step, t)
        acc.append(train_step(model, opt, x, lr, t))
        last = step + 1 == int(t["max_steps"]) or time.time() - t0 > float(t["max_wall_s"])
        if (step + 1) % int(t["log_every"]) == 0 or last:
            row = {"step": step + 1, "epoch": epoch, "tokens_seen": (step + 1) * B * S,
                   "elapsed_s": round(time.time() - t0, 1), "lr": lr,
                   "train_loss": sum(a[0] for a in acc) / len(acc),
                   "aux_loss": sum(a[1] for a in acc) / len(acc)}
            if (step + 1) % int(t["eval_every"]) == 0 or last:
                model.eval()
                row["heldout_loss"] = perplexity(model, eval_wins)["loss"]
            logger.add(row)
            acc = []
        if last:
            break
    return {"steps": step + 1, "tokens_seen": (step + 1) * B * S, "wall_s": time.time() - t0,
            "context_length": S, "batch_size": B,
            "stopped_early": step + 1 < int(t["max_steps"])}


def export(model, out_dir: Path, eos_id: int) -> None:
    """Save bf16 weights + config (dtype bfloat16) + generation_config."""
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = eos_id, eos_id, eos_id
    gc.do_sample = False
    model.save_pretrained(str(out_dir))
    compat_config(out_dir)


def compat_config(out_dir: Path) -> None:
    """Also write the legacy keys `num_experts` and `rope_theta` (as in released Qwen3-MoE configs and
    transformers 4.x), beside transformers 5's `num_local_experts` and `rope_parameters`."""
    path = Path(out_dir) / "config.json"
    cfg = json.loads(path.read_text())
    cfg["num_experts"] = cfg.get("num_local_experts", cfg.get("num_experts"))
    cfg["rope_theta"] = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta"))
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
