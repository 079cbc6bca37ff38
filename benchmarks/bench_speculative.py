"""Speculative decoding on MoE models, in-process and interleaved: decode tokens/s with and without
a speculator at batch 1, 4, 16 and 64, with the acceptance, the tokens a sequence gains per verify
step, and the distinct experts per MoE layer a verify step wakes against a plain decode at the same
batch (its last tokens alone) — the trade-off of speculation on an MoE: draft tokens of different
sequences route to different experts, so a verify step reads more expert weights than a decode.

  python benchmarks/make_cpu_bench_models.py mixtral /tmp/m340     # the Mixtral-style ~340M model
  python benchmarks/bench_speculative.py --model stdlib-moe /tmp/m340 --batch 1 4 16 64 [--speculative ngram:4 mtp:1]

Per model and batch: `rounds` rounds; each round runs the plain engine and one engine per
speculator (mtp:K needs a checkpoint with an MTP layer; the order rotates every round and every
other round runs backwards) on the same B prompts (held-out stdlib code, cut to --prompt-len
tokens, cycled), each timed from after its prefill until every sequence has --output-len tokens
(greedy; EOS ignored). tok/s = B · (output_len − 1) / time. The speed-up is the median of the
rounds' paired ratios (speculative ÷ plain), with min–max. Load average before and after.
--unfused-verify adds, per speculator, the same speculator with its verify steps kept out of the
fused decode layers (`FusedDecode.verify` off during its runs: the path before they took them),
in the same rotation: before vs after in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


UNFUSED = "(verify unfused)"


def _spread(xs: list[float], fmt: str = ".1f") -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"


def _prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    from moetune.model.registry import bundled_asset

    lines = bundled_asset("prompts/stdlib-heldout.jsonl").read_text().splitlines()
    texts = [json.loads(line)["prompt"] for line in lines]
    ids = [tokenizer.encode(t)[:length] for t in texts]
    return [ids[i % len(ids)] for i in range(n)]


def _timed(engine, prompts: list[list[int]], output_len: int, fused_verify: bool = True) -> float:
    """Add the batch, run its prefill step untimed, then time the decode until all finish.
    fused_verify False: verify steps leave the fused decode layers (as before they took them)."""
    from moetune.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    fused = engine.model.fused
    if fused is not None:
        fused.verify = fused_verify
    try:
        for p in prompts:
            engine.add_request(p, params)
        engine.step()  # every prompt in one prefill step: each samples its first token
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return time.perf_counter() - start
    finally:
        if fused is not None:
            fused.verify = True


def _engine(model, batch: int, prompt_len: int, output_len: int, speculative: str | None):
    from moetune.config import EngineConfig
    from moetune.engine.engine import Engine

    per_seq = -(-(prompt_len + output_len + 17) // 16)
    config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(batch * prompt_len, 2048),
                          num_kv_blocks=batch * per_seq, prefix_caching=False, speculative=speculative)
    return Engine(model, None, frozenset(), config)


def bench_one(model, tokenizer, batch: int, args) -> list[dict]:
    """One batch size: the plain engine and one engine per speculator, interleaved (each round
    rotates the order and every other round reverses it); a row per speculator."""
    from moetune.bench.roofline import expert_bytes
    from moetune.engine.speculative.experts import speculative_counters, speculative_summary

    prompts = _prompts(tokenizer, batch, args.prompt_len)
    engines = {"plain": _engine(model, batch, args.prompt_len, args.output_len, None)}
    engines.update({s: _engine(model, batch, args.prompt_len, args.output_len, s) for s in args.speculative})
    unfused = [f"{s} {UNFUSED}" for s in args.speculative] if args.unfused_verify else []
    engines.update({u: _engine(model, batch, args.prompt_len, args.output_len, s)
                    for u, s in zip(unfused, args.speculative)})
    for name, engine in engines.items():  # warm-up (kernels compiled, pools touched)
        _timed(engine, prompts, 4, name not in unfused)
    before = {s: speculative_counters(engines[s].stats, engines[s].runner.experts) for s in args.speculative}
    times: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in (order if r % 2 == 0 else order[::-1]):
            times[name].append(_timed(engines[name], prompts, args.output_len, name not in unfused))
    tokens, rows = batch * (args.output_len - 1), []
    for spec in args.speculative:
        after = speculative_counters(engines[spec].stats, engines[spec].runner.experts)
        s = speculative_summary(spec, {k: after[k] - before[spec][k] for k in after}, expert_bytes(model))
        u = times.get(f"{spec} {UNFUSED}", [])
        rows.append({"batch": batch, "plain": [tokens / t for t in times["plain"]],
                     "spec": [tokens / t for t in times[spec]],
                     "ratio": [p / q for p, q in zip(times["plain"], times[spec])],
                     "unfused": [tokens / t for t in u], "unfused_ratio": [p / q for p, q in zip(times["plain"], u)],
                     **s})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", default=["stdlib-moe"])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--speculative", nargs="+", default=["ngram:4"],
                   help="one or more of ngram:K, draft:DIR:K, mtp:K (each timed against plain, interleaved)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--output-len", type=int, default=33)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--unfused-verify", action="store_true",
                   help="also time each speculator with its verify steps outside the fused decode layers "
                        "(as before they took them), interleaved with the rest")
    p.add_argument("--write-doc", action="store_true",
                   help="also write the table into its section of docs/benchmarks.md (benchmarks/doc_section.py)")
    args = p.parse_args()

    from moetune.engine.threads import choose_wait_policy, use_threads

    choose_wait_policy()
    use_threads(args.threads)
    from moetune.config import parse_config
    from moetune.engine.build import build_model
    from moetune.engine.tokenizer import load_tokenizer
    from moetune.engine.target import resolve_target

    load_before = open('/proc/loadavg').read().strip()
    print(f"loadavg before: {load_before}  ·  {args.speculative}, {args.rounds} rounds, "
          f"prompt {args.prompt_len}, output {args.output_len}, threads {args.threads}, pid {os.getpid()}")
    before = "| verify unfused tok/s | speed-up verify unfused " if args.unfused_verify else ""
    table = [f"| model | batch | speculative | plain tok/s | speculative tok/s | speed-up {before}| acceptance "
             "| drafts/verify | tokens/verify | experts/layer verify vs plain | expert MiB/step verify vs plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.unfused_verify else "")]
    print("\n".join(table))
    for name in args.model:
        target = resolve_target(parse_config({"model": {"path": name}}, source="bench_speculative"))
        model, tokenizer = build_model(target), load_tokenizer(target.model_dir)
        for batch in args.batch:
            for r in bench_one(model, tokenizer, batch, args):
                table.append(_row(target.model_dir.name, batch, r))
                print(table[-1], flush=True)
    load_after = open('/proc/loadavg').read().strip()
    print(f"loadavg after: {load_after}")
    if args.write_doc:
        from doc_section import section, write_section  # benchmarks/doc_section.py, beside this script

        write_section("speculative", section("speculative", "Speculative decoding per speculator and batch "
                                             "(tok/s median (min–max) of interleaved rounds)", table,
                                             load_before, load_after))
        print("wrote its section of docs/benchmarks.md")


def _row(name: str, batch: int, r: dict) -> str:
    return (f"| {name} | {batch} | {r['method']} | {_spread(r['plain'])} | {_spread(r['spec'])} | "
            f"{_spread(r['ratio'], '.2f')}× | {_before(r)}{100 * r['acceptance_rate']:.0f}% | "
            f"{r['draft_tokens'] / max(r['verified'], 1):.2f} | {r['tokens_per_verify']:.2f} | "
            f"{r['experts_per_layer_verify']:.1f} vs {r['experts_per_layer_plain']:.1f} | "
            f"{r['expert_bytes_per_step_verify'] / 2**20:.1f} vs {r['expert_bytes_per_step_plain'] / 2**20:.1f} |")


def _before(r: dict) -> str:
    """The verify-unfused columns (--unfused-verify), else nothing."""
    return f"{_spread(r['unfused'])} | {_spread(r['unfused_ratio'], '.2f')}× | " if r["unfused"] else ""


if __name__ == "__main__":
    main()
