"""NVML sampler: says why when there is no GPU; samples in a thread when NVML answers (faked here)."""

import sys
import time
import types

from moetune.profile.nvml import COLUMNS, NvmlSampler


def fake_pynvml() -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = type("NVMLError", (Exception,), {})
    m.NVML_CLOCK_SM = 1
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlDeviceGetName = lambda h: b"Fake H200"
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=70, memory=30)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=5 * 2**30)
    m.nvmlDeviceGetPowerUsage = lambda h: 350_000  # mW
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1980
    return m


def test_samples_in_the_background(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    with NvmlSampler(interval_s=0.001) as sampler:
        time.sleep(0.05)
    table = sampler.table()
    assert list(table.columns) == COLUMNS and len(table) > 2
    summary = sampler.summary()
    assert summary["device"] == "Fake H200" and summary["peak_power_w"] == 350.0
    assert summary["peak_memory_used_bytes"] == 5 * 2**30


def test_without_nvml_it_says_why(monkeypatch):
    broken = fake_pynvml()

    def fail():
        raise broken.NVMLError("NVML Shared Library Not Found")

    broken.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    with NvmlSampler() as sampler:
        pass
    assert sampler.summary() == {"available": False, "reason": sampler.reason}
    assert "Not Found" in sampler.reason and sampler.table().empty
