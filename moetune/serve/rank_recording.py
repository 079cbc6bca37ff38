"""Expert-distribution recording (`/v1/expert_distribution/*`) on a server over R ranks.

`start` attaches a RankProfiler (moetune/profile/ranks/probe.py, the one `moetune profile --ep-size R`
uses) to every rank between two lock-steps, beside each rank's live load window; `stop` detaches
them; `dump` gathers every rank's record on rank 0 and writes the run directory with the writer of
`moetune profile --ep-size R` (`finish_rank_run`): the same files, the measured `rank_steps` /
`rank_moe` tables, the what-if for the served placement.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from moetune.errors import MoetuneError
from moetune.serve.protocol import APIError
from moetune.serve.recording import Recorder, cuda_index, live_settings


class RankRecorder(Recorder):
    """The Recorder's routes over every rank (worker: a RanksWorker)."""

    async def start(self) -> dict:
        if self.recording:
            raise APIError(409, "a recording is already running; stop or dump it first", code="recording_running")
        from moetune.profile.nvml import NvmlSampler

        await asyncio.wrap_future(self.worker.call_all(_attach))
        self.profiler = True  # the profilers live on the ranks
        self.nvml = NvmlSampler(cuda_index(self.worker.side.dp.model.device)).__enter__()
        self.recording, self.sequences, self.generated = True, 0, 0
        return {"recording": True}

    async def stop(self) -> dict:
        if not self.recording:
            raise APIError(409, "no recording is running; POST /v1/expert_distribution/start first",
                           code="not_recording")
        steps = await asyncio.wrap_future(self.worker.call_all(_detach))
        self.nvml.__exit__(None, None, None)
        self.recording = False
        self.steps = steps[0]
        return {"recording": False, "steps": self.steps}

    async def dump(self, name: str | None) -> dict:
        if self.recording:
            await self.stop()
        if self.profiler is None or not getattr(self, "steps", 0):
            raise APIError(400, "nothing recorded: start a recording and send traffic before dumping",
                           code="nothing_recorded")
        root = Path(self.config.serve.record_dir)
        path = root / (name or f"{self.model_dir.name}-serve-{time.strftime('%Y%m%d-%H%M%S')}")
        if path.exists():
            raise APIError(409, f"the run directory {path} exists; choose another name", code="run_dir_exists")
        records = await asyncio.wrap_future(self.worker.call_all(_record))
        try:
            summary = await asyncio.to_thread(self._write_ranks, path, records)
        except MoetuneError as exc:
            raise APIError(409, str(exc), code="run_dir_exists") from None
        self.profiler = None  # dumped once
        return {"path": str(path.resolve()), "steps": self.steps, "ranks": len(records),
                "kinds": sorted(summary["kinds"])}

    def _write_ranks(self, path: Path, records: list) -> dict:
        from moetune.profile.finish import write_run
        from moetune.profile.ranks.run import finish_rank_run
        from moetune.profile.rundir import RunDirWriter

        settings = live_settings(self.config, path, self.sequences, self.generated)
        with RunDirWriter(path) as tmp:
            return finish_rank_run(tmp, settings, self.config, records, self.worker.side.dp, self.nvml, write_run)


def _attach(side) -> None:
    """On every rank: a RankProfiler on the engine and the lock-steps, the live window kept going."""
    from moetune.profile.ranks.probe import RankProfiler
    from moetune.profile.ranks.run import dispatcher_of
    from moetune.serve.expert_load import Tee

    dp = side.dp
    profiler = RankProfiler(dp.model, dispatcher_of(dp.model), dp.rank)
    profiler.attach(dp)
    dp.model.attach_probe(Tee(profiler, side.window))
    side.bank_comm()
    profiler.start_measuring()
    side.profiler = profiler


def _detach(side) -> int:
    side.profiler.detach(side.dp)
    side.dp.model.attach_probe(side.window)
    return len(side.profiler.lock_steps)


def _record(side):
    from moetune.profile.ranks.run import dispatcher_of, wire_row_bytes

    profiler, side.profiler = side.profiler, None
    return profiler.record(wire_row_bytes(dispatcher_of(side.dp.model), side.dp.model))

