"""Search tables (plain rows, rendered by rich, markdown and HTML alike). Every simulated figure
carries "(estimated)" in its column or cell."""

from __future__ import annotations

from moetune.report.tables import Table
from moetune.search.cost.describe import describe
from moetune.search.cost.metrics import Metrics
from moetune.search.study.optuna_study import TrialRow

PHASE_ORDER = ("attention", "router", "permute", "dispatch", "experts", "offload_wait", "combine", "overflow", "unpermute",
               "shared_expert", "dense_mlp", "tp_allreduce", "tp_embed", "tp_gather", "draft", "other", "straggler_wait")


def _tag(m: dict | Metrics | None) -> str:
    if m is None:
        return ""
    est = m.estimated if isinstance(m, Metrics) else m.get("estimated")
    return "estimated" if est else "measured"


def metrics_table(title: str, m: Metrics) -> Table:
    tag = _tag(m)
    rows = [["workload", m.workload, ""]]
    rows += [[k, f"{getattr(m, a):,.4g}", tag] for k, a in (
        ("output tokens/s", "output_tok_s"), ("output tokens/s per rank", "output_tok_s_per_rank"),
        ("prefill tokens/s", "prefill_tok_s"), ("decode tokens/s", "decode_tok_s"), ("TTFT ms (median)", "ttft_ms"),
        ("TPOT ms (median)", "tpot_ms"), ("requests/s", "request_s"), ("goodput requests/s (SLOs met)", "goodput_rps"),
        ("peak memory GB per rank", "peak_mem_gb"))]
    for name, pcts in m.latency_ms.items():
        label = " / ".join(k.upper() for k in pcts)  # P50 / P90 / P99, and the SLOs' own percentile
        rows.append([f"{name.upper()} ms {label}", " / ".join(f"{v:,.4g}" for v in pcts.values()), tag])
    steady = m.detail.get("steady")
    if steady:
        rows.append(["steady state", f"{steady['measured_requests']} requests measured, {steady['excluded_each_end']} "
                                     f"excluded at each end (warm-up, drain)", ""])
    load = m.detail.get("load")
    if load:  # the steady state the SLOs allow (cost/slo_load.py)
        rows.append(["concurrency per replica (found)", load_words(load), tag])
    spec = m.detail.get("speculative")
    if spec:  # cost/speculative.py: the plan priced, its acceptance measured or assumed
        rows.append(["speculative", f"{spec['method']}:{spec['k']}, {spec['tokens_per_verify']:.2f} tokens per verify; "
                                    f"{spec['acceptance']}; {spec['drafter']}", tag])
    for k, v in m.detail.items():
        if isinstance(v, (int, float)):
            rows.append([k, f"{v:,.4g}", tag])
    return Table(title, ["figure", "value", "how"], rows)


def phase_table(title: str, m: Metrics, other: Metrics | None = None, other_name: str = "") -> Table:
    """ms per step by step kind and phase; with `other`, side by side."""
    tag = _tag(m)
    cols = ["kind", "phase", f"ms/step ({tag})"]
    if other is not None:
        cols += [f"{other_name} ms/step ({_tag(other)})"]
    rows = []
    for kind, phases in m.phases_ms.items():
        for p in (*PHASE_ORDER, "step"):
            if p not in phases or (phases[p] == 0 and p != "step"):
                continue
            row = [kind, p, f"{phases[p]:.3f}"]
            if other is not None:
                o = (other.phases_ms.get(kind) or {}).get(p)
                row.append("" if o is None else f"{o:.3f}")
            rows.append(row)
        rows.append([kind, "steps", str(phases.get("steps", ""))] + ([""] if other is not None else []))
    return Table(title, cols, rows, "mean over ranks per lock-step; straggler_wait = time ranks wait for the "
                                    "slowest one inside MoE layers")


def trials_table(rows: list[TrialRow], objectives: tuple[str, ...], top: int = 10, title: str | None = None,
                 quality_note: str = "") -> Table:
    """The best trials; a `dropped` column (copies a capacity dropped: the quality risk) where a trial has one,
    `KL` and `top-1` (the expert mix against full precision, quality.py) where a trial carries them."""
    def has(key: str) -> bool:
        return any(key in ((r.metrics or {}).get("detail") or {}) for r in rows[:top])

    dropped, kl, beside, load = has("dropped_fraction"), has("kl"), has("estimate"), has("load")
    cols = ["trial", "deployment", *(["concurrency"] if load else []), *objectives, "TTFT ms", "TPOT ms", "GB/rank",
            *(["dropped"] if dropped else []), *(["KL nats (measured)", "top-1 (measured)"] if kl else []),
            *(["output tok/s (estimated)", "error"] if beside else []), "figures"]
    out = []
    for r in rows[:top]:
        m = r.metrics or {}
        detail = m.get("detail") or {}
        share = detail.get("dropped_fraction")
        out.append([f"{r.number} (seeded: {r.seeded})" if r.seeded else str(r.number), describe(r.deployment),
                    *([str(trial_concurrency(m))] if load else []), *(f"{v:,.4g}" for v in (r.values or [])),
                    f"{m.get('ttft_ms', 0):.4g}", f"{m.get('tpot_ms', 0):.4g}", f"{m.get('peak_mem_gb', 0):.3g}",
                    *([f"{share:.2%}" if share is not None else ""] if dropped else []),
                    *(_quality_cells(detail) if kl else []), *(_estimate_cells(detail) if beside else []),
                    _tag(m)])
    return Table(title or f"Best {min(top, len(rows))} trials", cols, out, quality_note if kl else "")


def trial_concurrency(m: dict) -> int | str:
    """The closed-loop concurrency per replica a trial ran: found by its load search, else the workload's ('')."""
    load = (m.get("detail") or {}).get("load")
    return load["concurrency"] if load else ""


def load_words(load: dict) -> str:
    """The load search's outcome in words (cost/slo_load.py)."""
    probes = ", ".join(f"{c}{'✓' if ok else '✗'}" for c, ok in load["probes"])
    if not load["met"]:
        return f"none: SLOs at P{load['slo_percentile']:g} not met even at 1 ({'; '.join(load['missed'])}); probes {probes}"
    return f"{load['concurrency']} ({load['ended']}, cap {load['cap']}); probes {probes}"


def _estimate_cells(detail: dict) -> list[str]:
    """A trial measured on an engine: its simulated output tok/s and the error (estimated − measured) / measured."""
    est, err = (detail.get("estimate") or {}).get("output_tok_s"), (detail.get("estimate_error") or {}).get("output_tok_s")
    return ["" if est is None else f"{est:,.4g}", "" if err is None else f"{err:+.1%}"]


def _quality_cells(detail: dict) -> list[str]:
    if "kl" not in detail:
        return ["", ""]
    return [f"{detail['kl']:.4g}", f"{detail['top1_agreement']:.4f}"]


def quality_table(lookup) -> Table:
    """Each low-bit mix measured (or read from the cache) for this study: the quality lookup's points."""
    from moetune.search.study.quality import quality_label

    rows = [[e["format"], f"{e['hot_fraction']:g}", f"{e['kl']:.4g}", f"{e['top1_agreement']:.4f}",
             f"{e['greedy_match']:.3f}", f"{e['perplexity']:.4f} / {e['reference_perplexity']:.4f}",
             e["kernel_backend"], f"{e['seconds']:.2f}"] for e in lookup.entries()]
    return Table("Quality of each low-bit expert mix (measured)", ["low format", "hot fraction", "KL nats", "top-1",
                 "greedy match", "perplexity / reference", "kernel backend", "seconds to measure"], rows,
                 quality_label(lookup) + "; no low format: KL 0, top-1 1 (not run)")


def states_table(rows: list[TrialRow]) -> Table:
    counts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
        if r.reason and r.state != "COMPLETE":
            key = r.reason.split(":")[0][:90]
            reasons[key] = reasons.get(key, 0) + 1
    out = [[s, str(n)] for s, n in sorted(counts.items())]
    out += [[f"  {k}", str(n)] for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:8]]
    return Table("Trials by state (pruned / failed: why)", ["state", "trials"], out)


def remeasure_table(pairs: list[tuple[TrialRow, Metrics | None, str | None]],
                    where: str = "this machine") -> Table:
    cols = ["trial", "deployment", "output tok/s (estimated)", "output tok/s (measured)", "TPOT ms (estimated)",
            "TPOT ms (measured)", "TTFT ms (estimated)", "TTFT ms (measured)", "error"]
    out = []
    for r, m, err in pairs:
        e = r.metrics or {}
        if m is None:
            state = "not run" if (err or "").startswith("not run") else "failed"
            out.append([str(r.number), describe(r.deployment), f"{e.get('output_tok_s', 0):.4g}", state, "", "", "",
                        "", err or ""])
            continue
        rel = (e.get("output_tok_s", 0) - m.output_tok_s) / m.output_tok_s if m.output_tok_s else 0.0
        out.append([str(r.number), describe(r.deployment), f"{e.get('output_tok_s', 0):.4g}", f"{m.output_tok_s:.4g}",
                    f"{e.get('tpot_ms', 0):.4g}", f"{m.tpot_ms:.4g}", f"{e.get('ttft_ms', 0):.4g}",
                    f"{m.ttft_ms:.4g}", f"{rel:+.1%}"])
    return Table(f"Top trials re-measured on {where}: estimated vs measured", cols, out,
                 "error = (estimated − measured) / measured output tokens/s")
