"""Decode on the CPU against the machine's read limit, with fp32 or int8 (or int4) routed experts.

  python benchmarks/bench_cpu_decode.py --model /tmp/m340 [--experts fp32 int8] [--batch 1 16]
      [--steps 32] [--runs 5] [--quality-model stdlib-moe] [--quality-prompts 32]

Speed: through the Engine as `moetune bench` runs it (decode steps after an untimed prefill of a
128-token random prompt per sequence; median of `--runs`, min–max), with every layer's routed
experts quantized in place (`moetune.kernels.cpu.quantize_int8` / `quantize_int4`, group 64) and
everything else fp32. GB/s = weight bytes read per run / time, bytes counted as in
`moetune.bench.roofline` (the quantized experts' bytes, scales included). The read limit is
sampled in the same process before every timed run. Every format's model is loaded beside the
first's (fp32 by default) and their runs take turns, so the printed ratio compares the same
moments of the machine.

Quality (`--quality-model`, default the bundled trained model): logits of fp32 vs quantized experts
at every position of the first N held-out prompts (truncated to 256 tokens), one prefill each:
mean KL(p_fp32 ‖ p_quant) per token and top-1 agreement.
"""

from __future__ import annotations

import argparse

from moetune.engine.heap import keep_freed_memory
from moetune.engine.threads import choose_wait_policy, use_threads, wait_policy

choose_wait_policy()  # as the CLI does, before torch loads OpenMP (docs/cpu.md)
keep_freed_memory()  # as the CLI does (engine/heap.py)

import torch  # noqa: E402


def quantize_experts(model, fmt: str) -> None:
    """Replace the model's resident routed experts by `fmt` copies (fp32: unchanged)."""
    from moetune.experts.store import ExpertWeights, ResidentExpertStore
    from moetune.kernels.cpu import quantize_int4, quantize_int8
    from moetune.moe.layer import MoELayer

    if fmt == "fp32":
        return
    quant = quantize_int8 if fmt == "int8" else (lambda w: quantize_int4(w, 64))
    old = model.experts
    layers = {}
    for i in old.layers():
        w = old.weights(i)
        layers[i] = ExpertWeights(quant(w.w13.data), quant(w.w2.data), w.slots)
    store = ResidentExpertStore(layers)
    model.experts = store
    for layer in model.layers:
        if isinstance(layer.mlp, MoELayer):
            layer.mlp.store = store


def speed(model_dir: str, formats: list[str], batches: list[int], steps: int, runs: int) -> None:
    """Decode rows for every expert format. Each format's model is loaded beside the first format's,
    and for each workload their runs take turns (`measure_alternating`), so that each ratio to the
    first format compares the same moments of a machine whose speed drifts by tens of percent."""
    from moetune.bench.roofline import LimitSampler
    from moetune.bench.throughput import WARMUP, BenchSettings, plan_moetune, sampled_beside
    from moetune.bench.timing import measure, measure_alternating
    from moetune.model.loader import load_model

    settings = BenchSettings(prefill_len=16, decode_batches=tuple(batches), decode_steps=steps, runs=runs)
    sampler = LimitSampler(torch.device("cpu"))  # a read-limit sample before each timed run, as `moetune bench`
    sides = []
    for fmt in formats:
        model = load_model(model_dir)
        quantize_experts(model, fmt)
        plans, done = plan_moetune(model, settings)
        sides.append((fmt, sampled_beside(plans[1:], sampler), done))  # (decode workloads only)
    base_fmt, base, _ = sides[0]
    if len(sides) == 1:
        for a in base:
            _print_row(base_fmt, a.row(measure(a.work.fn, torch.device("cpu"), runs, warmup=WARMUP,
                                               setup=a.work.setup), sampler.median(a.workload)), steps)
    for fmt, plans, _ in sides[1:]:
        for a, b in zip(base, plans):
            ta, tb = measure_alternating(a.work, b.work, torch.device("cpu"), runs, warmup=WARMUP)
            ra, rb = a.row(ta, sampler.median(a.workload)), b.row(tb, sampler.median(b.workload))
            _print_row(base_fmt, ra, steps)
            _print_row(fmt, rb, steps)
            print(f"  {fmt} ÷ {base_fmt} {a.workload}: {rb.tokens_per_s / ra.tokens_per_s:.2f}x (runs taking turns)")
    for _, _, done in sides:
        done()


def _print_row(fmt: str, r, steps: int) -> None:
    lo, hi = r.tokens / r.timing.max_s, r.tokens / r.timing.min_s
    print(f"  experts {fmt:<5} {r.workload:<11} {r.tokens_per_s:8.1f} tok/s ({lo:.1f}–{hi:.1f}) "
          f"{r.gbytes_per_s:6.1f} GB/s = {r.gbytes_per_s / r.limit:5.1%} of read limit "
          f"{r.limit:.1f} GB/s (beside its runs) · weight bytes/step {r.weight_bytes / steps / 1e6:.1f} MB "
          f"· load avg {open('/proc/loadavg').read().split()[0]}")


@torch.inference_mode()
def quality(model_name: str, fmt: str, n: int) -> None:
    from moetune.engine.model_runner import ModelRunner
    from moetune.engine.tokenizer import load_tokenizer
    from moetune.model.loader import load_model
    from moetune.model.registry import bundled_asset, resolve_model
    from moetune.profile.workload import load_prompt_texts

    path = resolve_model(model_name)
    tok = load_tokenizer(path)
    texts = load_prompt_texts(bundled_asset("prompts/stdlib-heldout.jsonl"))[:n]
    prompts = [tok.encode(t)[:256] for t in texts]
    ref, quant = load_model(path), load_model(path)
    quantize_experts(quant, fmt)
    kls, agree, total = [], 0, 0
    for ids in prompts:
        logits = []
        for model in (ref, quant):
            runner = ModelRunner(model, num_blocks=-(-len(ids) // 16), block_size=16)
            logits.append(model.logits(runner.forward_prompts([ids])))  # [S, V]
        p, q = logits[0].log_softmax(-1), logits[1].log_softmax(-1)
        kls.append((p.exp() * (p - q)).sum(-1))  # [S]
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        total += len(ids)
    kl = torch.cat(kls)
    print(f"  quality {fmt} vs fp32 experts on {model_name}: {n} prompts, {total} positions: mean KL "
          f"{kl.mean():.2e} nats (median {kl.median():.2e}, max {kl.max():.2e}), top-1 agreement {agree / total:.2%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--experts", nargs="+", default=["fp32", "int8"], choices=["fp32", "int8", "int4"])
    p.add_argument("--batch", type=int, nargs="+", default=[1])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--quality-model", default="stdlib-moe")
    p.add_argument("--quality-prompts", type=int, default=32)
    p.add_argument("--no-quality", action="store_true")
    args = p.parse_args()
    use_threads(None)
    print(f"threads {torch.get_num_threads()} · OpenMP wait: {wait_policy()}")
    speed(args.model, args.experts, args.batch, args.steps, args.runs)
    if not args.no_quality:
        for fmt in args.experts:
            if fmt != "fp32":
                quality(args.quality_model, fmt, args.quality_prompts)


if __name__ == "__main__":
    main()
