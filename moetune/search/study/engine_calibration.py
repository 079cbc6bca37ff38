"""`--calibrate-on engine`: the simulator's estimates corrected by what an engine measured.

Every trial measured on an engine (`--evaluator engine`, `--remeasure-on`) appends its estimate and
its measurement to OUT/engine/measured.jsonl (engine_eval.py). A later search into the same --out
(another --study name) with `--calibrate-on engine` fits one factor per phase class on those points:

    prefill = geometric mean over the measured trials of measured TTFT P50 / estimated TTFT P50
    decode  = geometric mean of measured TPOT P50 / estimated TPOT P50

(the client sees the engine's requests, not its steps: TTFT is the prefill class, TPOT the decode
class), and scales every new estimate by them: TTFT × prefill, TPOT × decode, and the output
tokens/s (and per rank / per GPU, requests/s) by the time one request took as estimated,
TTFT + (n − 1)·TPOT, over the same corrected. Only the points of the engine and hardware of this
search count; the factors, their spread and the number of points go in the report's calibration line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from moetune.errors import MoetuneError
from moetune.search.cost.metrics import Metrics

LEDGER = "measured.jsonl"  # under OUT/engine/


@dataclass(frozen=True)
class EngineCorrection:
    engine: str
    hardware: str
    prefill: float  # × estimated TTFT
    decode: float  # × estimated TPOT
    points: int
    spread: float  # the largest |log ratio − log factor| over the points, as a factor (1.0: all agree)

    def label(self) -> str:
        return (f"corrected on {self.points} trial(s) measured on {self.engine} ({self.hardware}): prefill class "
                f"× {self.prefill:.3g}, decode class × {self.decode:.3g} (points within ×{self.spread:.2f} of the fit)")

    def apply(self, m: Metrics, output_len: int) -> Metrics:
        """The estimate with TTFT and TPOT scaled by their class, throughput by the request time's change."""
        before = m.ttft_ms + max(output_len - 1, 0) * m.tpot_ms
        after = m.ttft_ms * self.prefill + max(output_len - 1, 0) * m.tpot_ms * self.decode
        speed = before / after if after > 0 else 1.0
        lat = {name: {p: v * (self.prefill if name == "ttft" else self.decode if name == "tpot" else 1 / speed)
                      for p, v in pcts.items()} for name, pcts in m.latency_ms.items()}
        detail = {**m.detail, "engine_correction": {"prefill": self.prefill, "decode": self.decode,
                                                    "points": self.points, "engine": self.engine}}
        return replace(m, ttft_ms=m.ttft_ms * self.prefill, tpot_ms=m.tpot_ms * self.decode,
                       output_tok_s=m.output_tok_s * speed, output_tok_s_per_rank=m.output_tok_s_per_rank * speed,
                       output_tok_s_per_gpu=m.output_tok_s_per_gpu * speed, request_s=m.request_s * speed,
                       latency_ms=lat, detail=detail)


def record(work_dir: Path, engine: str, hardware: str, label: str, estimate: Metrics, measured: Metrics) -> None:
    """Append one measured trial to the ledger the correction is fitted on."""
    keys = ("ttft_ms", "tpot_ms", "output_tok_s")
    row = {"engine": engine, "hardware": hardware, "deployment": label,
           "estimate": {k: getattr(estimate, k) for k in keys}, "measured": {k: getattr(measured, k) for k in keys}}
    work_dir.mkdir(parents=True, exist_ok=True)
    with (work_dir / LEDGER).open("a") as f:
        f.write(json.dumps(row) + "\n")


def fit(work_dir: Path, hardware: str) -> EngineCorrection:
    """The correction from OUT/engine/measured.jsonl's points on `hardware`; one line when there are none."""
    path = work_dir / LEDGER
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    rows = [r for r in rows if r["hardware"] == hardware and _usable(r)]
    if not rows:
        raise MoetuneError(f"--calibrate-on engine: no trial measured on an engine for {hardware} in {path} (run "
                           "--evaluator engine or --remeasure-on into this --out first, then search under another "
                           "--study)")
    engines = sorted({r["engine"] for r in rows})
    if len(engines) > 1:
        raise MoetuneError(f"--calibrate-on engine: {path} holds trials of {', '.join(engines)}; keep one engine per --out")
    logs = {k: [math.log(r["measured"][m] / r["estimate"][m]) for r in rows]
            for k, m in (("prefill", "ttft_ms"), ("decode", "tpot_ms"))}
    mean = {k: sum(v) / len(v) for k, v in logs.items()}
    spread = max(abs(x - mean[k]) for k, v in logs.items() for x in v)
    return EngineCorrection(engines[0], hardware, math.exp(mean["prefill"]), math.exp(mean["decode"]), len(rows),
                            math.exp(spread))


def _usable(r: dict) -> bool:
    return all(r[side].get(k, 0) > 0 for side in ("estimate", "measured") for k in ("ttft_ms", "tpot_ms"))


@dataclass
class CorrectedEvaluator:
    """The simulate evaluator with an engine correction on every estimate (still labelled estimated)."""

    inner: object  # evaluate.SimulateEvaluator
    correction: EngineCorrection
    output_len: int
    name: str = "simulate"

    def check(self, d):
        return self.inner.check(d)

    def memory_rule(self):
        return self.inner.memory_rule()

    def evaluate(self, d) -> Metrics:
        return self.correction.apply(self.inner.evaluate(d), self.output_len)
