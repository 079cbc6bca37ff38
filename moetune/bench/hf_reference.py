"""The same workloads run through transformers (the reference implementation) for comparison."""

from __future__ import annotations

from pathlib import Path

import torch

from moetune.bench.throughput import BenchRow, BenchSettings, random_prompts
from moetune.bench.timing import measure


def load_transformers(model_dir: Path, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    return model


@torch.inference_mode()
def bench_transformers(model, vocab: int, s: BenchSettings, device: torch.device) -> list[BenchRow]:
    prompt = random_prompts(vocab, 1, s.prefill_len, s.seed).to(device)
    rows = [BenchRow("transformers", f"prefill b=1 len={s.prefill_len}", s.prefill_len,
                     measure(lambda: model(prompt, use_cache=False, logits_to_keep=1), device, s.runs))]
    for b in s.decode_batches:
        prompts = random_prompts(vocab, b, s.decode_context, s.seed + b).to(device)

        def setup(prompts=prompts):
            out = model(prompts, use_cache=True, logits_to_keep=1)
            return out.past_key_values, out.logits[:, -1]

        def run(state):
            cache, logits = state
            for _ in range(s.decode_steps):
                token = logits.argmax(-1, keepdim=True)  # [B, 1]
                out = model(token, past_key_values=cache, use_cache=True)
                cache, logits = out.past_key_values, out.logits[:, -1]

        rows.append(BenchRow("transformers", f"decode b={b}", b * s.decode_steps, measure(run, device, s.runs, setup=setup)))
    return rows
