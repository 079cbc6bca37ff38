"""The winner, written out: a recipe YAML (`moetune profile --recipe`, `moetune serve --recipe`), the
equivalent vLLM and SGLang launch flags (where an equivalent exists; said where not), SGLang's
expert-location JSON, the Pareto front and every trial as CSV.
"""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path
from typing import Callable

import yaml

from moetune.config import RunConfig
from moetune.search.cost.describe import describe
from moetune.search.cost.op_tables import cost_sentence
from moetune.search.study.disagg_launch import disagg_text
from moetune.search.study.flag_table import LAUNCHERS, PLACEHOLDERS, check, flag_table
from moetune.search.study.launch import Launch, ServeTarget, shell_args, world
from moetune.search.study.launch_env import launch_env
from moetune.search.study.optuna_study import TrialRow
from moetune.search.study.quality import QUALITY_DETAIL
from moetune.search.study.sglang_launch import sglang_launch
from moetune.search.study.space import NEUTRAL, Deployment, to_config, what_if_values
from moetune.search.study.vllm_launch import vllm_launch
from moetune.search.study.tables import trial_concurrency


def recipe_text(cfg: RunConfig, d: Deployment, metrics: dict | None, how: str) -> str:
    """The RunConfig as YAML, then the what-if knobs and the winner's figures as comments."""
    text = f"# moetune search winner ({how}): {d.label()}\n# deployment: {describe(d)}\n"
    knobs = textwrap.wrap(", ".join(f"{k}={v}" for k, v in d.as_dict().items()), 96)
    text += "# every knob of the point:\n" + "".join(f"#   {line}\n" for line in knobs)
    text += yaml.safe_dump(cfg.model_dump(), sort_keys=False)
    extra = {k: v for k, v in what_if_values(d).items()}
    if any(v not in ("none", 0, 0.0, 1.0, "lru", NEUTRAL["cuda_graph_max_bs"]) for v in extra.values()):
        text += "# what-if knobs (no recipe key on this branch yet; the estimate assumed them):\n"
        text += "".join(f"#   {k}: {v}\n" for k, v in extra.items())
    if metrics:
        tag = "estimated" if metrics.get("estimated") else "measured"
        text += f"# figures ({tag}; workload: {metrics.get('workload', 'burst')}):\n"
        for k in ("output_tok_s", "output_tok_s_per_rank", "output_tok_s_per_gpu", "prefill_tok_s", "decode_tok_s",
                  "ttft_ms", "tpot_ms", "request_s", "goodput_rps", "peak_mem_gb"):
            if k in metrics:
                text += f"#   {k}: {metrics[k]:.4g} ({tag})\n"
        detail = metrics.get("detail") or {}
        text += f"#   {cost_sentence(detail)}\n" if "cost_source" in detail else ""
        if "kl" in detail:  # --max-kl / --quality: the expert mix's quality (quality.py)
            text += (f"#   kl: {detail['kl']:.4g} nats, top1_agreement: {detail['top1_agreement']:.4f} (measured by "
                     "moetune eval on the trace's model: see quality.json)\n")
    return text


def launch_text(launch: Launch, target: ServeTarget, label: str, as_run: dict | None) -> str:
    """The engine's launch as a shell file: header (what is not as priced, the re-priced figures),
    then one command per node of a replica, each checked with the engine's own parser."""
    table = flag_table(launch.engine)
    env = launch_env(launch.engine, target.device)
    nodes = [argv + env.args if k == 0 else argv for k, argv in enumerate(launch.nodes)]
    for argv in nodes:
        why = check(launch.engine, [PLACEHOLDERS.get(a, a) for a in argv])
        if why:  # the launchers build only flags from the table: a bug, not a user mistake
            raise RuntimeError(f"emitted {table.title()} command does not parse: {why}")
    n = len(launch.nodes)
    gpus = world(launch.as_run) if n == 1 else target.gpus_per_node
    lines = ["#!/usr/bin/env bash", f"# {table.title()} launch of the moetune search winner: {label}",
             f"# every command parses with {table.title()}'s own argument parser "
             f"(moetune/search/study/flag_tables/{launch.engine}.json)",
             f"# one replica: {n} node(s) × {gpus} {target.gpu}" +
             (f"; run it {launch.instances} times (one per replica, each on its own GPUs) behind a load balancer"
              if launch.instances > 1 else "")]
    if launch.speculative:
        lines.append(f"# speculative decoding: priced (engine.speculative {launch.speculative}: the verify steps' "
                     "rows and experts, the drafter, the accepted tokens per step; the figures here include it)")
    if launch.unsupported or launch.speculative_gaps:
        lines.append(f"# NOT as priced — no {table.title()} flag for:")
        lines += [f"#   - {u}" for u in launch.unsupported]
        lines += [f"#   - speculative decoding (priced with moetune's speculator, so its acceptance may differ "
                  f"here; not re-priced): {u}" for u in launch.speculative_gaps]
    lines.append(_as_run_line(table.title(), launch, as_run))
    notes = launch.notes + env.notes
    lines += ["# notes:", *(f"#   - {x}" for x in notes)] if notes else []
    lines.append("set -euo pipefail")
    if "$MODEL_DIR" in " ".join(launch.nodes[0]):
        lines.append('MODEL_DIR="${MODEL_DIR:?the model: its Hugging Face id or a local directory}"')
    if "$DRAFT_DIR" in " ".join(launch.nodes[0]):
        lines.append('DRAFT_DIR="${DRAFT_DIR:?the draft model (same tokenizer as the model): its id or directory}"')
    if n > 1:
        lines += ['HEAD_IP="${HEAD_IP:?the address of node 0}"',
                  f'NODE_RANK="${{NODE_RANK:?this node: 0..{n - 1}}}"']
    lines += env.lines
    for k, argv in enumerate(nodes):
        cmd = LAUNCHERS[launch.engine] + " " + shell_args(argv)
        lines += ["", f'if [ "$NODE_RANK" = {k} ]; then', cmd, "fi"] if n > 1 else ["", cmd]
    return "\n".join(lines) + "\n"


def _as_run_line(title: str, launch: Launch, as_run: dict | None) -> str:
    if not launch.unsupported:
        return f"# as priced: {title} runs the winner's knobs"
    if as_run is None:
        return f"# as {title} will run it: not re-priced (a measured search)"
    if as_run.get("reason"):
        return f"# as {title} will run it ({launch.as_run.label()}): it cannot run there — {as_run['reason']}"
    tag = "estimated" if as_run.get("estimated") else "measured"
    figs = ", ".join(f"{k} {as_run[k]:.4g}" for k in ("output_tok_s", "ttft_ms", "tpot_ms", "peak_mem_gb") if k in as_run)
    return f"# as {title} will run it ({tag}, re-priced without them: {launch.as_run.label()}): {figs}"


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
    details = [k for k in (*CAPACITY_DETAIL, *QUALITY_DETAIL, "measured_share")
               if any(k in ((r.metrics or {}).get("detail") or {}) for r in rows)]
    beside = ESTIMATE_BESIDE if any("estimate" in ((r.metrics or {}).get("detail") or {}) for r in rows) else ()
    sources = any("cost_source" in ((r.metrics or {}).get("detail") or {}) for r in rows)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        load = any(((r.metrics or {}).get("detail") or {}).get("load") for r in rows)  # the load found (slo_load.py)
        w.writerow(["trial", "state", *keys, "deployment", *(["concurrency"] if load else []), *objectives,
                    *metric_keys, *(f"{t}_p99_ms" for t in tails), *details,
                    *(f"{k}_{x}" for k in beside for x in ("estimated", "error")),
                    *(["cost_source"] if sources else []), "workload", "figures", "feasible", "seeded", "reason"])
        for r in rows:
            m = r.metrics or {}
            tag = "" if not m else ("estimated" if m.get("estimated") else "measured")
            lat, detail = m.get("latency_ms") or {}, m.get("detail") or {}
            est, err = detail.get("estimate") or {}, detail.get("estimate_error") or {}
            w.writerow([r.number, r.state, *(r.params.get(k, "") for k in keys), r.deployment.label(),
                        *([trial_concurrency(m)] if load else []),
                        *((r.values or [""] * len(objectives))), *(_fmt(m.get(k)) for k in metric_keys),
                        *(_fmt((lat.get(t) or {}).get("p99")) for t in tails), *(_fmt(detail.get(k)) for k in details),
                        *(_fmt(x) for k in beside for x in (est.get(k), err.get(k))),
                        *([detail.get("cost_source", "")] if sources else []),
                        m.get("workload", ""), tag, r.feasible, r.seeded or "", r.reason or ""])


# a capacity's copies (the quality risk of drop; buffer's second pass) and the expert mix's KL / top-1 agreement
# (quality.py, --quality or --max-kl): columns only where a trial has them
CAPACITY_DETAIL = ("dropped_fraction", "buffered_fraction")
# a trial measured on an engine keeps its simulated estimate (engine_eval.py): each figure estimated, and the
# error (estimated − measured) / measured, beside the measured columns
ESTIMATE_BESIDE = ("output_tok_s", "output_tok_s_per_gpu", "ttft_ms", "tpot_ms", "request_s")


def _fmt(x) -> str:
    return "" if x is None else f"{x:.6g}"


def write_winner(out: Path, base: RunConfig, d: Deployment, metrics: dict | None, how: str, model, loads,
                 target: ServeTarget, price: Callable[[Deployment], dict | None], run_dir: Path | None = None,
                 engine: str = "vllm") -> dict:
    """Recipe, launch files, placement and SGLang JSON of the winner into `out`; returns their paths, the
    primary launch file (`launch`: `engine`'s, --engine: the engine whose tables priced it) first.
    `price`: the figures of a deployment as an engine will run it (None: not re-priced);
    `run_dir`: the trace's run directory (a quant hot fraction ranks experts by its loads)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    placed = write_placement_files(d, model, loads, (out / "winner.placement.json").resolve())
    placement_file = str(placed[0]) if placed and d.placement == "eplb" else None
    cfg = to_config(base, d, placement_file, loads=str(Path(run_dir).resolve()) if run_dir else None)
    (out / "winner.yaml").write_text(recipe_text(cfg, d, metrics, how))
    files["recipe"] = out / "winner.yaml"
    files["launch"] = out / f"winner.{engine}.sh"
    order = (engine, *(e for e in LAUNCH_ENGINES if e != engine))
    detail = (metrics or {}).get("detail") or {}
    for name in order:
        if d.prefill_workers:  # disaggregated prefill/decode: worker and router commands (disagg_launch.py)
            text = disagg_text(name, d, target, d.label(), metrics)
        else:
            launch = (vllm_launch(d, target) if name == "vllm"
                      else sglang_launch(d, target, str(placed[1]) if placed else None))
            text = launch_text(launch, target, d.label(), price(launch.as_run) if launch.unsupported else None)
        head = text.split("\n", 2)
        # a simulated winner on GPU hardware says which tables priced it (a measured one's file stays the one that ran)
        lines = [primary_line(name, engine), f"# {cost_sentence(detail)}"] if "cost_source" in detail else []
        files[name] = out / f"winner.{name}.sh"
        files[name].write_text("\n".join([*head[:2], *lines, *head[2:]]))
    if placed:
        files.update(placement=placed[0], sglang_location=placed[1])
    return files


LAUNCH_ENGINES = ("vllm", "sglang")


def primary_line(name: str, engine: str) -> str:
    """Whether a launch file is the primary one (--engine's) or the other engine's, in words."""
    if name == engine:
        return f"# primary launch file (--engine {engine}: the engine whose op tables priced the winner)"
    return (f"# the other engine's launch: the winner was priced on {engine}'s op tables (--engine {engine}); "
            f"re-run the search with --engine {name} to price it on {name}'s")
