"""What every simulated trial needs on first use, loaded once before the first trial (a search's setup)
rather than inside it: the compiled kernels (numba, loaded from its disk cache: the scheduler replay,
the slot sums, the copies sent, the offload caches), the trace pools' prefix counts (vector.PoolCounts,
kept on the simulator) and the measured tables' first curves.

It prices two tiny deployments (EP 2; one rank with half its experts offloaded) on a burst of two short
requests of the real model: the same code paths a trial takes, on a workload no trial uses, so no
figure of a trial changes (tests/search/test_sim_speed.py: a study's trial values with and without it
are equal). The SLO load hints (slo_load.py) are left as they were. Without it, the first trial pays
these (1.5–3 s on two cores) and its time stands out of the study's per-trial figures.
"""

from __future__ import annotations

from moetune.search.cost.deployment import Deployment
from moetune.search.cost.schedule import SimWorkload

TINY = SimWorkload((8, 8), 2)  # two requests of 8 prompt tokens, 2 output tokens each, at t = 0


def warm(sim) -> None:
    """Load what the first trial would (module docstring). Only on described hardware: this-machine is
    calibrated when first priced (microbench.py), which is a measurement, not a warm-up."""
    if sim.hw.name == "this-machine":
        return
    hints, on_step = dict(sim.load_hints), sim.on_step
    sim.on_step = None
    try:
        for d in (Deployment(ep_size=min(2, sim.hw.max_ranks)), Deployment(offload_resident_fraction=0.5)):
            sim.evaluate(d, TINY)
    except Exception:  # noqa: BLE001 - best effort: a deployment the model refuses is priced (and reported) by its trial
        pass
    finally:
        sim.load_hints, sim.on_step = hints, on_step
