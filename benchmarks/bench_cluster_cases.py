"""The cluster cases of the search (estimated, on the simulator): Mixtral-8x7B and Qwen3-30B-A3B on
8×H200, DeepSeek-V3 on 8 and 16×H200; input 1,024 / output 256 tokens; TTFT ≤ 1 s and TPOT ≤ 50 ms
(medians, the study's constraints) in a steady state: by default (`--concurrency 0`) each trial at the
highest closed-loop concurrency per replica whose TTFT / TPOT P90 meet them (cost/slo_load.py), else
a closed loop at each concurrency given per replica.

2026-12-05 (issue 38), 80 trials a case, each run alone on the CPU lock (load 2.1–5.1 at its start),
main at --concurrency 256 → this load search: 80 trials wall / trial median / P99 s — Mixtral 12.7 /
0.09 / 0.56 → 13.3 / 0.10 / 0.36; Qwen3 28.4 / 0.15 / 1.20 → 26.4 / 0.20 / 1.15; DeepSeek-V3 8×H200
27.2 / 0.24 / 1.49 → 46.9 / 0.41 / 1.03; 16×H200 41.8 / 0.39 / 1.27 → 51.6 / 0.43 / 1.77 (docs/search.md
"Numbers (2026-12-05 …)" has the winners).
For each case and concurrency: the winner, tok/s per GPU, TTFT/TPOT P50 and P99, memory per GPU,
its phase breakdown, and the time each simulated trial took (median, P99).

  python benchmarks/bench_cluster_cases.py --trace RUN [--trials 30] [--concurrency 256 1024]
      [--scale-routing stats|blocks|loads:FILE]   (how the trace's routing is scaled: search/cost/scale.py)

  [--no-reference-trials] (the study without its seeded trials) [--cases 0,1,2,3] [--reference-points]
  [--cross PYTHON [--engine vllm|sglang] [--trials 80] [--measured-only] [--write-doc]]   (each tool's winner priced
      by the other: benchmarks/peer_cross.py; --measured-only: moetune's search over the expert formats the tables hold)
  [--peer PYTHON [--engine vllm|sglang] [--engine-version V] [--write-doc]]   (beside AIConfigurator's own estimate:
      benchmarks/peer_compare.py; PYTHON: a throwaway venv with `pip install aiconfigurator==0.12.0`,
      run with the gpu-db extra installed here for the measured tables; --trials 0 skips the studies)
  [--balanced [--peer PYTHON] [--trials 80] [--write-doc]]   (the winner, and the peer's best, re-priced at the SLOs'
      load with the trace's routing and balanced, P90 and P50: benchmarks/peer_balanced.py)
  [--peer PYTHON --one-gpu [--write-doc]]   (the 1-GPU replica of Mixtral and Qwen3: static batches 1-512 and the
      steady state at 384 / 512 in flight, op by op: benchmarks/peer_steady.py)

Every figure is an estimate. Public reference points (their own conditions; not the same workload):
SGLang's large-scale EP DeepSeek-V3 (96 H100, prefill/decode disaggregated) ~2.8k output tok/s per
H100 in decode; vLLM wide-EP DeepSeek ~2.2k output tok/s per H200; Mixtral-8x7B on 4×A100 3,200
tok/s at 28 ms P50 decode. `--reference-points` prices those operating points (REFERENCE below).

2026-12-04 (issue 24), trace `moetune profile --out runs/p --num-requests 16 --batch-size 8
--output-len 32`, `--trials 40 --concurrency 256`; rerun with the vectorised simulator (cost/vector.py),
load 1.6 → 1.1, DeepSeek-V3 read as its fp8 checkpoint (docs/search.md has the table with TTFT/TPOT
P99 and the reasons); trial time before → after:

| case | winner (seed) | tok/s/GPU | TTFT / TPOT P50 ms | GB/GPU | feasible / trials | trial s median / P99 |
|---|---|---|---|---|---|---|
| Mixtral-8x7B 8×H200 | 8 replicas × R=1 seqs 256 tok 2048 fp8 (replicas) | 6,783 | 102 / 37.1 | 70.9 | 19/40 | 0.71 / 2.50 → 0.12 / 0.40 |
| Qwen3-30B-A3B 8×H200 | 8 replicas × R=1 seqs 256 tok 2048 fp8 (replicas) | 12,880 | 45 / 19.6 | 49.1 | 29/40 | 0.94 / 8.21 → 0.14 / 0.92 |
| DeepSeek-V3 8×H200 | R=8 N=32 EPLB seqs 32 tok 512 fp8 (ep-node) | 648 | 245 / 48.5 | 116.9 | 8/40 | 1.60 / 4.69 → 0.22 / 0.95 |
| DeepSeek-V3 16×H200 | 2 replicas × R=8 EPLB tok 256 fp8, bf16 KV (sampled) | 658 | 345 / 47.1 | 107.7 | 6/40 | 2.02 / 5.58 → 0.37 / 0.85 |

A 300-trial study (`--trials 300 --cases 2` / `--cases 1`): 93 s / 51 s wall.

`--no-reference-trials` (40 trials, load 1.6): Qwen3 4,711 tok/s/GPU (4 replicas × R=2, bf16 experts);
neither DeepSeek-V3 case finds a feasible trial (0/40 each).

2026-12-05 (issue 38), `--trials 0 --peer PYTHON` with the gpu-db extra (H200 vLLM 0.24.0 tables, both
sides): Mixtral-8x7B and Qwen3-30B-A3B within 15 % of AIConfigurator's own estimate at every
configuration (TP-8, EP-8 with DP attention; batch 1-256), DeepSeek-V3 TP-8 and EP-8 within 15 % on
TPOT but at two points; EP-16 over two nodes 1.2-1.9x slower (the tables hold one-node DeepEP only:
the peer substitutes those rows, moetune priced the engine's measured 2-node dispatch); since moetune
substitutes them too (op_tables.Measured.deepep_curves), EP-16 TPOT 0.83-1.04x the peer's. The tables
and the gaps op by op: docs/search.md. `--cross`: each tool's winner priced by the other (peer_cross.py);
peer_disagg.py: the peer's best disaggregated DeepSeek-V3 deployment (16×H200) step by step, op group by op group.
2026-12-05, with the disaggregated seed and the prefill worker's expert TP searched (commit a2b194c, load 1.5):
DeepSeek-V3 16×H200 picks the peer's own shape (1 prefill + 1 decode worker, DP-8 attention × TP-8 experts),
508 tok/s/GPU at 404 in flight vs the peer's 412 (1.23×; the peer prices it at 413); 8×H200 unchanged (327;
after main's mixed-step pricing, e4ea4d6: 277, the same on main alone).
2026-12-06 (branch meshshared, 744e5e4, load 2.0-2.9, shared lock): the general mesh's shared expert on each
engine's rows and beside the routed path where the engine runs its second stream (cost/mesh.py): 8×H200 467
tok/s/GPU (the same mesh, seqs 256 / tok 256, 191 in flight; 1.49× the peer's 314), 16×H200 510 (1.24×);
--cross: the peer prices that winner at 373, moetune the peer's pick at 367 (1.17-1.25× on the same deployments).

2026-12-05 (issue 38), `--peer PYTHON --one-gpu`: the 1-GPU replica agrees with AIConfigurator on a static batch
(TPOT 0.96-1.01 at 1-512) and, after the mixed-step fix (op_tables.mixed_split), on its mixed step (0.97-0.99; was
0.74 on Qwen3 at 384); the steady states part by the schedule's shape only (TPOT 0.81-0.96). docs/search.md has it.

Public operating points, estimated: DeepSeek-V3 R=16 EPLB TBO fp8 at 128–256 per GPU, 2,000 / 100
tokens: decode-only steps 0.8k tok/s per H100 (over its 80 GB), 1.0k per H200 (the aggregated
closed loop is prefill-bound: 123–138 output tok/s/GPU, TPOT ~560 ms); Mixtral TP 4 on 4×A100 at
88 in flight: 343 tok/s/GPU (1,372 in all), TPOT 56.6 ms, against the public 3,200 / 28 ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [("Mixtral-8x7B", "mixtral-8x7b.json", "8xH200"), ("Qwen3-30B-A3B", "qwen3-30b-a3b.json", "8xH200"),
         ("DeepSeek-V3", "deepseek-v3.json", "8xH200"), ("DeepSeek-V3", "deepseek-v3.json", "16xH200")]


def run_case(trace: str, config: str, hardware: str, concurrency: int, trials: int, out: Path,
             scale_routing: str | None = None, seeded: bool = True, engine: str | None = None,
             space_file: str | None = None):
    from moetune.search.study.optuna_study import Constraints, StudySettings
    from moetune.search.study.run import SearchSettings, run_search
    from moetune.search.study.setup import Inputs

    times, last = [], [time.perf_counter()]

    def on_trial(row, done):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    load = (dict(num_requests=4 * concurrency, concurrency=concurrency) if concurrency
            else dict(slo_ttft_ms=1000.0, slo_tpot_ms=50.0))  # 0: the load the SLOs allow, found per trial (P90)
    inputs = Inputs(trace, hardware, scale_model=str(ROOT / "recipes/scale" / config), input_len=1024, output_len=256,
                    scale_routing=scale_routing, engine=engine, **load)
    st = StudySettings("cases", f"sqlite:///{out / 'study.db'}", ("throughput_per_gpu",), "tpe", trials, 0,
                       Constraints(max_ttft_ms=1000.0, max_tpot_ms=50.0), reference_trials=seeded)
    result = run_search(SearchSettings(inputs, st, out, "simulate", space_file=space_file), on_trial)
    return result, times


def _best(rows, seeded: bool) -> str:
    """The best feasible value among the seeded (or the sampled) trials, or '-'."""
    vals = [r.values[0] for r in rows if r.state == "COMPLETE" and r.feasible and r.values
            and (r.seeded is not None) == seeded]
    return f"{max(vals):,.0f}" if vals else "-"


def row(name: str, hw: str, c: int, result, times) -> str:
    w = result.winner
    trial = times[1:] or times  # the first interval holds the setup (trace, scaled model, study)
    t = f"{statistics.median(trial):.2f} / {sorted(trial)[int(0.99 * (len(trial) - 1))]:.2f} ({times[0]:.1f})"
    feasible = sum(r.state == "COMPLETE" and r.feasible for r in result.rows)
    tail = f"{feasible}/{len(result.rows)} | {_best(result.rows, True)} | {_best(result.rows, False)} | {t} |"
    if w is None:
        return f"| {name} | {hw} | {c} | no feasible trial | | | | | | | {tail}"
    m = w.metrics
    lat = m.get("latency_ms") or {}
    p = lambda k, q: (lat.get(k) or {}).get(q, float("nan"))  # noqa: E731
    phases = m.get("phases_ms", {}).get("decode", {})
    ranked = sorted(((k, v) for k, v in phases.items() if k not in ("step", "steps")), key=lambda kv: -kv[1])
    top = ", ".join(f"{k} {v:.1f}" for k, v in ranked[:3])
    c = c or (m.get("detail", {}).get("load") or {}).get("concurrency", "")  # the load found (P90 SLOs)
    return (f"| {name} | {hw} | {c} | {w.deployment.label()} | {w.seeded or 'sampled'} | "
            f"{m['output_tok_s_per_gpu']:,.0f} | {p('ttft', 'p50'):.0f} / {p('ttft', 'p99'):.0f} | "
            f"{p('tpot', 'p50'):.1f} / {p('tpot', 'p99'):.1f} | {m['peak_mem_gb']:.1f} | {top} | {tail}")


# the operating points public deployments describe (their own conditions), priced by the cost model: (what, scale
# config, hardware, deployment knobs, per-GPU decode batches, input, output)
FP8 = dict(quant_low_format="fp8", dense_format="fp8", cuda_graph_max_bs=512)
REFERENCE = [
    ("SGLang large-scale EP (lmsys.org/blog/2025-05-05-large-scale-ep: 96 H100, PD-disaggregated, 2,000-token "
     "inputs): ~2.8k decode output tok/s per H100", "deepseek-v3.json", "16xH100",
     dict(ep_size=16, redundant_experts=32, placement="eplb", overlap=1, **FP8), (128, 256), 2000, 100),
    ("vLLM wide-EP (blog.vllm.ai: DeepSeek on multi-node H200, DeepEP, DBO, EPLB): ~2.2k output tok/s per H200",
     "deepseek-v3.json", "16xH200", dict(ep_size=16, redundant_experts=32, placement="eplb", overlap=1, **FP8),
     (128, 256), 2000, 100),
    ("Mixtral-8x7B on 4×A100 (TP 4): 3,200 output tok/s at 28 ms P50 decode, i.e. ~90 in flight",
     "mixtral-8x7b.json", "A100", dict(tp_size=4, expert_tp_size=4, cuda_graph_max_bs=512), (22,), 1024, 256),
]
A100 = "base: H100\nname: A100\nranks_per_node: 4\nflops: 312e12\nfp8_flops: 0\nmem_bw: 2.039e12\nmem_bytes: 80e9\n" \
       "intra_bw: 300e9\nsource: NVIDIA A100 SXM 80GB datasheet (bf16 312 TFLOP/s, 2.0 TB/s, NVLink 600 GB/s both ways)\n"


def reference_points(trace: str, tmp: Path) -> None:
    """The cost model's estimate at each public deployment's operating point (per-GPU decode batch)."""
    from moetune.search.cost.deployment import Deployment
    from moetune.search.study.setup import Inputs, prepare

    print("\n| public reference | priced as (estimated) | batch / GPU | output tok/s/GPU | decode-only steps: "
          "tok/s/GPU | TPOT P50 ms | GB/GPU |")
    print("|---|---|---|---|---|---|---|")
    (tmp / "a100.yaml").write_text(A100)
    for what, config, hw, knobs, batches, inp, outp in REFERENCE:
        group = max(knobs.get("tp_size", 1), knobs.get("expert_tp_size", 1))  # a TP group's GPUs hold one batch
        d = Deployment(max_num_seqs=max(batches) * group, max_num_batched_tokens=2048, **knobs)
        hardware = str(tmp / "a100.yaml") if hw == "A100" else hw
        for b in batches:
            ranks = d.ep_size * group
            setup = prepare(Inputs(trace, hardware, scale_model=str(ROOT / "recipes/scale" / config), input_len=inp,
                                   output_len=outp, num_requests=2 * b * ranks, concurrency=b * ranks,
                                   warmup_requests=b * ranks // 2))
            m = setup.sim.evaluate(d, setup.workload)
            tpot = (m.latency_ms.get("tpot") or {}).get("p50", m.tpot_ms)
            fits = "" if setup.sim.memory_reason(d) is None else " (over memory)"
            print(f"| {what} | {setup.hardware.max_ranks}×{setup.hardware.name} {d.label()} | {b} | "
                  f"{m.output_tok_s_per_gpu:,.0f} | {m.decode_tok_s / ranks:,.0f} | {tpot:.1f} | "
                  f"{m.peak_mem_gb:.1f}{fits} |", flush=True)


ONE_GPU_CONFIGS = ("mixtral-8x7b.json", "qwen3-30b-a3b.json")  # the cases whose bf16 weights fit one H200


def one_gpu(a, cases: list) -> None:
    """--peer --one-gpu: the 1-GPU replica beside the peer, a static batch and the steady state (peer_steady.py)."""
    from doc_section import loadavg, section, write_section  # benchmarks/, beside this script
    from peer_compare import peer_table
    from peer_steady import steady_table

    tables = {}
    before = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tables["1gpu"] = peer_table(a.trace, cases, a.peer, a.engine, a.engine_version, Path(tmp), one_gpu=True)
        tables["steady"] = steady_table(a.trace, cases, a.peer, a.engine, a.engine_version, Path(tmp))
    if a.write_doc:
        after = loadavg()
        titles = {"1gpu": "the 1-GPU replica beside AIConfigurator, a static batch",
                  "steady": "the 1-GPU replica beside AIConfigurator, the steady state"}
        for key, lines in tables.items():
            name = f"peer-{a.engine}-{key}"
            title = f"{titles[key]}, {a.engine} {a.engine_version or 'current'} tables (estimated)"
            write_section(name, section(name, title, lines, before, after), ROOT / "docs" / "search.md")


def balanced(a, cases: list) -> None:
    """`--balanced`: each case's winner at the SLOs' load, the trace's routing beside balanced (peer_balanced.py)."""
    from doc_section import loadavg, section, write_section  # benchmarks/, beside this script
    from peer_balanced import balanced_table

    before, lines = loadavg(), []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            lines += balanced_table(a.trace, case, a.engine, a.trials or 80, Path(tmp), a.peer) + [""]
    if a.write_doc:
        title = f"the same deployment, balanced routing, {a.engine} tables (estimated)"
        write_section("balanced", section("balanced", title, lines[:-1], before, loadavg()), ROOT / "docs" / "search.md")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[0],
                    help="closed-loop concurrency per replica; 0 (default): the highest meeting TTFT/TPOT P90")
    ap.add_argument("--scale-routing", default=None, help="stats (default) | blocks | loads:FILE")
    ap.add_argument("--no-reference-trials", action="store_true", help="the study without its seeded trials")
    ap.add_argument("--cases", default="0,1,2,3", help="which CASES (indices)")
    ap.add_argument("--reference-points", action="store_true", help="also price the public operating points")
    ap.add_argument("--peer", default=None, help="Python of a venv with aiconfigurator: the peer comparison table")
    ap.add_argument("--engine", default="vllm", help="vllm | sglang: the tables both sides price with")
    ap.add_argument("--engine-version", default=None, help="the tables' engine version (default: current)")
    ap.add_argument("--write-doc", action="store_true", help="with --peer: write the table into its section of "
                    "docs/search.md (<!-- bench: peer-ENGINE -->, benchmarks/doc_section.py)")
    ap.add_argument("--one-gpu", action="store_true", help="with --peer: the 1-GPU replica (TP 1 / EP 1) of the cases "
                    "that fit one GPU, static batches up to 512 and the steady state (benchmarks/peer_steady.py)")
    ap.add_argument("--balanced", action="store_true", help="the README command's winner (and with --peer the "
                    "peer's best) re-priced at the SLOs' load with the trace's and with balanced routing, P90 and P50: "
                    "benchmarks/peer_balanced.py; --write-doc writes the section")
    ap.add_argument("--cross", default=None, help="Python of a venv with aiconfigurator: each tool's winner priced by "
                    "the other (benchmarks/peer_cross.py; --trials per moetune search, default 80 there)")
    ap.add_argument("--measured-only", action="store_true", help="with --cross: moetune's search over the expert "
                    "formats and EP sizes the tables hold (peer_cross.MEASURED): its winner priced from measurements")
    a = ap.parse_args()
    cases = [CASES[int(x)] for x in a.cases.split(",") if x]
    if a.cross:
        from doc_section import loadavg, section, write_section  # benchmarks/, beside this script
        from peer_cross import cross_table

        before = loadavg()
        with tempfile.TemporaryDirectory() as tmp:
            lines = cross_table(a.trace, cases, a.cross, a.engine, a.trials or 80, Path(tmp), a.measured_only)
        if a.write_doc:
            key = f"cross-{a.engine}" + ("-measured" if a.measured_only else "")
            title = (f"each tool's winner priced by the other, {a.engine} tables"
                     + (", moetune's search over measured expert formats" if a.measured_only else "") + " (estimated)")
            write_section(key, section(key, title, lines, before, loadavg()), ROOT / "docs" / "search.md")
        return
    if a.peer and a.one_gpu:
        one_gpu(a, [c for c in cases if c[1] in ONE_GPU_CONFIGS])
        return
    if a.balanced:
        balanced(a, cases)
        return
    if a.peer:
        from doc_section import loadavg, section, write_section  # benchmarks/, beside this script
        from peer_compare import peer_table

        before = loadavg()
        with tempfile.TemporaryDirectory() as tmp:
            lines = peer_table(a.trace, cases, a.peer, a.engine, a.engine_version, Path(tmp))
        if a.write_doc:
            title = f"moetune beside AIConfigurator, {a.engine} {a.engine_version or 'current'} tables (estimated)"
            write_section(f"peer-{a.engine}", section(f"peer-{a.engine}", title, lines, before, loadavg()),
                          ROOT / "docs" / "search.md")
    if not a.trials:
        return
    print("| model | GPUs | concurrency / replica | winner | seed | output tok/s/GPU (est.) | TTFT P50/P99 ms | "
          "TPOT P50/P99 ms | GB/GPU | decode step: top phases ms | feasible / trials | best seeded | best sampled | "
          "trial s median / P99 (setup + first) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i in (int(x) for x in a.cases.split(",") if x):
        name, config, hw = CASES[i]
        for c in a.concurrency:
            with tempfile.TemporaryDirectory() as tmp:
                result, times = run_case(a.trace, config, hw, c, a.trials, Path(tmp) / "out", a.scale_routing,
                                         not a.no_reference_trials)
                print(row(name, hw, c, result, times), flush=True)
    if a.reference_points:
        with tempfile.TemporaryDirectory() as tmp:
            reference_points(a.trace, Path(tmp))


if __name__ == "__main__":
    main()
