"""Expert formats a GPU search may rank: what the serving engines can run, and what the measured
tables can price.

| rule (GPU hardware only) | why |
|---|---|
| a hot/low mix (`quant_low_format` ≠ none, 0 < `quant_hot_fraction` < 1) is pruned | neither vLLM nor SGLang runs per-expert mixed formats in one MoE layer: a fused-MoE layer has one quantization method and one stacked weight tensor of one format for all its experts (vLLM's compressed-tensors picks one scheme per layer from expert 0's projections). moetune's own engine runs it (this-machine searches keep the knob) |
| with the measured tables bound and holding the model's expert op somewhere, an expert op they hold no entry for is pruned (int8 experts; an EP or expert-TP size without rows); a model none of whose shapes they hold keeps every trial (all roofline alike) | the expert op is the largest op of a step: priced by the roofline alone (its datasheet × efficiency constants, ~1.5× optimistic on these shapes) such a trial would outrank measured ones on the constants, not on the deployment |

`gpu_space` fixes the hot fraction at 0 in a GPU search's space unless `--space` names the knob, and with
the tables bound leaves out the expert formats and EP sizes no table prices, so no budget is spent
sampling points the rules prune; the rules still prune a point a `--space`, a recipe or a reference trial
brings, with the reason in the trials table.
"""

from __future__ import annotations

from dataclasses import replace

from moetune.search.cost import op_tables
from moetune.search.cost import tp as tp_costs
from moetune.search.cost.deployment import Deployment
from moetune.search.cost.precision import precision

MIXED = ("quant.hot_fraction {hot:g}: no serving engine runs per-expert mixed formats in one MoE layer "
         "(vLLM, SGLang: one quantization method and one stacked weight tensor per fused-MoE layer); "
         "moetune's own engine does (--hardware this-machine)")


def gpu_space(space, named, sim=None):
    """A GPU search's space: the hot fraction fixed at 0, and with the measured tables bound (sim.tables)
    the expert formats and EP sizes whose expert op no table holds at any value of the other left out
    (int8 experts; Mixtral's EP 3, 5, 6), so the budget is not spent on points `format_reason` prunes.
    A knob `--space` names (`named`: its knob names) keeps its values."""
    values = {k.name: k.values for k in space.knobs}
    if "quant_hot_fraction" not in named and "quant_hot_fraction" in values:
        values["quant_hot_fraction"] = (0.0,)
    if sim is not None and sim.tables is not None and sim.tables.backend is not None and tables_hold_model(sim):
        eps, lows = values.get("ep_size", (1,)), values.get("quant_low_format", ("none",))
        ok = {(r, f): _unmeasured_experts(sim, Deployment(ep_size=r, quant_low_format=f)) is None
              for r in eps for f in lows}
        for name, keep in (("ep_size", tuple(r for r in eps if any(ok[r, f] for f in lows))),
                           ("quant_low_format", tuple(f for f in lows if any(ok[r, f] for r in eps)))):
            if name in values and name not in named and keep:
                values[name] = keep
    return replace(space, knobs=tuple(replace(k, values=values[k.name]) for k in space.knobs))


def format_reason(sim, d: Deployment) -> str | None:
    """Why a GPU search does not rank d's expert format (the rules above), or None (this-machine: None)."""
    if sim.hw.name == "this-machine":
        return None
    if d.quant_low_format != "none" and 0 < d.quant_hot_fraction < 1:
        return MIXED.format(hot=d.quant_hot_fraction)
    if sim.tables is None or sim.tables.backend is None or not tables_hold_model(sim):
        return None
    from moetune.search.cost import disagg

    for x in (disagg.workers(d) if d.prefill_workers else (d,)):
        reason = _unmeasured_experts(sim, x)
        if reason is not None:
            return reason
    return None


def tables_hold_model(sim) -> bool:
    """Whether the tables price this model's expert op at all (some format at some EP size of one node):
    where they hold none of its shapes every trial's experts are roofline alike, and none is pruned."""
    return any(_unmeasured_experts(sim, Deployment(ep_size=r, quant_low_format=f)) is None
               for f in ("none", "fp8", "int4") for r in (1, 2, 4, 8) if r <= sim.hw.max_ranks)


def _unmeasured_experts(sim, d: Deployment) -> str | None:
    d = sim.stored(d)
    m = sim.src.model
    tables = op_tables.bind(sim.tables, m, tp_costs.tp_model(m, d), d, precision(d, sim.hw, sim.b),
                            sim.hw.ranks_per_node)
    if tables is None or tables.experts_measured():
        return None
    fmt = d.quant_low_format if d.quant_low_format != "none" else ("fp8" if m.weight_format == "fp8" else "bf16")
    return (f"experts: the measured tables ({tables.backend.label}) hold no fused-MoE entry for {fmt} experts "
            f"at expert TP {d.expert_tp_size} × EP {d.ep_size}; priced by the roofline alone (~1.5× optimistic on "
            "these shapes) it would outrank measured trials: not ranked")
