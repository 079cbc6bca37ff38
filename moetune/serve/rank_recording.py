"""Expert-distribution recording (`/v1/expert_distribution/*`) on a server over R ranks.

`start` attaches a RankProfiler (moetune/profile/ranks/probe.py, the one `moetune profile --ep-size R`
uses) to every rank between two lock-steps, beside each rank's live load window; `stop` detaches
them; `dump` gathers every rank's record on rank 0 and writes the run directory with the writer of
`moetune profile --ep-size R` (`finish_rank_run`): the same files, the measured `rank_steps` /
`rank_moe` tables, the what-if for the served placement.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from moetune.serve.recording import Recorder, live_settings


class RankRecorder(Recorder):
    """The Recorder's routes over every rank (worker: a RanksWorker): the profilers live on the ranks."""

    async def _attach(self):
        await asyncio.wrap_future(self.worker.call_all(_attach))
        return True  # the profilers live on the ranks

    async def _detach(self) -> int:
        steps = await asyncio.wrap_future(self.worker.call_all(_detach))
        return steps[0]

    async def _write(self, path: Path) -> tuple[dict, dict]:
        records = await asyncio.wrap_future(self.worker.call_all(_record))
        summary = await asyncio.to_thread(self._write_ranks, path, records)
        return summary, {"ranks": len(records)}

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
    record = profiler.record(wire_row_bytes(dispatcher_of(side.dp.model), side.dp.model))
    record.coords = (side.dp_rank, side.tp_rank)  # the run's tables take each DP group's tokens once
    return record

