"""What both evaluators return for one deployment (simulate marks every figure as estimated).

Definitions (the same for `measure` and `simulate`), for a burst (all requests of the workload
arrive at once; the steady-state modes are defined in steady.py and replace output tokens/s, TTFT
and TPOT by their steady-state window's figures, TTFT/TPOT as the P50 of the measured requests):
prefill tokens/s = prompt tokens / seconds of the steps that compute prompt tokens; decode tokens/s
= tokens sampled in decode-only steps / their seconds; output tokens/s = tokens generated / time
until the last request finishes; TTFT = median over requests of the time to its first token; TPOT
= median over requests of (finish − first token) / (output tokens − 1); memory = the largest
rank's peak bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

OBJECTIVES = {  # name → (metric attribute, direction)
    "throughput": ("output_tok_s", "maximize"),
    "throughput_per_rank": ("output_tok_s_per_rank", "maximize"),
    "throughput_per_gpu": ("output_tok_s_per_gpu", "maximize"),  # all replicas over all the hardware's GPUs
    "tpot": ("tpot_ms", "minimize"),
    "ttft": ("ttft_ms", "minimize"),
    "memory": ("peak_mem_gb", "minimize"),
    "goodput": ("goodput_rps", "maximize"),  # requests/s meeting both SLOs (steady.py)
}


@dataclass
class Metrics:
    estimated: bool  # True: simulated (every figure is an estimate), False: measured here
    prefill_tok_s: float
    decode_tok_s: float
    output_tok_s: float
    output_tok_s_per_rank: float
    ttft_ms: float
    tpot_ms: float
    peak_mem_gb: float  # largest rank
    ranks: int
    phases_ms: dict = field(default_factory=dict)  # kind → phase → ms per step (mean over ranks)
    detail: dict = field(default_factory=dict)  # imbalance, bytes, stalls, memory parts, low-precision share
    workload: str = "burst"  # how requests arrived (steady.label)
    latency_ms: dict = field(default_factory=dict)  # ttft | tpot | e2e → p50 | p90 | p99
    request_s: float = 0.0  # requests finished per second (steady-state window; the whole run for a burst)
    goodput_rps: float = 0.0  # of which meeting both SLOs
    replicas: int = 1  # copies of the deployment (output_tok_s, request_s and goodput are over all of them)
    output_tok_s_per_gpu: float = 0.0  # over every GPU of the hardware (replicas.py)

    def value(self, objective: str) -> float:
        return float(getattr(self, OBJECTIVES[objective][0]))

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def tag(self) -> str:
        return "estimated" if self.estimated else "measured"
