"""The winner, written out: a recipe YAML (`moetune profile --recipe`, `moetune serve --recipe`), the
equivalent vLLM and SGLang launch flags (where an equivalent exists; said where not), SGLang's
expert-location JSON, the Pareto front and every trial as CSV.
"""

from __future__ import annotations

import csv
from pathlib import Path

import yaml

from moetune.config import RunConfig
from moetune.search.study.space import Deployment, to_config, what_if_values
from moetune.search.study.optuna_study import TrialRow


def recipe_text(cfg: RunConfig, d: Deployment, metrics: dict | None, how: str) -> str:
    """The RunConfig as YAML, then the what-if knobs and the winner's figures as comments."""
    text = f"# moetune search winner ({how}): {d.label()}\n"
    text += yaml.safe_dump(cfg.model_dump(), sort_keys=False)
    extra = {k: v for k, v in what_if_values(d).items()}
    if any(v not in ("none", 0, 0.0, 1.0, "lru") for v in extra.values()):
        text += "# what-if knobs (no recipe key on this branch yet; the estimate assumed them):\n"
        text += "".join(f"#   {k}: {v}\n" for k, v in extra.items())
    if metrics:
        tag = "estimated" if metrics.get("estimated") else "measured"
        text += f"# figures ({tag}; workload: {metrics.get('workload', 'burst')}):\n"
        for k in ("output_tok_s", "output_tok_s_per_rank", "output_tok_s_per_gpu", "prefill_tok_s", "decode_tok_s",
                  "ttft_ms", "tpot_ms", "request_s", "goodput_rps", "peak_mem_gb"):
            if k in metrics:
                text += f"#   {k}: {metrics[k]:.4g} ({tag})\n"
    return text


def vllm_flags(d: Deployment, model: str) -> tuple[str, list[str]]:
    flags = [f"vllm serve {model}", f"--max-num-seqs {d.max_num_seqs}",
             f"--max-num-batched-tokens {d.max_num_batched_tokens}"]
    notes = []
    if d.ep_size > 1:
        flags += [f"--data-parallel-size {d.ep_size}", "--enable-expert-parallel"]
    if d.redundant_experts or d.placement == "eplb":
        flags += ["--enable-eplb", f"--eplb-config '{{\"num_redundant_experts\": {d.redundant_experts}}}'"]
        notes.append("vLLM's EPLB rebalances from live load; it does not read a fixed placement file")
    if d.placement == "round_robin":
        flags.append("--expert-placement-strategy round_robin")
    if d.quant_low_format != "none":
        notes.append("per-expert mixed precision (hot experts full, cold ones low-bit): no vLLM flag")
    if d.offload_resident_fraction < 1:
        notes.append("expert offloading with prefetch: no vLLM equivalent (--cpu-offload-gb offloads whole weights)")
    return " \\\n  ".join(flags), notes


def sglang_flags(d: Deployment, model: str, location_json: str | None) -> tuple[str, list[str]]:
    flags = [f"python -m sglang.launch_server --model-path {model}", f"--max-running-requests {d.max_num_seqs}",
             f"--chunked-prefill-size {d.max_num_batched_tokens}"]
    notes = []
    if d.ep_size > 1:
        flags += [f"--tp-size {d.ep_size}", f"--ep-size {d.ep_size}", "--enable-dp-attention",
                  f"--dp-size {d.ep_size}"]
    if d.redundant_experts:
        flags.append(f"--ep-num-redundant-experts {d.redundant_experts}")
    if location_json and (d.ep_size > 1 or d.redundant_experts):
        flags.append(f"--init-expert-location {location_json}")
    if d.quant_low_format != "none":
        notes.append("per-expert mixed precision: no SGLang flag")
    if d.offload_resident_fraction < 1:
        notes.append("expert offloading with prefetch: no SGLang equivalent")
    notes.append("--max-num-batched-tokens has no exact SGLang twin; --chunked-prefill-size is the closest")
    return " \\\n  ".join(flags), notes


def write_placement_files(d: Deployment, model, loads, path: Path) -> tuple[Path, Path] | None:
    """The winner's placement (model: SimModel) as our JSON at `path` and SGLang's
    {"physical_to_logical_map": [L][P]} beside it; None when every expert sits once on one rank."""
    from moetune.moe.placement import make_placement, write_placement

    if d.ep_size == 1 and not d.redundant_experts:
        return None
    p = make_placement(d.placement, model.E, d.ep_size, list(model.moe_layers), d.redundant_experts,
                       loads if d.placement == "eplb" else None)
    sglang = write_placement(p, path, loads, model.L)
    return path, sglang


def write_csv(rows: list[TrialRow], path: Path, objectives: tuple[str, ...]) -> None:
    keys = sorted({k for r in rows for k in r.params})
    metric_keys = ("output_tok_s", "output_tok_s_per_rank", "prefill_tok_s", "decode_tok_s", "ttft_ms", "tpot_ms",
                   "output_tok_s_per_gpu", "request_s", "goodput_rps", "peak_mem_gb")
    tails = ("ttft", "tpot", "e2e")  # P99 ms of each (steady.py)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "state", *keys, "deployment", *objectives, *metric_keys,
                    *(f"{t}_p99_ms" for t in tails), "workload", "figures", "feasible", "reason"])
        for r in rows:
            m = r.metrics or {}
            tag = "" if not m else ("estimated" if m.get("estimated") else "measured")
            lat = m.get("latency_ms") or {}
            w.writerow([r.number, r.state, *(r.params.get(k, "") for k in keys), r.deployment.label(),
                        *((r.values or [""] * len(objectives))), *(_fmt(m.get(k)) for k in metric_keys),
                        *(_fmt((lat.get(t) or {}).get("p99")) for t in tails), m.get("workload", ""),
                        tag, r.feasible, r.reason or ""])


def _fmt(x) -> str:
    return "" if x is None else f"{x:.6g}"


def write_winner(out: Path, base: RunConfig, d: Deployment, metrics: dict | None, how: str, model, loads,
                 run_dir: Path | None = None) -> dict:
    """Recipe, flags, placement and SGLang JSON of the winner into `out`; returns their paths.
    `run_dir`: the trace's run directory (a quant hot fraction ranks experts by its loads)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    placed = write_placement_files(d, model, loads, (out / "winner.placement.json").resolve())
    placement_file = str(placed[0]) if placed and d.placement == "eplb" else None
    cfg = to_config(base, d, placement_file, loads=str(Path(run_dir).resolve()) if run_dir else None)
    (out / "winner.yaml").write_text(recipe_text(cfg, d, metrics, how))
    files["recipe"] = out / "winner.yaml"
    name = base.model.path or model.name
    vllm, vnotes = vllm_flags(d, name)
    sgl, snotes = sglang_flags(d, name, str(placed[1]) if placed else None)
    (out / "winner.vllm.sh").write_text(vllm + "\n" + "".join(f"# {n}\n" for n in vnotes))
    (out / "winner.sglang.sh").write_text(sgl + "\n" + "".join(f"# {n}\n" for n in snotes))
    files.update(vllm=out / "winner.vllm.sh", sglang=out / "winner.sglang.sh")
    if placed:
        files.update(placement=placed[0], sglang_location=placed[1])
    return files
