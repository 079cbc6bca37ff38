"""The engine evaluator through its real code path, with a stand-in engine (fake_engine.py: a real
HTTP server with vLLM's command line) started from the emitted launch files: a healthy study, an
engine that is never healthy, one that exits early, one that rejects a flag, a port already taken,
an engine that is not installed, and moetune killed by SIGKILL mid-trial (no process left; the
resumed study measures the interrupted trial again)."""

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moetune.search.study.engine_guard import group_members
from moetune.search.study.engine_server import EngineChoice
from moetune.search.study.optuna_study import StudySettings
from moetune.search.study.run import SearchSettings, run_search
from moetune.search.study.setup import Inputs
from tests.cli_run import assert_one_line_error, moetune

FAKE = Path(__file__).with_name("fake_engine.py")
SPACE = ("ep_size: 1\nredundant_experts: 0\nplacement: contiguous\nmax_num_seqs: [2, 4]\n"
         "max_num_batched_tokens: 1024\nquant_low_format: none\nquant_hot_fraction: 0\n"
         "offload_resident_fraction: 1\noffload_prefetch_depth: 0\noffload_eviction: lru\n"
         "dense_format: none\nkv_format: none\noverlap: 0\n")


@pytest.fixture
def fake_vllm(tmp_path):
    """The stand-in as an executable (what --engine-cmd names)."""
    path = tmp_path / "fake-vllm"
    path.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = {str(FAKE)!r}\n"
                    f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
    path.chmod(0o755)
    return str(path)


def _settings(run_dir, tmp_path, choice, n=2, space=SPACE):
    (tmp_path / "space.yaml").write_text(space)
    out = tmp_path / "out"
    st = StudySettings("e", f"sqlite:///{out / 'study.db'}", ("throughput",), "grid", n, 0)
    return SearchSettings(Inputs(str(run_dir), "this-machine", num_requests=4, output_len=5), st, out, "engine",
                          str(tmp_path / "space.yaml"), engine=choice)


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_a_healthy_engine_measures_every_trial_beside_its_estimate(run_dir, tmp_path, fake_vllm, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_PIDS", str(tmp_path / "pids"))
    result = run_search(_settings(run_dir, tmp_path, EngineChoice("vllm", fake_vllm, health_timeout_s=60)))
    done = [r for r in result.rows if r.state == "COMPLETE"]
    assert len(done) == 2 and {r.deployment.max_num_seqs for r in done} == {2, 4}, [(r.state, r.reason) for r in result.rows]
    for r in done:
        m = r.metrics
        assert m["estimated"] is False and m["output_tok_s"] > 0 and m["detail"]["lost"] == 0
        assert set(m["latency_ms"]) == {"ttft", "tpot", "e2e"} and set(m["latency_ms"]["e2e"]) == {"p50", "p90", "p99"}
        assert m["detail"]["estimate"]["output_tok_s"] > 0  # the simulated estimate kept beside it
        err = m["detail"]["estimate_error"]["output_tok_s"]
        assert err == pytest.approx((m["detail"]["estimate"]["output_tok_s"] - m["output_tok_s"]) / m["output_tok_s"])
        ran = Path(m["detail"]["launch_file"]).read_text()
        assert f"--max-num-seqs {r.deployment.max_num_seqs}" in ran and '--port "$PORT"' in ran
        # this machine has no GPU: the CPU build's settings, and the checkpoint without moetune's MTP file
        assert 'VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"' in ran and "VLLM_CPU_OMP_THREADS_BIND" in ran
        assert str(tmp_path / "out" / "served-model") in ran
    out = tmp_path / "out"
    assert (out / "served-model" / "model.safetensors").is_file() and not (out / "served-model" / "mtp.safetensors").exists()
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert all(float(x["output_tok_s_estimated"]) > 0 and x["output_tok_s_error"] for x in rows)
    winner = result.winner.metrics["detail"]["launch_file"]
    assert Path(winner).read_bytes() == (out / "winner.vllm.sh").read_bytes()  # the file that ran, byte for byte
    md = (out / "report.md").read_text()
    assert "Estimated vs measured on vllm" in md and "estimate_vs_measured.png" in md
    assert "| yes |" in md.split("The winner's launch file is the one measured")[1]
    assert (out / "estimate_vs_measured.png").read_bytes()[:4] == b"\x89PNG"
    assert len(_pids(tmp_path / "pids")) == 4 and not _alive(_pids(tmp_path / "pids"))  # 2 runs × (server, helper)


@pytest.mark.parametrize("mode, env, expected", [
    ("never healthy", {"FAKE_ENGINE_MODE": "never_healthy"}, "was not healthy within 2 s"),
    ("exits early", {"FAKE_ENGINE_MODE": "exit"}, "out of memory while allocating the KV cache"),
    ("rejects a flag", {"FAKE_ENGINE_REJECT": "--max-num-seqs"}, "unrecognized arguments: --max-num-seqs"),
])
def test_an_engine_that_does_not_serve_is_a_failed_trial_with_its_log(run_dir, tmp_path, fake_vllm, monkeypatch,
                                                                       mode, env, expected):
    for k, v in {**env, "FAKE_ENGINE_PIDS": str(tmp_path / "pids")}.items():
        monkeypatch.setenv(k, v)
    result = run_search(_settings(run_dir, tmp_path, EngineChoice("vllm", fake_vllm, health_timeout_s=2), n=1))
    (row,) = result.rows
    assert row.state == "FAIL" and "EngineFailed" in row.reason and expected in row.reason, row.reason
    assert "\n" not in row.reason
    assert not _alive(_pids(tmp_path / "pids"))


def test_a_port_already_taken_is_a_failed_trial(run_dir, tmp_path, fake_vllm):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_search(_settings(run_dir, tmp_path, EngineChoice("vllm", fake_vllm, port, 30), n=1))
    (row,) = result.rows
    assert row.state == "FAIL" and f"port {port} on 127.0.0.1 is already taken" in row.reason


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH (fake_nvidia_smi.py: the real one cannot run on this GPU-less machine)
    reporting the fake engine's pids as holding GPU memory; returns the file its answers go to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE.with_name('fake_nvidia_smi.py')} \"$@\"\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENGINE_PIDS", str(tmp_path / "pids"))
    monkeypatch.setenv("FAKE_GPU_LOG", str(tmp_path / "gpu.log"))
    return tmp_path / "gpu.log"


def test_the_trial_waits_until_the_stopped_engine_s_gpu_memory_is_free(run_dir, tmp_path, fake_vllm, fake_gpu,
                                                                        monkeypatch):
    monkeypatch.setenv("FAKE_GPU_HOLD_S", "1.5")  # the driver frees a dead process's memory 1.5 s late
    result = run_search(_settings(run_dir, tmp_path, EngineChoice("vllm", fake_vllm, health_timeout_s=60), n=1))
    (row,) = result.rows
    assert row.state == "COMPLETE", row.reason
    answers = fake_gpu.read_text().splitlines()
    assert any(a.endswith("(dead ones too)") for a in answers), answers  # asked while the memory was still held
    assert answers[-1] == "free"  # ... and went on only once it was free
    died = [float(line.split()[1]) for line in (tmp_path / "pids.died").read_text().splitlines()]
    assert len(died) == 2 and not _alive(_pids(tmp_path / "pids"))


def test_gpu_memory_that_is_never_freed_is_a_failed_trial_not_a_hang(run_dir, tmp_path, fake_vllm, fake_gpu,
                                                                     monkeypatch):
    monkeypatch.setenv("FAKE_GPU_HOLD_S", "never")
    t0 = time.monotonic()
    choice = EngineChoice("vllm", fake_vllm, health_timeout_s=60, gpu_free_timeout_s=1.0)
    result = run_search(_settings(run_dir, tmp_path, choice, n=1))
    (row,) = result.rows
    assert row.state == "FAIL" and "\n" not in row.reason, row.reason
    assert "GPU memory was not freed within 1 s after it stopped" in row.reason and "per nvidia-smi" in row.reason
    held = {int(p) for p in row.reason.split("still held by pid ")[1].split(" per")[0].split(", ")}
    assert held and held <= set(_pids(tmp_path / "pids")), row.reason
    assert time.monotonic() - t0 < 60 and not _alive(_pids(tmp_path / "pids"))


def test_an_engine_that_is_not_installed_is_one_line(run_dir, tmp_path):
    r = moetune("search", "--trace", str(run_dir), "--evaluator", "engine", "--engine", "vllm", "--engine-cmd",
                str(tmp_path / "no-vllm"), "--n-trials", "1", "--out", str(tmp_path / "o"))
    assert_one_line_error(r, "--engine vllm", "is not an executable", "install_vllm_cpu.sh")
    assert not (tmp_path / "o").exists()
    r = moetune("search", "--trace", str(run_dir), "--evaluator", "engine", "--out", str(tmp_path / "o"))
    assert_one_line_error(r, "--evaluator engine needs --engine")


def _search_cmd(run_dir, tmp_path, fake_vllm):
    (tmp_path / "space.yaml").write_text(SPACE)
    return [sys.executable, "-m", "moetune", "search", "--trace", str(run_dir), "--evaluator", "engine",
            "--engine", "vllm", "--engine-cmd", fake_vllm, "--engine-timeout-s", "60", "--space",
            str(tmp_path / "space.yaml"), "--sampler", "grid", "--n-trials", "2", "--num-requests", "4",
            "--output-len", "5", "--grace-s", "2", "--out", str(tmp_path / "out")]


def test_sigkill_mid_trial_leaves_no_engine_and_the_resume_measures_it_again(run_dir, tmp_path, fake_vllm):
    pids = tmp_path / "pids"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAKE_ENGINE_PIDS": str(pids), "FAKE_ENGINE_MODE": "slow",
           "FAKE_ENGINE_TOKEN_S": "2"}
    search = subprocess.Popen(_search_cmd(run_dir, tmp_path, fake_vllm), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    logs = tmp_path / "out" / "engine"
    while time.monotonic() < deadline:  # mid-trial: the engine serves the (slow) load
        if any("serving on" in p.read_text() for p in logs.glob("run-*/engine.log")):
            break
        assert search.poll() is None
        time.sleep(0.2)
    time.sleep(1.0)
    groups = {os.getpgid(p) for p in _alive(_pids(pids))}
    assert groups and search.pid not in groups  # the engine has a process group of its own
    search.send_signal(signal.SIGKILL)
    search.wait()
    deadline = time.monotonic() + 30
    while (_alive(_pids(pids)) or any(group_members(g) for g in groups)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(_pids(pids)) and not any(group_members(g) for g in groups)
    time.sleep(3)  # past --grace-s: the interrupted trial's heartbeat is stale
    env["FAKE_ENGINE_MODE"] = "ok"
    resumed = subprocess.run(_search_cmd(run_dir, tmp_path, fake_vllm), env=env, capture_output=True, text=True,
                             timeout=400)
    assert resumed.returncode == 0, resumed.stderr
    rows = list(csv.DictReader((tmp_path / "out" / "trials.csv").open()))
    done = [r for r in rows if r["state"] == "COMPLETE"]
    assert sorted(int(r["max_num_seqs"]) for r in done) == [2, 4]
    interrupted = [r for r in rows if r["state"] == "FAIL"]
    assert len(interrupted) == 1 and "heartbeat lost" in interrupted[0]["reason"]
    assert interrupted[0]["max_num_seqs"] in {r["max_num_seqs"] for r in done}  # measured again
    assert len(list(logs.glob("run-*"))) == 3  # the interrupted run, then both trials measured
    assert not _alive(_pids(pids))


def test_calibrate_on_engine_corrects_later_estimates_by_what_the_engine_measured(run_dir, tmp_path, fake_vllm):
    import json
    import math
    from dataclasses import replace

    from moetune.search.study.engine_calibration import fit

    run_search(_settings(run_dir, tmp_path, EngineChoice("vllm", fake_vllm, health_timeout_s=60)))
    out = tmp_path / "out"
    points = [json.loads(x) for x in (out / "engine" / "measured.jsonl").read_text().splitlines()]
    assert len(points) == 2 and {p["engine"] for p in points} == {"vllm"}
    correction = fit(out / "engine", "this-machine")
    expected = math.exp(sum(math.log(p["measured"]["tpot_ms"] / p["estimate"]["tpot_ms"]) for p in points) / 2)
    assert correction.decode == pytest.approx(expected) and correction.points == 2
    base = _settings(run_dir, tmp_path, None, n=1)
    plain = run_search(replace(base, evaluator="simulate", study=replace(base.study, study="plain")))
    inputs = replace(base.inputs, calibrate_on="engine")
    fixed = run_search(replace(base, evaluator="simulate", inputs=inputs, study=replace(base.study, study="fixed")))
    assert "corrected on 2 trial(s) measured on vllm" in fixed.calibrated_on
    p, f = plain.rows[0].metrics, fixed.rows[0].metrics
    assert f["estimated"] is True and f["tpot_ms"] == pytest.approx(p["tpot_ms"] * correction.decode)
    assert f["ttft_ms"] == pytest.approx(p["ttft_ms"] * correction.prefill)
    assert "corrected on 2 trial(s)" in (out / "report.md").read_text()
    with pytest.raises(Exception, match="no trial measured on an engine"):
        fit(tmp_path / "nowhere", "this-machine")


def test_remeasure_on_measures_the_top_simulated_trials_and_ranks_them_first(run_dir, tmp_path, fake_vllm):
    from dataclasses import replace

    base = _settings(run_dir, tmp_path, EngineChoice("vllm", fake_vllm, health_timeout_s=60))
    result = run_search(replace(base, evaluator="simulate", remeasure_on=2))
    engine_pairs = [(row, m) for row, m, err in result.remeasured if m is not None and "estimate" in m.detail]
    assert len(engine_pairs) == 2 and all(row.metrics["estimated"] for row, _ in engine_pairs)
    assert result.winner.metrics["estimated"] is False  # the ranking by measured values where they exist
    best = max(m.output_tok_s for _, m in engine_pairs)
    assert result.winner.values[0] == pytest.approx(best)
    out = tmp_path / "out"
    md = (out / "report.md").read_text()
    assert "Estimated vs measured on vllm" in md and "| yes |" in md.split("is the one measured")[1]
    assert (out / "estimate_vs_measured.png").is_file()
    ran = Path(result.winner.metrics["detail"]["launch_file"]).read_bytes()
    assert ran == (out / "winner.vllm.sh").read_bytes()


def test_remeasure_on_mistakes_are_one_line(run_dir, tmp_path):
    r = moetune("search", "--trace", str(run_dir), "--remeasure-on", "tgi", "2", "--out", str(tmp_path / "o"))
    assert_one_line_error(r, "--remeasure-on 'tgi'")
    r = moetune("search", "--trace", str(run_dir), "--remeasure-on", "vllm", "2", "--evaluator", "measure",
                "--out", str(tmp_path / "o"))
    assert_one_line_error(r, "use --evaluator simulate")
