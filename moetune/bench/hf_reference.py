"""The same workloads run through transformers (the reference implementation) for comparison."""

from __future__ import annotations

from pathlib import Path

import torch

from moetune.bench.throughput import BenchRow, BenchSettings, Planned, random_prompts
from moetune.bench.timing import Work, measure


def load_transformers(model_dir: Path, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    return model


def bench_transformers(model, vocab: int, s: BenchSettings, device: torch.device) -> list[BenchRow]:
    """Every workload of `plan_transformers`, timed one after the other (each runs in inference mode)."""
    plans = plan_transformers(model, vocab, s, device)
    return [p.row(measure(p.work.fn, device, s.runs, setup=p.work.setup)) for p in plans]


def plan_transformers(model, vocab: int, s: BenchSettings, device: torch.device) -> list[Planned]:
    """The workloads of `plan_moetune`, in its order, through transformers: prefill = one forward
    over the prompt (logits of the last position); decode = `decode_steps` greedy steps through its
    KV cache after an untimed prefill of the same prompts."""
    prompt = random_prompts(vocab, 1, s.prefill_len, s.seed).to(device)

    @torch.inference_mode()
    def prefill() -> None:
        model(prompt, use_cache=False, logits_to_keep=1)

    plans = [Planned("transformers", f"prefill b=1 len={s.prefill_len}", s.prefill_len, Work(prefill))]
    for b in s.decode_batches:
        prompts = random_prompts(vocab, b, s.decode_context, s.seed + b).to(device)

        @torch.inference_mode()
        def setup(prompts=prompts):
            out = model(prompts, use_cache=True, logits_to_keep=1)
            return out.past_key_values, out.logits[:, -1]

        @torch.inference_mode()
        def run(state):
            cache, logits = state
            for _ in range(s.decode_steps):
                token = logits.argmax(-1, keepdim=True)  # [B, 1]
                out = model(token, past_key_values=cache, use_cache=True)
                cache, logits = out.past_key_values, out.logits[:, -1]

        plans.append(Planned("transformers", f"decode b={b}", b * s.decode_steps, Work(run, setup)))
    return plans
