"""Hardware descriptions the simulator prices a deployment on: one rank = one GPU (or, for
`this-machine`, one CPU process).

Built-in node figures and where they come from (peak figures; the simulator multiplies each by an
efficiency, because no kernel reaches peak):

| figure | H100 SXM | H200 SXM | B200 (HGX) | source |
|---|---|---|---|---|
| dense BF16 FLOP/s | 989 T | 989 T | 2.25 P | NVIDIA H100 / H200 datasheets; NVIDIA DGX B200 datasheet (72 PFLOPS FP8 sparse training per 8 GPUs → 2.25 PFLOPS dense BF16 per GPU) |
| dense FP8 FLOP/s | 1,979 T | 1,979 T | 4.5 P | same datasheets (2× BF16; `fp8_flops`, 0 = no fp8 tensor cores: fp8 weights compute at `flops`) |
| HBM bytes/s | 3.35 T | 4.8 T | 8 T | same datasheets |
| HBM capacity | 80 GB | 141 GB | 180 GB | same datasheets (DGX B200: 1,440 GB per 8 GPUs) |
| NVLink per GPU, one direction | 450 GB/s | 450 GB/s | 900 GB/s | NVLink 4: 900 GB/s bidirectional; NVLink 5: 1.8 TB/s bidirectional |
| InfiniBand per GPU, one direction | 50 GB/s | 50 GB/s | 50 GB/s | one ConnectX-7 400 Gb/s NIC per GPU (DGX H100/H200/B200 reference designs) |
| PCIe host link per GPU | 55 GB/s | 55 GB/s | 55 GB/s | PCIe Gen5 x16: 64 GB/s raw per direction, ~55 achievable |

Efficiencies (`gemm_eff` 0.6, `mem_eff` 0.8, `link_eff` 0.7) and the launch / collective
latencies (2 µs per kernel as replayed in a CUDA graph, 20 µs per collective intra-node, 35 µs
across nodes) are assumptions, and so is `eager_launch_s` (6 µs: the CPU's cost of launching one
kernel eagerly — framework dispatch plus cudaLaunchKernel — which bounds a step from below when
its kernels are shorter: a step not replayed from a CUDA graph costs max(GPU time, kernels × 6 µs)
per phase; 0 on `this-machine`, where every torch call is priced by its measured overhead), stated here and in
every `--hardware` file; override them with a YAML file of the same keys.

`this-machine` is measured when asked for (a fraction of a second): fp32 matmul FLOP/s with one
thread and with all threads, memory read bytes/s (a reduction over a buffer larger than the
caches), and the cost of one small torch call (the per-op overhead that dominates small models on a
CPU). Its "link" is gloo over loopback between local processes: an assumed 2 GB/s and 150 µs per
collective (refine with a file).
"""

from __future__ import annotations

import os
import time
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

from moetune.errors import MoetuneError

GB = 1e9


class HardwareError(MoetuneError):
    """An unknown hardware name or a malformed hardware file."""


@dataclass(frozen=True)
class Hardware:
    name: str
    ranks_per_node: int  # GPUs per node (this-machine: CPU cores)
    nodes: int  # nodes available to the deployment
    flops: float  # peak FLOP/s per rank at the compute dtype
    mem_bw: float  # bytes/s per rank (HBM; host RAM on this-machine)
    mem_bytes: float  # memory per rank
    intra_bw: float  # bytes/s per rank, one direction, to ranks of the same node
    inter_bw: float  # bytes/s per rank, one direction, to other nodes
    host_bw: float  # bytes/s from host memory (offloaded experts)
    gemm_eff: float = 0.6
    mem_eff: float = 0.8
    link_eff: float = 0.7
    op_overhead_s: float = 2e-6  # per kernel launch (GPU, replayed in a CUDA graph) / per torch call (CPU)
    fp8_flops: float = 0.0  # peak FLOP/s of fp8 GEMMs (w8a8); 0: none, fp8 weights compute at `flops`
    eager_launch_s: float = 0.0  # CPU seconds to launch one kernel eagerly (no CUDA graph); 0: not priced
    intra_latency_s: float = 20e-6  # per collective inside a node
    inter_latency_s: float = 35e-6  # per collective across nodes
    grouped_experts: bool = True  # fused kernels (GPU): one grouped GEMM per rank, batched attention;
    # False: one call per expert slot and per sequence (moetune's torch path on a CPU)
    act_bytes: int = 2  # activation / weight dtype bytes (bf16 on GPUs, fp32 on CPU)
    threads_one_rank: int = 1  # this-machine: threads a lone rank uses
    flops_one_thread: float = 0.0  # this-machine: FLOP/s of one thread (a rank among several)
    source: str = ""

    @property
    def max_ranks(self) -> int:
        return self.ranks_per_node * self.nodes

    def rank_flops(self, ranks: int) -> float:
        """FLOP/s one rank gets when `ranks` ranks share the machine (this-machine: threads split)."""
        if self.flops_one_thread <= 0 or ranks <= 1:
            return self.flops
        return self.flops_one_thread

    def fp8_speedup(self) -> float:
        """How much faster an fp8 GEMM computes than one at the activation dtype (1: no fp8 tensor cores)."""
        return self.fp8_flops / self.flops if self.fp8_flops > self.flops else 1.0

    def with_nodes(self, nodes: int) -> "Hardware":
        return replace(self, nodes=nodes)

    def as_dict(self) -> dict:
        return asdict(self)


_HOPPER = dict(ranks_per_node=8, nodes=1, flops=989e12, intra_bw=450 * GB, inter_bw=50 * GB, host_bw=55 * GB,
               fp8_flops=1979e12, eager_launch_s=6e-6)
BUILTIN = {
    "H100": Hardware("H100", mem_bw=3.35e12, mem_bytes=80 * GB, source="NVIDIA H100 SXM datasheet", **_HOPPER),
    "H200": Hardware("H200", mem_bw=4.8e12, mem_bytes=141 * GB, source="NVIDIA H200 SXM datasheet", **_HOPPER),
    "B200": Hardware("B200", ranks_per_node=8, nodes=1, flops=2.25e15, mem_bw=8e12, mem_bytes=180 * GB,
                     intra_bw=900 * GB, inter_bw=50 * GB, host_bw=55 * GB, fp8_flops=4.5e15, eager_launch_s=6e-6,
                     source="NVIDIA DGX B200 datasheet"),
}
NAMES = (*BUILTIN, "this-machine")


def get_hardware(name: str, nodes: int | None = None) -> Hardware:
    """A built-in name (H100, H200, B200; `8xH200`, `16xH200` = GPUs), `this-machine`, or a YAML file."""
    count = None
    base = name
    if "x" in name and name.split("x", 1)[0].isdigit():
        count, base = int(name.split("x", 1)[0]), name.split("x", 1)[1]
    if base == "this-machine":
        hw = calibrate()
    elif base.upper() in BUILTIN:
        hw = BUILTIN[base.upper()]
    elif Path(name).suffix in (".yaml", ".yml", ".json") or Path(name).exists():
        hw = read_hardware(Path(name))
    else:
        raise HardwareError(f"unknown hardware '{name}' (choose from: {', '.join(NAMES)}, NxH200, or a YAML file)")
    if count is not None:
        hw = replace(hw, nodes=max(1, -(-count // hw.ranks_per_node)), ranks_per_node=min(count, hw.ranks_per_node))
    return hw.with_nodes(nodes) if nodes else hw


def read_hardware(path: Path) -> Hardware:
    import yaml

    if not path.is_file():
        raise HardwareError(f"hardware file '{path}' does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise HardwareError(f"hardware file '{path}' is not valid YAML: {str(exc).splitlines()[0]}") from None
    known = {f.name for f in fields(Hardware)}
    if not isinstance(data, dict):
        raise HardwareError(f"hardware file '{path}' must be a mapping of figures ({', '.join(sorted(known))})")
    base = data.pop("base", None)
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"hardware file '{path}': unknown key '{unknown[0]}'")
    start = BUILTIN.get(str(base).upper()) if base else None
    if base and start is None:
        raise HardwareError(f"hardware file '{path}': unknown base '{base}' (choose from: {', '.join(BUILTIN)})")
    try:
        values = {k: type(getattr(start, k) if start else _default(k))(v) for k, v in data.items()}
    except (TypeError, ValueError) as exc:
        raise HardwareError(f"hardware file '{path}': {exc}") from None
    values.setdefault("name", path.stem)
    values.setdefault("source", f"file {path}")
    if start is not None:
        return replace(start, **values)
    missing = [f.name for f in fields(Hardware) if f.name not in values and f.default is MISSING]
    if missing:
        raise HardwareError(f"hardware file '{path}' lacks '{missing[0]}' (or give 'base: H100|H200|B200')")
    return Hardware(**values)


def _default(key: str):
    kind = str(next(f for f in fields(Hardware) if f.name == key).type)
    return {"str": "", "int": 0, "bool": False}.get(kind, 0.0)


def calibrate(seconds: float = 0.15) -> Hardware:
    """`this-machine`: microbenchmarks (matmul FLOP/s, read bytes/s, per-call overhead)."""
    import torch

    threads = torch.get_num_threads()
    flops_all = _matmul_flops(seconds)
    torch.set_num_threads(1)
    try:
        flops_one = _matmul_flops(seconds)
    finally:
        torch.set_num_threads(threads)
    cores = os.cpu_count() or 1
    return Hardware(
        "this-machine", ranks_per_node=cores, nodes=1, flops=flops_all, mem_bw=_read_bw(seconds),
        mem_bytes=_available_ram() / 1, intra_bw=2 * GB, inter_bw=2 * GB, host_bw=_copy_bw(seconds / 2),
        gemm_eff=1.0, mem_eff=1.0, link_eff=1.0, op_overhead_s=_call_overhead(), intra_latency_s=150e-6,
        inter_latency_s=150e-6, grouped_experts=False, act_bytes=4, threads_one_rank=threads,
        flops_one_thread=flops_one,
        source=f"measured now: fp32 matmul ({threads} and 1 threads), read bandwidth, copy bandwidth (host tier: "
               "a fetch is a copy), per-call overhead; "
               "gloo link figures assumed")


def _timed(fn, seconds: float) -> float:
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return (time.perf_counter() - start) / max(n, 1)


def _matmul_flops(seconds: float, n: int = 384) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _timed(lambda: a @ b, seconds)


def _read_bw(seconds: float) -> float:
    import torch

    x = torch.ones(16 * 1024 * 1024)  # 64 MiB fp32, larger than the caches
    return x.numel() * 4 / _timed(lambda: x.sum(), seconds)


def _copy_bw(seconds: float) -> float:
    """Bytes/s of a large copy: what fetching an offloaded expert from host memory costs on the CPU
    (the blob is read and the resident slot written)."""
    import torch

    src, dst = torch.ones(16 * 1024 * 1024), torch.empty(16 * 1024 * 1024)  # 64 MiB each
    return src.numel() * 4 / _timed(lambda: dst.copy_(src), seconds)


def _call_overhead() -> float:
    import torch

    a, b = torch.ones(4, 8), torch.ones(8, 4)
    return _timed(lambda: a @ b, 0.05)


def _available_ram() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GB


def collective_latency(ranks: int = 2, rounds: int = 200) -> float:
    """Seconds per small all-to-all between `ranks` local gloo processes (this-machine's EP link), the
    way the dispatcher calls it (one-thread CPU ranks, spawned by the engine's launcher)."""
    import torch

    from moetune.engine.ep_launch import launch

    return float(launch(_PingJob(rounds), ranks, torch.device("cpu"), 60.0))


class _PingJob:
    """Picklable: every rank exchanges one int per peer `rounds` times; rank 0 returns s / exchange."""

    def __init__(self, rounds: int):
        self.rounds = rounds

    def __call__(self, ctx) -> float:
        import torch
        import torch.distributed as dist

        send, recv = torch.ones(ctx.world, dtype=torch.long), torch.empty(ctx.world, dtype=torch.long)
        for _ in range(10):
            dist.all_to_all_single(recv, send)
        start = time.perf_counter()
        for _ in range(self.rounds):
            dist.all_to_all_single(recv, send)
        return (time.perf_counter() - start) / self.rounds
