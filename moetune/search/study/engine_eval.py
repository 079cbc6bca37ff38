"""The `engine` evaluator: each trial measured on a real serving engine (vLLM, SGLang), its
simulated estimate kept beside the measurement.

For a deployment: price it (the estimate), write its launch file exactly as `moetune search` emits a
winner's (emit.launch_text; the file that runs is the file a winner gets, byte for byte), start it
under engine_server.py (own process group, dies with moetune), wait for /health, send two untimed
warm-up requests, then the trial's workload through bench-serve's client (the profile's prompts as
token ids at the priced lengths, all at once / at the priced concurrency / at the priced Poisson
rate), stop the engine and wait until its port and GPU memory are free.

Measured: output tokens/s (and per GPU, over the GPUs the estimate counts), TTFT / TPOT / end-to-end
P50 / P90 / P99, requests/s and goodput. A lost or refused request fails the trial. Not measurable
from the client, so left at the estimate and said so in the detail: prefill / decode tokens/s and
peak memory. detail["estimate"] holds the simulated figures, detail["estimate_error"] the relative
error (estimated − measured) / measured of each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from moetune.search.cost.metrics import Metrics
from moetune.search.cost.schedule import SimWorkload
from moetune.search.cost.simulate import Simulator, unpriced_reason
from moetune.search.study.emit import ESTIMATE_BESIDE as COMPARED, launch_text
from moetune.search.study.engine_calibration import record
from moetune.search.study.engine_server import ENGINES, EngineChoice, EngineCommand, EngineFailed, EngineServer
from moetune.search.study.launch import ServeTarget, world
from moetune.search.study.repair import MemoryRule
from moetune.search.study.space import Deployment

WARMUP_REQUESTS = 2


def launch_of(engine: str, d: Deployment, target: ServeTarget):
    from moetune.search.study.sglang_launch import sglang_launch
    from moetune.search.study.vllm_launch import vllm_launch

    return vllm_launch(d, target) if engine == "vllm" else sglang_launch(d, target, None)


def engine_launch_text(engine: str, d: Deployment, target: ServeTarget) -> str:
    """The launch file of `d` as `moetune search` writes a winner's (emit.write_winner): not re-priced."""
    return launch_text(launch_of(engine, d, target), target, d.label(), None)


def make_engine_evaluator(choice: EngineChoice | None, sim: Simulator, workload: SimWorkload,
                          target_of: Callable[[Deployment], ServeTarget], device: str, prompts: tuple,
                          work_dir: Path) -> "EngineEvaluator":
    """The evaluator, every mistake said in one line before any trial: no --engine, an engine that is not
    installed, one that cannot serve on this device, a bad port or timeout."""
    from moetune.errors import MoetuneError
    from moetune.search.study.engine_server import resolve_engine
    from moetune.search.study.launch_env import cpu_refusal

    if choice is None or choice.engine not in ENGINES:
        raise MoetuneError(f"--evaluator engine and --remeasure-on need --engine {' | '.join(ENGINES)}")
    if not 0 <= choice.port < 65536:
        raise MoetuneError(f"--engine-port {choice.port} is not a TCP port (1..65535; 0 or none: a free one)")
    if choice.health_timeout_s <= 0:
        raise MoetuneError("--engine-timeout-s must be above 0")
    why = cpu_refusal(choice.engine) if device == "cpu" else None
    if why:
        raise MoetuneError(why)
    cmd = EngineCommand(choice.engine, resolve_engine(choice.engine, choice.cmd), choice.health_timeout_s,
                        port=choice.port, gpu_free_timeout_s=choice.gpu_free_timeout_s)
    return EngineEvaluator(sim, workload, prompts, cmd, target_of, work_dir, sim.hw.name,
                           name=f"engine {choice.engine}")


@dataclass
class EngineEvaluator:
    sim: Simulator
    workload: SimWorkload
    prompts: tuple  # token ids of each request (measure.request_prompts)
    cmd: EngineCommand
    target_of: Callable[[Deployment], ServeTarget]  # run.serve_target: what a winner d's launch serves
    work_dir: Path  # OUT/engine: one directory per run (launch file, engine log), measured.jsonl
    hardware: str = "this-machine"
    name: str = "engine"
    runs: list = field(default_factory=list)  # the run directories, in order

    def check(self, d: Deployment) -> str | None:
        why = unpriced_reason(d) or self.sim.spec_reason(d) or self.sim.memory_reason(d)
        if why:
            return why
        target = self.target_of(d)
        launch = launch_of(self.cmd.engine, d, target)
        if launch.unsupported:  # measured as something else than priced: no estimate to set beside it
            return f"{self.cmd.engine} has no flag for: {'; '.join(launch.unsupported)}"
        if launch.instances > 1 or len(launch.nodes) > 1:
            return f"{self.cmd.engine}: one instance on one node is measured (this point needs {launch.instances} " \
                   f"instances × {len(launch.nodes)} nodes)"
        if target.device == "cpu" and world(d) > 1:
            return f"{self.cmd.engine}'s CPU build is measured with one rank here (this point has {world(d)})"
        return None

    def memory_rule(self) -> MemoryRule:
        return MemoryRule(lambda d: self.sim.memory(d).total, self.sim.memory_reason)

    def evaluate(self, d: Deployment) -> Metrics:
        estimate = self.sim.evaluate(d, self.workload)
        run = self._run_dir()
        launch_file = run / f"launch.{self.cmd.engine}.sh"
        launch_file.write_text(engine_launch_text(self.cmd.engine, d, self.target_of(d)))
        server = EngineServer(self.cmd, launch_file, run / "engine.log")
        try:
            server.start()
            server.wait_healthy()
            results, duration = self._bench(server.url, d.replicas)
            if not server.alive():
                raise EngineFailed(f"the engine exited during the load: {server.last_line()}")
        except EngineFailed as exc:
            server.stop()
            raise EngineFailed(f"{exc} [log: {run / 'engine.log'}]") from None
        server.stop()
        m = measured_metrics(results, duration, self.workload, estimate, d,
                             {"engine": self.cmd.engine, "launch_file": str(launch_file),
                              "engine_log": str(run / "engine.log")})
        record(self.work_dir, self.cmd.engine, self.hardware, d.label(), estimate, m)  # --calibrate-on engine's points
        return m

    def _run_dir(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        k = len([p for p in self.work_dir.iterdir() if p.name.startswith("run-")])
        while (self.work_dir / f"run-{k:03d}").exists():
            k += 1
        path = self.work_dir / f"run-{k:03d}"
        path.mkdir()
        self.runs.append(path)
        return path

    def _bench(self, url: str, replicas: int) -> tuple[list, float]:
        """Warm-up (untimed), then the trial's workload; every request must be answered."""
        from moetune.bench.loadgen import LoadSettings, run_prompts

        w = self.workload
        warm = LoadSettings(url, WARMUP_REQUESTS, None, 1, output_len=4, prompt_chars=None)
        run_prompts(warm, [list(self.prompts[0][:8])] * WARMUP_REQUESTS)
        # the workload is per deployment replica; one engine instance serves all of them (vLLM's -dp)
        settings = LoadSettings(url, w.num_requests * replicas, w.rate * replicas if w.mode == "rate" else None,
                                w.concurrency * replicas if w.mode == "concurrency" else None,
                                output_len=w.output_len, prompt_chars=None, seed=w.seed)
        results, duration, _ = run_prompts(settings, [list(p) for p in self.prompts] * replicas)
        bad = [r for r in results if r.outcome != "answered"]
        if bad:
            raise EngineFailed(f"{len(bad)} of {len(results)} requests {bad[0].outcome} ({bad[0].status}: "
                               f"{(bad[0].error or '').strip()[:160]})")
        short = [r for r in results if r.output_tokens != w.output_len]
        if short:
            raise EngineFailed(f"{len(short)} requests generated {short[0].output_tokens} tokens, not "
                               f"{w.output_len} (the engine ignored ignore_eos / max_tokens)")
        return results, duration


def measured_metrics(results: list, duration: float, w: SimWorkload, estimate: Metrics, d: Deployment,
                     detail: dict) -> Metrics:
    """Metrics of an engine run (module docstring), the estimate in detail["estimate"]."""
    import numpy as np

    ttft = [r.ttft * 1e3 for r in results]
    tpot = [(r.latency - r.ttft) * 1e3 / (r.output_tokens - 1) for r in results if r.output_tokens > 1]
    e2e = [r.latency * 1e3 for r in results]

    def pct(xs: list) -> dict:
        return {f"p{p}": float(np.percentile(xs, p)) for p in (50, 90, 99)} if xs else {}

    out_tok = sum(r.output_tokens for r in results) / duration
    gpu_share = estimate.output_tok_s_per_gpu / estimate.output_tok_s if estimate.output_tok_s else 1.0
    ok = [r for r in results if _meets(r, w)]
    m = Metrics(estimated=False, prefill_tok_s=estimate.prefill_tok_s, decode_tok_s=estimate.decode_tok_s,
                output_tok_s=out_tok, output_tok_s_per_rank=out_tok / max(1, estimate.ranks),
                ttft_ms=pct(ttft).get("p50", 0.0), tpot_ms=pct(tpot).get("p50", 0.0),
                peak_mem_gb=estimate.peak_mem_gb, ranks=estimate.ranks, workload=estimate.workload,
                latency_ms={"ttft": pct(ttft), "tpot": pct(tpot), "e2e": pct(e2e)},
                request_s=len(results) / duration, goodput_rps=len(ok) / duration if _has_slo(w) else 0.0,
                replicas=estimate.replicas, output_tok_s_per_gpu=out_tok * gpu_share)
    est = estimate.as_dict()
    m.detail = {**detail, "lost": 0, "requests": len(results), "duration_s": duration,
                "estimate": {k: est[k] for k in COMPARED},
                "estimate_error": {k: (est[k] - getattr(m, k)) / getattr(m, k) for k in COMPARED if getattr(m, k)},
                "estimate_phases_ms": estimate.phases_ms,
                "not_measured": "prefill_tok_s, decode_tok_s and peak_mem_gb are the estimate's (the client cannot "
                                "see them)"}
    return m


def _has_slo(w: SimWorkload) -> bool:
    return w.slo_ttft_ms is not None and w.slo_tpot_ms is not None


def _meets(r, w: SimWorkload) -> bool:
    if not _has_slo(w):
        return False
    tpot = (r.latency - r.ttft) * 1e3 / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
    return r.ttft * 1e3 <= w.slo_ttft_ms and tpot <= w.slo_tpot_ms
