"""The steady state the SLOs allow: the highest closed-loop concurrency per replica whose TTFT and
TPOT, at a stated percentile over the steady window's requests (steady.py), meet the SLOs.

Latency grows with the load (more sequences share each step, and a prompt waits longer for its
turn), so "meets the SLOs at concurrency c" is true up to a boundary and false above it. The
boundary is found by probing the simulator (`max_load`; a probe's score is the log of the worst
latency / SLO ratio at the percentile, ≤ 0 met):

1. the first probe: the load last found for a deployment of the same ranks per replica (`hints`),
   else the cap, c = max_num_seqs × data-parallel ranks of one replica (above it the engine holds
   no more sequences; more requests only queue, which adds TTFT and no throughput). Met at the cap:
   the answer is the cap;
2. while no probe is met, the next goes down (latency taken as proportional to c); met nowhere down
   to c = 1: no load meets the SLOs (the trial is infeasible, its figures are those at c = 1);
   while every probe is met, up (at most to the cap);
3. then between the highest c met and the lowest c missed: the boundary interpolated on log c,
   aimed just past it on alternate sides, the geometric midpoint when three probes in a row land
   on one side, until the two are within `REL_TOL` of each other (or adjacent integers); the answer
   is the highest c met. Each probe shrinks the bracket, so the search ends for any monotone score.

Each probe is a closed-loop run of `steady_requests(c)` = 3·c requests, c of them excluded at each
end (steady.py), priced on the trace like any workload; it stops once the c measured requests have
finished (`SimWorkload.drain` False: the drain's own steps set no steady figure). Without SLOs a
GPU search runs `DEFAULT_CONCURRENCY` per replica (setup.py). The objective of a trial is then the
output tokens/s per GPU at the load chosen, over every GPU of the hardware (replicas.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from moetune.search.cost.deployment import Deployment, dp_ranks, gpus
from moetune.search.cost.schedule import SimWorkload

if TYPE_CHECKING:
    from moetune.search.cost.metrics import Metrics

DEFAULT_CONCURRENCY = 256  # closed loop, per replica: a GPU search or simulation given no SLO and no load
REL_TOL = 0.1  # the search stops when the highest c met is within 10 % of the lowest c missed


@dataclass(frozen=True)
class Slo:
    """Per-request limits at a percentile of the steady window's requests (None: not applied)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: float = 90.0

    def misses(self, latency_ms: dict) -> list[str]:
        """Each SLO the latency percentiles (steady.py `latency_ms`) break, in words."""
        key = pct_key(self.percentile)
        out = []
        for name, limit in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms)):
            value = (latency_ms.get(name) or {}).get(key)
            if limit is not None and value is not None and value > limit:
                out.append(f"{name.upper()} P{self.percentile:g} {value:.4g} ms over {limit:g} ms")
        return out


def slo_score(slo: "Slo", latency_ms: dict) -> float:
    """log of the worst (latency at the percentile / its SLO) over the SLOs given: ≤ 0 when every one is met."""
    key = pct_key(slo.percentile)
    ratios = [(latency_ms.get(name) or {}).get(key, math.inf) / limit
              for name, limit in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms)) if limit is not None]
    return math.log(max(max(ratios), 1e-12)) if ratios else -1.0


def pct_key(q: float) -> str:
    """The key of percentile q in a `latency_ms` table: p50, p90, p99, p99.9."""
    return f"p{q:g}"


@dataclass(frozen=True)
class LoadBound:
    """What the bisection found: the highest concurrency met (0: none), the probes in order
    ((c, met) pairs) and how it ended (`at the cap` | `not met at concurrency 1` | `boundary`)."""

    concurrency: int
    probes: tuple[tuple[int, bool], ...]
    ended: str

    @property
    def lowest_missed(self) -> int | None:
        missed = [c for c, ok in self.probes if not ok]
        return min(missed) if missed else None


def max_load(score: Callable[[int], float], cap: int, rel_tol: float = REL_TOL, guess: int | None = None) -> LoadBound:
    """The highest c in [1, cap] with score(c) ≤ 0, for a score that grows with c (module docstring;
    `slo_score`: the log of the worst latency / SLO ratio). Probes `guess` first (the load found for a
    similar deployment), else the cap; then, while every probe is met, above the highest met (`_above`);
    while none is, below the lowest missed (`_below`); then, between the highest met and the lowest
    missed, the boundary interpolated on log c (`_between`), until they are within rel_tol."""
    cap = max(1, int(cap))
    probes: list[tuple[int, bool]] = []
    seen: dict[int, float] = {}
    lo, hi, sides = 0, 0, []  # the highest met and the lowest missed so far (0: none); met / missed of each probe
    c = cap if guess is None else min(cap, max(1, int(guess)))
    while True:
        seen[c] = float(score(c))
        probes.append((c, seen[c] <= 0))
        sides.append(seen[c] <= 0)
        lo, hi = (c, hi) if sides[-1] else (lo, c)
        if not hi:  # every probe met
            if lo == cap:
                return LoadBound(cap, tuple(probes), "at the cap")
            c = _above(seen, lo, cap, rel_tol)
        elif not lo:  # none met
            if hi == 1:
                return LoadBound(0, tuple(probes), "not met at concurrency 1")
            c = _below(seen, hi, rel_tol)
        elif hi - lo <= 1 or hi <= lo * (1 + rel_tol):
            return LoadBound(lo, tuple(probes), "boundary")
        else:
            c = _between(seen, lo, hi, rel_tol, bisect=len(sides) > 3 and sides[-1] == sides[-2] == sides[-3],
                         above=sides[-1])


def _above(seen: dict[int, float], lo: int, cap: int, rel_tol: float) -> int:
    """The next probe above the highest met c = lo (none missed yet): just above it when the first probe
    met close to the boundary (a good guess is then bracketed at once), else the boundary extrapolated on
    log c from the two highest met (slope 1 without two), the step held within ×1.5 .. ×16, at most the cap."""
    met = sorted(c for c, v in seen.items() if v <= 0)
    if len(seen) == 1 and -seen[lo] < math.log(1 + rel_tol):  # the guess met, and close to the boundary
        return min(cap, max(lo + 1, math.ceil(lo * (1 + rel_tol * 0.9))))
    slope = 1.0
    if len(met) > 1 and seen[lo] > seen[met[-2]]:
        slope = max(0.25, (seen[lo] - seen[met[-2]]) / math.log(lo / met[-2]))
    ratio = min(16.0, max(1.5, math.exp(min(-seen[lo] / slope, math.log(16.0)))))
    return min(cap, max(lo + 1, int(lo * ratio)))


def _below(seen: dict[int, float], hi: int, rel_tol: float = REL_TOL) -> int:
    """A guess of the boundary under the lowest missed c = hi: just under it when the first probe missed
    close to the boundary, else latency taken as proportional to c (the slope between the two lowest
    missed where there are two), the step held within ÷1.5 .. ÷16."""
    s_hi = seen[hi]
    if len(seen) == 1 and s_hi < math.log(1 + rel_tol):  # the first probe missed, close to the boundary
        return max(1, min(hi - 1, int(hi / (1 + rel_tol * 0.9))))
    missed = sorted(c for c, v in seen.items() if v > 0)
    slope = 1.0
    if len(missed) > 1 and seen[missed[1]] > s_hi:
        slope = max(0.25, (seen[missed[1]] - s_hi) / math.log(missed[1] / hi))
    ratio = max(1.5, math.exp(min(s_hi / slope, math.log(16.0))))
    return max(1, min(hi - 1, int(hi / ratio)))


def _between(seen: dict[int, float], lo: int, hi: int, rel_tol: float, bisect: bool, above: bool) -> int:
    """The next probe strictly between lo (met) and hi (missed): the score's zero interpolated on log c,
    aimed just above it after a met probe and just under it after a missed one (so that two probes close
    the bracket around it), held inside the middle 80 % of the bracket on the log scale; the geometric
    midpoint after three probes on one side (a bracket interpolation shrinks from one side still halves)."""
    a, b = math.log(lo), math.log(hi)
    if bisect:
        x = (a + b) / 2
    else:
        s_lo, s_hi = seen[lo], seen[hi]
        x = a + (0 - s_lo) * (b - a) / (s_hi - s_lo) if s_hi > s_lo else (a + b) / 2
        x = x + math.log(1 + rel_tol / 2.5 if above else 1 - rel_tol / 2.5)
        x = min(b - 0.1 * (b - a), max(a + 0.1 * (b - a), x))
    return min(hi - 1, max(lo + 1, round(math.exp(x))))


def steady_requests(c: int) -> int:
    """Requests in a closed-loop probe at concurrency c: c excluded at each end (steady.py), c measured."""
    return 3 * c


def at_concurrency(w: SimWorkload, c: int) -> SimWorkload:
    """The closed-loop workload of one probe: w's prompts (cycled) and output length at c per replica."""
    n = steady_requests(c)
    lens = w.prompt_lens * (n // len(w.prompt_lens) + 1)
    return replace(w, prompt_lens=tuple(lens[:n]), mode="concurrency", concurrency=c, warmup=c, find_load=False,
                   drain=False)


def load_cap(d: Deployment) -> int:
    """The most requests one replica's engine holds at once: max_num_seqs on each attention data-parallel
    rank (of every decode worker, disaggregated)."""
    return max(1, d.max_num_seqs * dp_ranks(d) * (d.decode_workers if d.prefill_workers else 1))


def load_key(d: Deployment) -> tuple[int, int]:
    """Deployments whose loads are alike (the hint a search starts from): GPUs per replica, disaggregated or not."""
    return gpus(d) * (d.decode_workers if d.prefill_workers else 1), int(bool(d.prefill_workers))


def evaluate_at_slo(price: Callable[[SimWorkload], "Metrics"], w: SimWorkload, cap: int,
                    hints: dict | None = None, key=None) -> "Metrics":
    """The figures at the highest concurrency meeting w's SLOs (`max_load`; price(workload) → Metrics of
    one probe), with detail `load`: the concurrency, whether the SLOs are met there, the probes and
    how the bisection ended. Not met even at concurrency 1: the figures at 1, `met` False. `hints`: the
    load last found per `key` (the simulator's, by ranks per replica), where the search starts."""
    slo = Slo(w.slo_ttft_ms, w.slo_tpot_ms, w.slo_percentile)
    seen: dict[int, "Metrics"] = {}

    def score(c: int) -> float:
        seen[c] = price(at_concurrency(w, c))
        return slo_score(slo, seen[c].latency_ms)

    cap = min(cap, w.num_requests)  # --num-requests bounds the load searched (setup.py)
    bound = max_load(score, cap, guess=None if hints is None else hints.get(key))
    if hints is not None and bound.concurrency:
        hints[key] = bound.concurrency  # where the search of the next deployment of this shape starts
    c = bound.concurrency or 1
    m = seen[c]
    load = {"concurrency": bound.concurrency, "met": bound.concurrency > 0, "cap": cap, "ended": bound.ended,
            "probes": [list(p) for p in bound.probes], "slo_percentile": w.slo_percentile,
            "missed": slo.misses(m.latency_ms), "lowest_missed": bound.lowest_missed}
    how = (f"the highest concurrency meeting {slo_words(slo)} ({bound.ended})" if bound.concurrency
           else f"{slo_words(slo)} not met even at concurrency 1")
    return replace(m, workload=f"{m.workload}; {how}", detail={**m.detail, "load": load})


def slo_words(slo: Slo) -> str:
    parts = [f"{name} P{slo.percentile:g} ≤ {v:g} ms" for name, v in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms))
             if v is not None]
    return " and ".join(parts)
