"""Report tables: plain rows built from a run's summary, rendered by markdown, html and rich alike."""

from __future__ import annotations

from moetune.profile.trace import KINDS
from moetune.report.ranks.tables import rank_tables
from moetune.report.ranks.tp import tp_tables
from moetune.report.speculative import STEM, by_batch, speculation_table
from moetune.report.table import Table, mb, num


def _kinds(summary: dict) -> list[str]:
    return [k for k in KINDS if k in summary["kinds"]]


def overview_table(summary: dict) -> Table:
    m, w, p = summary["model"], summary["workload"], summary["parallel"]
    rows = [["model", f"{m['name']} ({m['model_type']}, {m['dtype']}, {m['device']})"],
            ["shape", f"L={m['num_layers']} MoE layers={len(m['moe_layers'])} E={m['E']} K={m['K']} D={m['D']} "
                      f"I={m['I']}" + (f" I_shared={m['I_shared']}" if m["I_shared"] else "")],
            ["workload", f"{w['num_requests']} requests, batch {w['batch_size']}, input_len {w['input_len'] or 'as is'}, "
                         f"output_len {w['output_len']}, warm-up {w['warmup_steps']} steps (excluded)"],
            ["expert parallel", _parallel_line(p)]]
    mesh = p.get("mesh")
    if mesh and mesh["tp_group"] > 1:
        rows.append(["tensor parallel", f"{mesh['tp_group']} ranks per DP group (tp_size {mesh['tp_size']}, "
                                        f"expert_tp_size {mesh['expert_tp_size']}); {mesh['world']} ranks in all"])
    for kind in _kinds(summary):
        k = summary["kinds"][kind]
        rows.append([kind, f"{k['steps']} steps, {k['tokens']} tokens, {k['tokens_per_s']:.0f} tok/s, "
                           f"step median {k['step_ms_median']:.2f} ms (p90 {k['step_ms_p90']:.2f} ms)"])
    return Table("Run", ["", "value"], rows)


def _parallel_line(p: dict) -> str:
    head = f"R={p['ep_size']}, {p['ranks_per_node']} ranks/node, {p['placement']} placement"
    if p.get("redundant_experts"):
        head += f" with {p['redundant_experts']} redundant slots"
    if p.get("ran_ranks"):
        return f"{head}, run on {p['ep_size']} ranks ({p['token_origin']}); ep_* tables: what-if, same placement"
    return f"{head}, {p['token_origin']} (computed, not run)"


def phase_table(summary: dict) -> Table:
    kinds = _kinds(summary)
    per = {k: {p["phase"]: p for p in summary["kinds"][k]["phases"]} for k in kinds}
    order = [p["phase"] for p in summary["kinds"][kinds[0]]["phases"]] if kinds else []
    for k in kinds[1:]:
        order += [p for p in per[k] if p not in order]
    rows = []
    for phase in order:
        row = [phase]
        for k in kinds:
            p = per[k].get(phase)
            row += [f"{p['ms_per_step']:.3f}", f"{100 * p['share']:.1f}%"] if p else ["–", "–"]
        rows.append(row)
    cols = ["phase"] + [c for k in kinds for c in (f"{k} ms/step", f"{k} % of step")]
    return Table("Phase breakdown (all layers, per step)", cols, rows,
                 "`other` = step time − Σ phases (embedding, norms, residual adds, LM head, Python).")


def imbalance_table(summary: dict, top: int = 5) -> Table:
    """The most imbalanced layers; the per-rank balancedness only with more than one EP rank."""
    ranks = summary["parallel"]["ep_size"] > 1
    rows = []
    for kind in _kinds(summary):
        load = summary["kinds"][kind]["load"]
        worst = sorted(load["per_layer"], key=lambda r: -r["expert"]["imbalance"])[:top]
        for r in worst:
            e, rk = r["expert"], r["rank"]
            rows.append([kind, str(r["layer"]), f"{e['imbalance']:.2f}", f"{e['balancedness']:.3f}",
                         *([f"{rk['balancedness']:.3f}"] if ranks else []),
                         f"{e['p50']:.0f}/{e['p95']:.0f}/{e['p99']:.0f}", f"{e['max']:.0f}"])
        mean = load["mean_over_layers"]
        rows.append([kind, "mean of layers", f"{mean['expert_imbalance']:.2f}", f"{mean['expert_balancedness']:.3f}",
                     *([f"{mean['rank_balancedness']:.3f}"] if ranks else []), "", ""])
    columns = ["kind", "layer", "max/mean", "bal. experts", *(["bal. ranks"] if ranks else []), "P50/P95/P99", "max"]
    return Table("Most imbalanced layers", columns, rows,
                 "Token copies per expert" + (" (rank)" if ranks else "") + " over the kind's steps, per layer; "
                 "balancedness (bal.) = mean/max; the mean row averages the per-layer values.")


def hottest_table(summary: dict) -> Table:
    rows = [[kind, str(h["layer"]), str(h["expert"]), str(h["tokens"]), f"{100 * h['share']:.1f}%",
             f"{h['x_fair_share']:.2f}×"] for kind in _kinds(summary)
            for h in summary["kinds"][kind]["load"]["hottest_experts"]]
    return Table("Hottest experts", ["kind", "layer", "expert", "tokens", "share of layer", "× fair share"], rows)


def rates_table(summary: dict) -> Table:
    rows = []
    for kind in _kinds(summary):
        for r in summary["kinds"][kind]["rates"]:
            rows.append([kind, r["phase"], f"{1e3 * r['seconds']:.2f}", f"{r['gflop']:.4f}",
                         num(r["gflops_per_s"], ".2f"), num(r["gbytes_per_s"], ".3f")])
    return Table("Achieved rates per phase", ["kind", "phase", "ms total", "GFLOP", "GFLOP/s", "GB/s"], rows,
                 "GFLOP/s = FLOPs / time, GB/s = bytes / time, summed over steps and layers (formulas below).")


def formulas_table(summary: dict) -> Table:
    seen: dict[str, tuple[str, str]] = {}
    for kind in _kinds(summary):
        for r in summary["kinds"][kind]["rates"]:
            seen.setdefault(r["phase"], (r["flop_formula"], r["byte_formula"]))
    rows = [[phase, f, b] for phase, (f, b) in seen.items()]
    return Table("Work formulas", ["phase", "FLOPs", "bytes"], rows,
                 "T = tokens in the step, rows = T·K copies, active = experts with rows, pairs = causal q·k pairs, "
                 "ctx = cached tokens read, b_w / b_a = weight / activation dtype bytes. Bytes = weights touched "
                 "+ activations read and written (a lower bound).")


def ep_table(summary: dict) -> Table:
    rows = []
    for kind in _kinds(summary):
        ep = summary["kinds"][kind]["ep"]
        for r in ep["per_rank"]:
            rows.append([kind, f"rank {r['rank']}", str(r["copies"]), mb(r["send_bytes"]), mb(r["recv_bytes"])])
    p = summary["parallel"]
    return Table(f"Expert parallel load per rank (R={p['ep_size']}, {p['ranks_per_node']} ranks/node)",
                 ["kind", "rank", "token copies", "sent", "received"], rows,
                 "bytes = copies × D × dtype bytes, dispatch + combine; computed from the recorded routing"
                 + (" (what-if for the run's placement)." if p.get("ran_ranks") else "."))


def locality_table(summary: dict) -> Table:
    rows = []
    for kind in _kinds(summary):
        ep = summary["kinds"][kind]["ep"]
        total = ep["same_rank_bytes"] + ep["intra_node_bytes"] + ep["inter_node_bytes"]
        rows.append([kind] + [f"{mb(ep[k])} ({100 * ep[k] / total:.0f}%)" if total else "0" for k in
                              ("same_rank_bytes", "intra_node_bytes", "inter_node_bytes")])
    p = summary["parallel"]
    where = ("Placement: expert e on rank e // (E/R)" if p["placement"] == "contiguous" and not p.get("redundant_experts")
             else f"Placement: {p['placement']} (physical_to_logical in summary.json)")
    return Table("Expert parallel bytes by locality", ["kind", "same rank", "intra-node", "inter-node"], rows,
                 f"{where}; {p['token_origin']}. Computed from the recorded routing.")


def gemm_table(summary: dict) -> Table:
    """Rows the expert GEMMs computed; the BLOCK_M padding columns only where the triton kernels
    pad (a CUDA device): the CPU kernels and the torch twin compute exactly the rows."""
    padded = str(summary["model"].get("device", "")).startswith("cuda")
    rows = []
    for kind in _kinds(summary):
        k = summary["kinds"][kind]
        pad, cap = k["padding"], k.get("capacity")
        drop = f"{100 * cap['drop_rate']:.2f}% (cf {cap['capacity_factor']})" if cap else "no capacity factor"
        middle = [str(pad["padded_rows"]), f"{100 * pad['waste']:.1f}%"] if padded else []
        rows.append([kind, str(pad["rows"]), *middle, drop])
    middle = ["rows padded to BLOCK_M=64", "padding waste"] if padded else []
    return Table("Expert GEMM rows", ["kind", "rows", *middle, "token drops"],
                 rows, "Drops: copies over capacity ceil(cf·T·K/E) per expert per step and layer.")


def deployment_table(summary: dict) -> Table | None:
    """What the run's deployment did, where it says something: the expert formats (quant), the
    offload cache, speculative decoding and the tokens dropped over capacity (None when the run used
    none of them)."""
    rows = []
    formats = summary.get("quant", {}).get("formats")
    if formats:
        total = sum(formats.values())
        mix = ", ".join(f"{name} {n} ({100 * n / total:.0f}%)" for name, n in sorted(formats.items(), key=lambda kv: -kv[1]))
        rows.append(["expert formats", f"{mix} of {total} layer × expert"])
    off = summary.get("offload", {})
    if off.get("enabled"):
        t, s = off["total"], off["settings"]
        rows.append(["offload", f"hit rate {t['hit_rate']:.2f} ({t['hits']}/{t['hits'] + t['misses']} needed experts "
                                f"resident), prefetch precision {num(t['prefetch_precision'], '.2f')}, fetched "
                                f"{mb(t['bytes_host'] + t['bytes_disk'])}, offload_wait {1e3 * t['offload_wait_s']:.1f} ms; "
                                f"{s['capacity']} resident experts/layer, {s['policy']}, {s['tier']} tier"])
    spec = summary.get("speculative", {})
    if spec.get("enabled"):
        rows.append(["speculative", _speculative_line(spec)])
    for kind in _kinds(summary):
        cap = summary["kinds"][kind].get("capacity")
        if cap:
            rows.append([f"{kind} capacity drops", f"{100 * cap['drop_rate']:.2f}% of copies ({cap['dropped_copies']} "
                                                   f"of {cap['copies']}) over capacity factor {cap['capacity_factor']}"])
    return Table("Deployment", ["", "value"], rows) if rows else None


def _speculative_line(s: dict) -> str:
    ratio = s["experts_per_layer_verify"] / s["experts_per_layer_plain"] if s["experts_per_layer_plain"] else 0.0
    return (f"{s['method']}: acceptance {100 * s['acceptance_rate']:.0f}% ({s['accepted_tokens']}/{s['draft_tokens']} "
            f"drafts), {s['tokens_per_verify']:.2f} tokens per verify, {s['verify_steps']} verify steps; experts per "
            f"MoE layer and step {s['experts_per_layer_verify']:.1f} verify vs {s['experts_per_layer_plain']:.1f} "
            f"plain decode ({ratio:.2f}×), expert bytes per step {mb(s['expert_bytes_per_step_verify'])} vs "
            f"{mb(s['expert_bytes_per_step_plain'])}{_drafter_part(s)}")


def _drafter_part(s: dict) -> str:
    """The drafter's own expert reads inside the verify side (an MTP block's), when it has any."""
    draft = s.get("expert_bytes_per_step_draft", 0.0)  # absent in run dirs written before it was counted
    return f" (of which the drafter {mb(draft)}, {s['draft_experts_per_step']:.1f} experts)" if draft else ""


def memory_table(summary: dict) -> Table:
    m, n = summary["memory"], summary["nvml"]
    rows = [["attention / dense weights", mb(m["dense_weight_bytes"])],
            ["routed expert weights", mb(m["expert_weight_bytes"])],
            ["KV cache (largest batch)", mb(m["kv_cache_bytes"])],
            ["activations (estimate)", f"{mb(m['activation_bytes_estimate'])} = {m['activation_formula']}"]]
    if n.get("available"):
        rows.append(["NVML peak memory used", mb(n.get("peak_memory_used_bytes", 0))])
        rows.append(["NVML mean util / peak power", f"{n.get('mean_gpu_util_pct', 0):.0f}% / {n.get('peak_power_w', 0):.0f} W"])
    else:
        rows.append(["NVML", n.get("reason", "not available")])
    return Table("Memory", ["part", "bytes"], rows)


def offload_table(summary: dict) -> Table:
    """Per MoE layer: the offloading store's cache and prefetch counters over the measured steps."""
    off = summary["offload"]
    rows = []
    for layer, r in sorted(off["layers"].items(), key=lambda kv: int(kv[0])):
        rows.append([layer, f"{100 * r['hit_rate']:.1f}%", f"{r['hits']}/{r['hits'] + r['misses']}",
                     num(r["prefetch_precision"], ".2f"), num(r["prefetch_recall"], ".2f"),
                     mb(r["bytes_host"] + r["bytes_disk"]), f"{1e3 * r['offload_wait_s']:.2f}",
                     mb(r["resident_bytes"])])
    s = off["settings"]
    note = (f"capacity {s['capacity']} experts/layer, {s['policy']} eviction, {s['tier']} tier, prefetch depth "
            f"{s['prefetch_depth']}. Hit rate = needed experts found resident / needed; precision = prefetched "
            "experts used before eviction / prefetched; recall = needed experts resident thanks to a prefetch / "
            "(those + demand fetches).")
    return Table("Expert offloading", ["layer", "hit rate", "hits/needed", "prefetch precision", "prefetch recall",
                                       "fetched", "offload_wait ms", "resident"], rows, note)


def figure_tables(summary: dict) -> dict[str, Table]:
    """Tables shown beside a plot (its stem → the table), not among `all_tables`."""
    return {STEM: speculation_table(summary)} if by_batch(summary) else {}


def all_tables(summary: dict) -> list[Table]:
    deployment = deployment_table(summary)
    ranks = summary["parallel"]["ep_size"] > 1  # at R = 1 the per-rank and locality tables say nothing
    tables = [overview_table(summary), *([deployment] if deployment else []), phase_table(summary),
              imbalance_table(summary), hottest_table(summary),
              gemm_table(summary), *rank_tables(summary), *tp_tables(summary),
              *([ep_table(summary), locality_table(summary)] if ranks else []),
              rates_table(summary), formulas_table(summary), memory_table(summary)]
    if summary.get("offload", {}).get("enabled"):
        tables.append(offload_table(summary))
    return tables
