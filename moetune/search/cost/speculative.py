"""Speculative decoding priced by the simulator (the `speculative` knob: none | ngram:K | draft:DIR:K | mtp:K).

A decode step with speculation verifies j ≤ k draft tokens per sequence (schedule.py: the engine's
lookahead, cut by the step's token budget and near the sequence's last token), so it computes
B·(1 + j) rows through attention (its query rows over the paged KV: (1 + j)·context + (1 + j)(2 + j)/2
pairs), the routers, the experts and the LM head. The experts a verify step wakes are the trace's:
its B·(1 + j) decode rows are the next rows of the recorded decode pool, as for a larger batch —
at batch 1 they are one sequence's successive tokens (few new experts), at batch B they spread
over B sequences' positions (the union grows toward E per layer), which is the MoE trade-off.

Accepted tokens: each drafted token is accepted with probability p given the ones before it were
(the target keeps the longest agreeing prefix), so a verify of j drafts yields
1 + Σ_{i=1..j} p^i tokens per sequence on average (`SpecPlan.tokens`); the schedule carries the
fraction from step to step (a sequence emits ⌊credit⌋ tokens). p is measured where the trace was
profiled with the same speculator (summary.json `speculative`: the accepted prefix per verify and
the mean draft length there give p by `per_token_acceptance`), else `--spec-acceptance`, labelled
assumed in the estimate's detail. Without either the deployment is not priced (`plan_reason`).

The drafter (`draft_seconds`, its own phase line `draft`, added to the step):
- ngram: a suffix lookup in the sequence's own tokens on the host (µs per sequence beside a step of
  ms): not priced, said in the detail;
- mtp:K: per draft token one more decoder layer of the target's shapes at B rows (attention over the
  context, the router and the experts B rows wake in a MoE layer — the trace's last MoE layer —
  the eh projection 2D → D) and the shared LM head on B rows: K passes, one after another;
- draft:DIR:K: per draft token one decode step of the draft checkpoint (its config.json read
  through `sim_model`) at B rows, priced as a small dense-or-MoE model: every dense weight read, the
  experts min(E, B·K) per MoE layer, its KV read, its LM head; K passes. Its prompt prefill is not priced.

Under tensor parallelism the verify step is the group's (its B·(1 + j) rows through the rank's
slices, their all-reduces and the gathered logits of every verify row: tp.py), while the drafter is
replicated as the engine runs it (engine/speculative/mtp.py, draft.py): every rank of the group
computes the whole MTP layer / draft model on the same rows, so the drafter is priced at the whole
model's shapes, not the rank's slices, and adds no collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

METHODS = ("ngram", "draft", "mtp")


@dataclass(frozen=True)
class SpecPlan:
    method: str  # ngram | draft | mtp
    k: int  # the most draft tokens per sequence and step
    p: float  # per-token acceptance (module docstring)
    source: str  # "measured: ..." | "assumed: --spec-acceptance ..."
    path: str | None = None  # draft: the draft checkpoint

    def tokens(self, j: int) -> float:
        """Expected tokens a verify of j drafts yields: the accepted prefix + the target's own one."""
        return 1.0 + expected_prefix(self.p, j)

    def as_dict(self) -> dict:
        return {"method": self.method, "k": self.k, "acceptance_per_token": self.p, "acceptance": self.source,
                "tokens_per_verify": self.tokens(self.k), "drafter": DRAFTER[self.method]}


DRAFTER = {"ngram": "ngram: host-side suffix lookup in the sequence's own tokens, not priced (µs per sequence)",
           "mtp": "mtp: one decoder layer of the target's shapes + the LM head per draft token (phase draft)",
           "draft": "draft model: one decode step of the draft checkpoint per draft token (phase draft); "
                    "its prompt prefill not priced"}


def parse_knob(value: str) -> tuple[str, int, str | None] | None:
    """'none' → None; 'ngram:K' | 'mtp:K' | 'draft:DIR:K' → (method, k, path); else ValueError. An
    adaptive k (':auto' after K, engine/speculative/adaptive.py) is priced at its bound K."""
    if value == "none":
        return None
    method, _, rest = value.removesuffix(":auto").partition(":")
    path, _, k = rest.rpartition(":") if method == "draft" else (None, "", rest)
    if method not in METHODS or not k.isdigit() or not 1 <= int(k) <= 16 or path == "":
        raise ValueError(f"speculative '{value}' is not one of: none, ngram:K, mtp:K, draft:DIR:K (1 <= K <= 16)")
    return method, int(k), path


def expected_prefix(p: float, j: float) -> float:
    """Σ_{i=1..j} p^i (continuous in j: p (1 − p^j) / (1 − p))."""
    if j <= 0 or p <= 0:
        return 0.0
    if p >= 1:
        return float(j)
    return p * (1 - p ** j) / (1 - p)


def per_token_acceptance(accepted_per_verify: float, draft_len: float) -> float:
    """The p whose expected prefix over drafts of `draft_len` tokens is the measured one (bisection)."""
    target = min(max(accepted_per_verify, 0.0), draft_len)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_prefix(mid, draft_len) < target else (lo, mid)
    return (lo + hi) / 2


def measured(summary_spec: dict | None, method: str, path: str | None) -> tuple[float, str] | None:
    """(p, label) from a profile's summary.json `speculative` where it ran the same speculator, else None."""
    if not summary_spec or not summary_spec.get("enabled") or not summary_spec.get("verified"):
        return None
    ran = parse_knob(str(summary_spec["method"]))  # an adaptive k: p from its mean draft length below
    if ran is None or ran[0] != method or (method == "draft" and ran[2] != path):
        return None
    verified = summary_spec["verified"]
    draft_len = summary_spec["draft_tokens"] / verified
    p = per_token_acceptance(summary_spec["accepted_tokens"] / verified, draft_len)
    return p, (f"measured: the trace's {summary_spec['method']} accepted {summary_spec['acceptance_rate']:.3f} of "
               f"{summary_spec['draft_tokens']} drafted tokens (p = {p:.3f} per token)")


def make_plan(value: str, summary_spec: dict | None, assumed: float | None) -> SpecPlan | None:
    """The plan of a knob value: measured acceptance first, else the assumed one; None at 'none'.
    Raises ValueError when neither says the acceptance (`plan_reason` words it)."""
    parsed = parse_knob(value)
    if parsed is None:
        return None
    method, k, path = parsed
    got = measured(summary_spec, method, path)
    if got is None and assumed is None:
        raise ValueError(f"speculative {value} needs an acceptance rate: profile the trace with --speculative "
                         f"{value} (it records acceptance), or pass --spec-acceptance")
    p, label = got if got is not None else (assumed, f"assumed: --spec-acceptance {assumed:g} per token")
    return SpecPlan(method, k, float(p), label, path)


def plan_reason(value: str, summary_spec: dict | None, assumed: float | None) -> str | None:
    try:
        make_plan(value, summary_spec, assumed)
    except ValueError as exc:
        return str(exc)
    return None


def draft_seconds(sim, plan: SpecPlan, st, layer_counts: np.ndarray, draft_model=None, model=None) -> float:
    """The drafter's seconds in one step (the slowest rank's; module docstring). st: the step's
    StepRows (its decode sequences B = st.seqs); layer_counts [E]: copies per expert of B decode
    rows in the trace's last MoE layer (mtp); model: the whole target's SimModel (the MTP layer's
    shapes on every rank of a TP group; None: sim's own)."""
    B = np.asarray(st.spec_seqs, dtype=np.float64)  # [R] sequences that drafted
    if plan.method == "ngram" or not B.any():
        return 0.0
    if plan.method == "mtp":
        return float(plan.k * _mtp_pass(sim, model or sim.src.model, B, st.context, layer_counts).max())
    return float(plan.k * _draft_pass(sim, draft_model, B, st.context).max())


def _mtp_pass(sim, m, B: np.ndarray, context: np.ndarray, layer_counts: np.ndarray) -> np.ndarray:
    """[R] one MTP layer of model m's shapes at B rows: attention, eh projection, router, experts
    woken, LM head."""
    from moetune.search.cost.phase_costs import CALLS

    b = sim.b
    R = len(B)
    per_seq = context / np.maximum(B, 1)  # [R] mean context per drafting sequence
    att = sim.roof(2 * B * m.attn_weights + m.pair_flops * B * per_seq,
                   m.attn_weights * b + B * per_seq * m.kv_elems * b + 2 * B * m.D * b,
                   CALLS["attention"][0], R, "attention")
    proj = sim.roof(2 * B * 2 * m.D * m.D, 2 * m.D * m.D * b, 2, R, "other")
    active = float((layer_counts > 0).sum())
    mlp = sim.roof(6 * B * m.K * m.D * m.I + 2 * B * m.D * m.E,
                   active * m.expert_weights * b + m.E * m.D * b + 3 * m.D * m.I_shared * b,
                   CALLS["experts_fixed"][0] + CALLS["router"][0], R, "experts")
    head = sim.roof(2 * B * m.D * m.V, m.D * m.V * b, CALLS["lm_head"][0], R, "other")
    return att + proj + mlp + head


def _draft_pass(sim, dm, B: np.ndarray, context: np.ndarray) -> np.ndarray:
    """[R] one decode step of the draft model `dm` (a SimModel) at B rows."""
    from moetune.search.cost.phase_costs import CALLS

    b, R = sim.b, len(B)
    per_seq = context / np.maximum(B, 1)
    active = np.minimum(dm.E, B * dm.K) if dm.Lm else 0 * B  # [R] experts a MoE layer wakes
    dense = dm.dense_weights()
    flops = 2 * B * (dense - dm.V * dm.D * (0 if dm.tied else 1)) + 6 * B * dm.K * dm.D * dm.I * dm.Lm \
        + dm.pair_flops * B * per_seq * dm.L
    nbytes = (dense + dm.Lm * active * dm.expert_weights) * b + dm.L * B * per_seq * dm.kv_elems * b
    calls = dm.L * (CALLS["attention"][0] + CALLS["experts_fixed"][0] + CALLS["router"][0]) + CALLS["step"][0]
    return sim.roof(flops, nbytes, calls, R, "other")


def draft_model_of(path: str):
    """The draft checkpoint as the simulator sees it (its config.json)."""
    from moetune.model.registry import resolve_model
    from moetune.model.validate import read_spec
    from moetune.search.cost.simmodel import sim_model

    return sim_model(read_spec(resolve_model(path)), f"draft {path}")


def mtp_layers(model_path: str | None) -> int:
    """config.json's num_nextn_predict_layers of the model (0: no MTP modules, or not known)."""
    import json

    from moetune.model.registry import resolve_model

    if not model_path:
        return 0
    try:
        config = json.loads((resolve_model(model_path) / "config.json").read_text())
    except Exception:  # noqa: BLE001 - a model not found or unreadable: no MTP layers known
        return 0
    return int(config.get("num_nextn_predict_layers") or 0)
