"""The `mtp` stage: a multi-token-prediction head for the shipped model, trained with the target
frozen, written beside it in the DeepSeek-V3 layout (moetune/model/mtp.py).

Shipped as `mtp.safetensors` (layer index L = num_hidden_layers: enorm, hnorm, eh_proj,
shared_head.norm and a qwen3_moe decoder block; the head and embedding are the target's tied
ones) plus `num_nextn_predict_layers: 1` in config.json. transformers reads model.safetensors
by name and never opens the second file, so it loads the model as before; moetune's loader sees
every *.safetensors file of the directory and reads layer L when `--speculative mtp:K` asks.

Training, per window x [B, S] of the corpus stream: the frozen target gives h (its last hidden
state, after the final norm) and its logits; the head sees (t_{p+1}, h_p) at positions
p = 0..S-2 (embedding zeroed at 0, as vLLM does) and is trained to match the target's own
next-position distribution softmax(logits_{p+1}) (distillation: speculation is accepted when the
head guesses what the target will pick, not what the corpus says). Warm start: the block is a
copy of the target's last layer (a balanced router from step 0), shared_head.norm of its final
norm, eh_proj random (std = initializer_range); no load-balancing loss.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import corpus, tokenizer
from . import evaluate as ev
from .train import Logger, batches


class MTPHead(torch.nn.Module):
    def __init__(self, target, init_std: float):
        super().__init__()
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer, Qwen3MoeRMSNorm

        c = target.config
        D, L = c.hidden_size, c.num_hidden_layers
        self.enorm, self.hnorm = Qwen3MoeRMSNorm(D, c.rms_norm_eps), Qwen3MoeRMSNorm(D, c.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * D, D, bias=False)
        torch.nn.init.normal_(self.eh_proj.weight, std=init_std)
        self.block = Qwen3MoeDecoderLayer(c, layer_idx=L - 1)  # the last layer's kind (MoE here)
        self.block.load_state_dict(target.model.layers[L - 1].state_dict())
        self.norm = Qwen3MoeRMSNorm(D, c.rms_norm_eps)
        self.norm.weight.data.copy_(target.model.norm.weight.data)

    def forward(self, target, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x [B, S] tokens, h [B, S, D] the target's hidden states → logits [B, S-1, V] (row p: t_{p+2})."""
        e = target.model.embed_tokens(x[:, 1:])  # [B, S-1, D]: t_{p+1}
        e = torch.cat([torch.zeros_like(e[:, :1]), e[:, 1:]], dim=1)  # zeroed at position 0
        z = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h[:, :-1])], dim=-1))  # [B, S-1, D]
        pos = torch.arange(z.shape[1])[None]  # [1, S-1]
        y = self.block(z, attention_mask=None, position_ids=pos,
                       position_embeddings=target.model.rotary_emb(z, pos))  # causal (sdpa, no mask)
        return target.lm_head(self.norm(y))


def lr_at(step: int, m: dict) -> float:
    lr, warm, total = float(m["lr"]), int(m["warmup_steps"]), int(m["max_steps"])
    if step < warm:
        return lr * (step + 1) / warm
    frac = min(1.0, (step - warm) / max(1, total - warm))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def distill_loss(head: MTPHead, target, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL-style soft cross-entropy to the target's next-position distribution, top-1 agreement)."""
    with torch.no_grad():
        out = target.model(input_ids=x, use_cache=False)
        h = out.last_hidden_state  # [B, S, D] after the final norm
        want = F.softmax(target.lm_head(h[:, 1:]).float(), dim=-1)  # [B, S-1, V]: the target at p+1
    logits = head(target, x, h).float()  # [B, S-1, V]
    loss = -(want * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    agree = (logits.argmax(-1) == want.argmax(-1)).float().mean()
    return loss, agree


@torch.no_grad()
def heldout_agreement(head: MTPHead, target, wins: list[list[int]]) -> dict:
    """On held-out windows: how often the head's argmax is the target's argmax one position on (the
    greedy acceptance of a one-token draft, teacher-forced), and the soft cross-entropy."""
    head.eval()
    losses, agrees = [], []
    for w in wins:
        loss, agree = distill_loss(head, target, torch.tensor([w]))
        losses.append(float(loss))
        agrees.append(float(agree))
    head.train()
    return {"soft_ce": sum(losses) / len(losses), "top1_agreement": sum(agrees) / len(agrees)}


def export_head(head: MTPHead, target, model_dir: Path) -> int:
    """mtp.safetensors (bf16, per-expert names as model.safetensors has them) + the config key; bytes."""
    from safetensors.torch import save_file

    L = target.config.num_hidden_layers
    p, out = f"model.layers.{L}.", {}
    for name in ("enorm", "hnorm", "eh_proj"):
        out[p + name + ".weight"] = getattr(head, name).weight
    out[p + "shared_head.norm.weight"] = head.norm.weight
    for name, t in _per_expert(head.block.state_dict(), target.config.moe_intermediate_size).items():
        out[p + name] = t
    out = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in out.items()}
    path = Path(model_dir) / "mtp.safetensors"
    save_file(out, str(path), metadata={"format": "pt"})
    cfg_path = Path(model_dir) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_nextn_predict_layers"] = 1
    cfg_path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
    return path.stat().st_size


def _per_expert(state: dict, inter: int) -> dict:
    """transformers' fused experts (gate_up_proj [E, 2I, D], down_proj [E, D, I]) → the checkpoint's
    mlp.experts.{e}.{gate,up,down}_proj.weight (gate rows first, as transformers fuses them on load)."""
    out = {k: v for k, v in state.items() if ".experts." not in k}
    gate_up, down = state["mlp.experts.gate_up_proj"], state["mlp.experts.down_proj"]
    for e in range(gate_up.shape[0]):
        out[f"mlp.experts.{e}.gate_proj.weight"] = gate_up[e, :inter]
        out[f"mlp.experts.{e}.up_proj.weight"] = gate_up[e, inter:]
        out[f"mlp.experts.{e}.down_proj.weight"] = down[e]
    return out


def check_expert_layout(model_dir: Path, target) -> None:
    """The fused → per-expert split above, checked on the target's own last layer against its file."""
    from safetensors import safe_open

    L, inter = target.config.num_hidden_layers, target.config.moe_intermediate_size
    mine = _per_expert(target.model.layers[L - 1].state_dict(), inter)
    with safe_open(str(Path(model_dir) / "model.safetensors"), framework="pt") as f:
        for name in ("mlp.experts.0.gate_proj.weight", "mlp.experts.3.up_proj.weight", "mlp.experts.5.down_proj.weight"):
            stored = f.get_tensor(f"model.layers.{L - 1}.{name}").float()
            if not torch.equal(stored, mine[name].float()):
                raise RuntimeError(f"the fused expert layout does not split back into {name}")


def train_head(head: MTPHead, target, stream: torch.Tensor, eval_wins: list[list[int]], m: dict, seed: int,
               logger: Logger) -> dict:
    S, B = int(m["context_length"]), int(m["batch_size"])
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=float(m["lr"]), betas=(0.9, 0.95), weight_decay=float(m["weight_decay"]))
    data, t0, acc = batches(stream, S, B, seed + 1), time.time(), []
    step = 0
    for step in range(int(m["max_steps"])):
        epoch, x = next(data)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, m)
        loss, agree = distill_loss(head, target, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc.append((loss.item(), agree.item()))
        last = step + 1 == int(m["max_steps"]) or time.time() - t0 > float(m["max_wall_s"])
        if (step + 1) % int(m["log_every"]) == 0 or last:
            row = {"stage": "mtp", "step": step + 1, "epoch": epoch, "elapsed_s": round(time.time() - t0, 1),
                   "lr": lr_at(step, m), "train_soft_ce": sum(a[0] for a in acc) / len(acc),
                   "train_top1_agreement": sum(a[1] for a in acc) / len(acc)}
            if (step + 1) % int(m["eval_every"]) == 0 or last:
                row.update({f"heldout_{k}": v for k, v in heldout_agreement(head, target, eval_wins).items()})
            logger.add(row)
            acc = []
        if last:
            break
    return {"steps": step + 1, "tokens_seen": (step + 1) * B * S, "wall_s": time.time() - t0,
            "context_length": S, "batch_size": B, "stopped_early": step + 1 < int(m["max_steps"])}


def run_mtp_stage(r: dict, model_dir: Path) -> dict:
    """Train, export and measure the head of the model in `model_dir`; its metrics (also written
    into metrics.json under "mtp")."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    m = r["mtp"]
    torch.set_num_threads(int(r["threads"]))
    torch.manual_seed(int(r["seed"]))
    target = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    check_expert_layout(model_dir, target)
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    split = corpus.make_split(corpus.CorpusRule.from_dict(r["corpus"]))
    eos = int(target.config.eos_token_id)
    train_ids = ev.stream(tokenizer.encode_docs(tok, corpus.read_docs(split.root, split.train)), eos)
    held_ids = ev.stream(tokenizer.encode_docs(tok, corpus.read_docs(split.root, split.heldout)), eos)
    S = int(m["context_length"])
    eval_wins = ev.windows(held_ids, S)[: int(m["eval_windows"])]
    head = MTPHead(target, float(r["model"]["initializer_range"]))
    logger = Logger(Path(model_dir), "mtp_training_log", ("step", "epoch", "elapsed_s", "lr", "train_soft_ce",
                                                          "train_top1_agreement", "heldout_soft_ce",
                                                          "heldout_top1_agreement"))
    result = train_head(head, target, torch.tensor(train_ids, dtype=torch.long), eval_wins, m, int(r["seed"]), logger)
    size = export_head(head, target, model_dir)
    return {"training": result, "heldout": heldout_agreement(head, target, eval_wins), "file_bytes": size,
            "params": sum(p.numel() for p in head.parameters()), "eval_windows": len(eval_wins),
            "window_tokens": S}


def engine_acceptance(model_dir: Path, prompts: Path, k: int, n_prompts: int, max_tokens: int) -> dict:
    """The head through moetune's engine: greedy decoding of the first `n_prompts` held-out prompts
    (`max_tokens` each, all at once) with `mtp:k`; acceptance and tokens per verify."""
    from moetune.config import EngineConfig
    from moetune.engine.engine import Engine
    from moetune.engine.sampling import SamplingParams
    from moetune.engine.tokenizer import load_tokenizer
    from moetune.model.loader import load_model

    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    rows = [json.loads(line) for line in Path(prompts).read_text().splitlines()[:n_prompts]]
    engine = Engine(model, None, frozenset(), EngineConfig(speculative=f"mtp:{k}", max_num_seqs=n_prompts))
    for row in rows:
        engine.add_request(tok.encode(row["prompt"]), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    with torch.inference_mode():
        while engine.has_unfinished():
            engine.step()
    st = engine.stats
    return {"k": k, "prompts": len(rows), "max_tokens": max_tokens, "draft_tokens": st.draft_tokens,
            "accepted_tokens": st.accepted_tokens, "acceptance_rate": st.acceptance_rate,
            "tokens_per_verify": st.tokens_per_verify}


def run_and_record(r: dict, model_dir: Path, prompts: Path) -> dict:
    """The whole stage: train and export the head, measure it in the engine, merge it into the
    model's metrics.json under "mtp"; returns the merged metrics."""
    m = r["mtp"]
    got = run_mtp_stage(r, model_dir)
    got["engine"] = [engine_acceptance(model_dir, prompts, k, int(m["accept_prompts"]), int(m["accept_tokens"]))
                     for k in m["accept_k"]]
    path = Path(model_dir) / "metrics.json"
    metrics = json.loads(path.read_text()) if path.exists() else {}
    metrics["mtp"] = got
    path.write_text(json.dumps(metrics, indent=1))
    return metrics
