"""The state of this machine at a moment: how busy it was, the threads this process ran with and
how fast one core read memory. Recorded in env.json (`machine`) when a run is profiled, so that
timings taken from the run can say how far the machine they were taken on is from the one now
(search/calibrate.py puts the comparison in the estimate's label)."""

from __future__ import annotations

import os
import time


def machine_state(probe_s: float = 0.05) -> dict:
    """loadavg: 1/5/15-minute load averages; runnable_others: tasks runnable besides this one right
    now (engine/threads.py); threads: torch's; mem_read_gbs: GB/s of summing a 64 MiB fp32 buffer
    (median of the passes that fit in `probe_s`), a probe of how much of the memory system is free."""
    from moetune.engine.threads import runnable_others

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    import torch

    return {"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": load,
            "runnable_others": runnable_others(), "threads": torch.get_num_threads(),
            "mem_read_gbs": round(mem_read_gbs(probe_s), 2)}


def mem_read_gbs(seconds: float = 0.05) -> float:
    import statistics

    import torch

    x = torch.ones(16 * 1024 * 1024)  # 64 MiB fp32, larger than the caches
    x.sum()
    passes, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds or len(passes) < 3:
        t = time.perf_counter()
        x.sum()
        passes.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(passes) / 1e9


def state_distance(then: dict | None, now: dict) -> str:
    """'load 6.1 then, 1.2 now; memory read 4.1 GB/s then, 9.8 now (0.42×); threads 2 both' — or
    that the trace recorded no machine state (runs profiled before env.json had it)."""
    if not then:
        return "the trace recorded no machine state (profiled before env.json kept it)"
    parts = []
    if then.get("loadavg") and now.get("loadavg"):
        parts.append(f"load {then['loadavg'][0]:.1f} then, {now['loadavg'][0]:.1f} now")
    if then.get("mem_read_gbs") and now.get("mem_read_gbs"):
        ratio = then["mem_read_gbs"] / now["mem_read_gbs"]
        parts.append(f"memory read {then['mem_read_gbs']:.1f} GB/s then, {now['mem_read_gbs']:.1f} now ({ratio:.2f}×)")
    if then.get("threads") is not None:
        same = then["threads"] == now.get("threads")
        parts.append(f"threads {then['threads']} both" if same else f"threads {then['threads']} then, "
                                                                     f"{now.get('threads')} now")
    return "; ".join(parts)
