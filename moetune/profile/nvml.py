"""NVML sampler: a background thread that samples the GPU (memory, utilisation, power, clocks).

Without an NVIDIA GPU (or without the driver library) it does nothing and says why in `reason`.
"""

from __future__ import annotations

import threading
import time

import pandas as pd

COLUMNS = ["t", "memory_used_bytes", "gpu_util_pct", "mem_util_pct", "power_w", "sm_clock_mhz"]


class NvmlSampler:
    def __init__(self, device_index: int = 0, interval_s: float = 0.05):
        self.device_index = device_index
        self.interval_s = interval_s
        self.available = False
        self.reason = ""
        self.device_name = ""
        self._rows: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None

    def __enter__(self) -> "NvmlSampler":
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception as exc:  # no library, no driver or no GPU: not an error for profiling
            self.reason = f"no NVIDIA GPU / NVML ({type(exc).__name__}: {str(exc) or 'unavailable'})"
            return self
        self.available = True
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            import pynvml

            pynvml.nvmlShutdown()

    def _loop(self) -> None:
        import pynvml

        start = time.perf_counter()
        while not self._stop.is_set():
            try:
                self._rows.append(self._sample(pynvml, time.perf_counter() - start))
            except pynvml.NVMLError as exc:  # e.g. power readings unsupported: keep what we have
                self.reason = f"NVML sampling stopped: {exc}"
                return
            self._stop.wait(self.interval_s)

    def _sample(self, pynvml, t: float) -> dict:
        h = self._handle
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        return {
            "t": t,
            "memory_used_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).used),
            "gpu_util_pct": float(util.gpu),
            "mem_util_pct": float(util.memory),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
        }

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self._rows, columns=COLUMNS)

    def summary(self) -> dict:
        if not self.available:
            return {"available": False, "reason": self.reason}
        df = self.table()
        if df.empty:
            return {"available": True, "device": self.device_name, "samples": 0}
        return {"available": True, "device": self.device_name, "samples": len(df),
                "peak_memory_used_bytes": int(df.memory_used_bytes.max()),
                "mean_gpu_util_pct": float(df.gpu_util_pct.mean()), "peak_power_w": float(df.power_w.max()),
                "mean_sm_clock_mhz": float(df.sm_clock_mhz.mean())}
