"""`moetune simulate`: one recipe's estimate, phase by phase.

By default the workload is the run's own, run the way `moetune profile` runs it (batches of
`batch_size` requests, one prefill then decodes), so the estimate can be put beside
`moetune profile --recipe R` on this machine; `--serve` prices the recipe's own engine knobs with
every request at once (what `moetune search` evaluates); a steady-state workload (`--concurrency`,
`--request-rate`) always runs the recipe's own engine knobs.
"""

from __future__ import annotations

from dataclasses import replace

from moetune.search.cost.metrics import Metrics
from moetune.search.cost.simulate import priced_instead
from moetune.search.study.deploy_knobs import deploy_reason
from moetune.search.study.setup import Inputs, Setup, prepare
from moetune.search.study.space import Deployment, Limits, from_config, prune


def simulate_recipe(inp: Inputs, as_profile: bool = True, what_if: dict | None = None,
                    explain: bool = False, on_step=None) -> tuple[Setup, Deployment, Metrics]:
    """explain: the simulator keeps the cost model's terms (`setup.sim.terms`, explain.py). on_step:
    progress, on_step(done, total or None) after each priced lock-step."""
    from moetune.errors import MoetuneError

    setup = prepare(inp)
    d, notes = priced_instead(from_config(setup.base, **(what_if or {})))
    setup.not_priced = tuple(notes)
    if as_profile and setup.workload.mode == "burst":
        batch = min(setup.source.batch_size, setup.workload.num_requests)
        tokens = max(d.max_num_batched_tokens, batch * max(setup.workload.prompt_lens))
        d = replace(d, max_num_seqs=batch, max_num_batched_tokens=tokens)
    reason = _invalid(d, setup.limits())
    reason = reason or deploy_reason(setup.sim, d, setup.workload) or setup.sim.spec_reason(d) or setup.sim.memory_reason(d)
    if reason:
        raise MoetuneError(f"this recipe cannot run on {setup.hardware.name}: {reason}")
    if explain:
        setup.sim.terms = {}
    setup.sim.on_step = on_step
    return setup, d, setup.sim.evaluate(d)


def _invalid(d: Deployment, lim: Limits) -> str | None:
    return prune(d, lim)
