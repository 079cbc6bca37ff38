"""The machine's own limits, measured in the same run as the bench, and the work each workload does.

  read limit    GB/s     = STREAM_BYTES of fp32 buffers / median time of `sum()` over them all
                           (torch, all its threads; far larger than the caches; on the CPU the buffers
                           are in huge pages, as the model's weights are: `model/hugepages.py`)
  matmul limit  GFLOP/s  = 2·N³ / median time of an fp32 [N, N] @ [N, N], N = MATMUL_N

  decode  GB/s     = weight bytes the decode steps read / their time
                     bytes per step = dense + Σ_MoE layers (distinct experts routed that step) × expert bytes
                     dense = every weight outside the expert store, the whole LM head included
                     (every decoding row samples) and the embedding table left out (rows are gathered)
  prefill GFLOP/s  = FLOPs / time of one prefill step of S tokens (batch 1)
                     FLOPs = 2·S·dense_params + 2·S·K·3·D·I per MoE layer + attention + 2·D·V (the LM head
                     on the one row that samples); dense_params = matrix weights outside the expert store,
                     embedding and LM head excluded; attention per layer = 4·H·Dh·S(S+1)/2 for GQA (the
                     causal half of QKᵀ and PV), 2·H·(2r + dr)·S(S+1)/2 for MLA's absorbed form
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from moetune.bench.timing import Timing, Work, measure
from moetune.model.hugepages import huge_empty
from moetune.model.dense_quant import packed_weights
from moetune.model.linear import weight_tensors
from moetune.model.transformer import MoETransformer, storage_bytes
from moetune.tensors import distinct, span
from moetune.spec import GQASpec

STREAM_BYTES = 512 * 2**20
MATMUL_N = 2048

FORMULAS = {
    "read limit": "GB/s = bytes summed / time of sum() over 512 MiB of fp32 (CPU: in huge pages, like the weights)",
    "matmul limit": f"GFLOP/s = 2·N³ / time of an fp32 N×N matmul, N = {MATMUL_N}",
    "decode": "GB/s = Σ_steps (dense weight bytes + Σ_layers distinct experts × expert bytes) / time",
    "prefill": "GFLOP/s = (2·S·dense params + 2·S·K·3·D·I·MoE layers + attention + 2·D·V) / time",
}


@dataclass(frozen=True)
class Limits:
    read_gbs: float
    read_timing: Timing
    matmul_gflops: float
    matmul_timing: Timing


def measure_limits(device: torch.device, runs: int = 5) -> Limits:
    """The read-stream and fp32-matmul rates of this machine, now (medians of `runs`)."""
    return LimitSampler(device).limits(runs)


class LimitSampler:
    """The buffers of both limits, kept for the whole bench: `limits()` measures them up front, and
    `beside()` makes a workload take one sample of its limit right before each of its runs, so that
    its rate is set against the machine as it was during its own runs (this VM's read rate moved
    25-55 GB/s within one bench run)."""

    def __init__(self, device: torch.device):
        self.device = device
        n = STREAM_BYTES // 4 // 64
        self._bufs = [_stream_buffer(n, device) for _ in range(64)]  # 64 buffers: no one of them stays cached
        self._a = torch.randn(MATMUL_N, MATMUL_N, device=device)
        self._b = torch.randn(MATMUL_N, MATMUL_N, device=device)
        self.samples: dict[str, list[float]] = {}  # workload → the limit sampled before each of its runs

    def _read(self) -> None:
        for b in self._bufs:
            b.sum()

    def _matmul(self) -> None:
        self._a @ self._b

    def limits(self, runs: int = 5) -> Limits:
        read, mm = measure(self._read, self.device, runs), measure(self._matmul, self.device, runs)
        return Limits(STREAM_BYTES / read.median_s / 1e9, read, 2 * MATMUL_N**3 / mm.median_s / 1e9, mm)

    def sample(self, kind: str) -> float:
        """One timed pass: "read" → GB/s, "matmul" → GFLOP/s."""
        t = measure(self._read if kind == "read" else self._matmul, self.device, runs=1, warmup=0)
        return (STREAM_BYTES / 1e9 if kind == "read" else 2 * MATMUL_N**3 / 1e9) / t.median_s

    def beside(self, work: Work, workload: str, kind: str) -> Work:
        """`work` whose untimed setup first samples `kind` into samples[workload]."""
        def setup():
            self.samples.setdefault(workload, []).append(self.sample(kind))
            return work.setup() if work.setup is not None else None

        return Work(work.fn if work.setup is not None else (lambda _: work.fn()), setup)

    def median(self, workload: str) -> float:
        """The median sample beside `workload`'s runs (0.0 when none was taken)."""
        got = self.samples.get(workload)
        return statistics.median(got) if got else 0.0


def _stream_buffer(n: int, device: torch.device) -> torch.Tensor:
    """n fp32 ones, in the kind of memory the weights live in (huge pages on the CPU)."""
    if device.type == "cpu":
        return huge_empty((n,), torch.float32).fill_(1.0)
    return torch.ones(n, device=device)


def dense_weight_bytes(model: MoETransformer) -> int:
    """Bytes a decode step reads outside the expert store: every dense weight, the whole LM head,
    not the embedding table (storages counted once: a tied LM head is the embedding)."""
    tensors = [t for t in model.dense_tensors() if t is not model.embed] + weight_tensors(model.lm_head)
    return storage_bytes(tensors)


def expert_bytes(model: MoETransformer) -> float:
    """Bytes of one routed expert (w13 + w2, scales included), from the store's first layer."""
    layers = model.experts.layers()
    if not layers:
        return 0.0
    w = model.experts.acquire(layers[0], torch.zeros(1, model.spec.moe.router.top_k, dtype=torch.long))
    return w.nbytes() / w.num_slots


def _params(t: torch.Tensor) -> int:
    """Weights a tensor holds: two per byte of an int4-packed (uint8) one."""
    return t.numel() * (2 if t.dtype == torch.uint8 else 1)


def prefill_flops(model: MoETransformer, S: int) -> float:
    """FLOPs of one prefill step over a fresh prompt of S tokens (see the module docstring)."""
    spec = model.spec
    scales = [w.scale for w in packed_weights(model)]
    skip = {span(t) for t in [model.embed, *weight_tensors(model.lm_head), *scales]}
    dense_params = sum(_params(t) for t in distinct(model.dense_tensors()) if t.dim() >= 2 and span(t) not in skip)
    D, I, K = spec.hidden_size, spec.moe.intermediate_size, spec.moe.router.top_k
    experts = 2 * S * K * 3 * D * I * len(spec.moe_layers)
    pairs = S * (S + 1) / 2
    a = spec.attention
    if isinstance(a, GQASpec):
        attention = 4 * a.num_heads * a.head_dim * pairs
    else:
        attention = 2 * a.num_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) * pairs
    return 2 * S * dense_params + experts + spec.num_layers * attention + 2 * D * spec.vocab_size
