"""The `measure` evaluator: run the engine with a trial's recipe on this machine, on the profile's
workload (its prompts cut or padded to the same lengths, all requests at once), and time every
lock-step. R = 1 runs in this process; R > 1 (or a TP mesh) through `run_ranks` (R × G processes,
data-parallel attention + all-to-all over gloo / NCCL; a TP group's G ranks counted once). Returns the same `Metrics` as `simulate`, measured.

Memory per rank = weight bytes + the KV pool the engine allocated (+ the activation estimate of
profile/memory.py); the largest rank is reported.

The engine's own counters over the timed requests (the warm-up's taken off) go into the detail:
under a capacity, dropped_fraction / buffered_fraction = copies dropped / buffered over the copies
routed (tokens computed × K × MoE layers); with offloading, cache_hit_rate and prefetch_precision;
where the engine tracks routing (affinity scheduling, history hints), distinct_experts_per_step
(Σ over MoE layers of the experts a step wakes, mean over the timed steps); with engine.speculative,
spec_acceptance_rate (accepted / drafted tokens) and spec_tokens_per_verify ((accepted + verified) / verified).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from moetune.config import RunConfig
from moetune.search.cost.metrics import Metrics
from moetune.search.cost.schedule import SimWorkload


@dataclass(frozen=True)
class MeasureJob:
    """Picklable: spawned ranks receive it. Every rank runs the same calls."""

    prompts: tuple[tuple[int, ...], ...]  # token ids of each request
    output_len: int
    warmup: bool = True

    def __call__(self, dp) -> dict | None:
        from moetune.engine.sampling import SamplingParams

        params = SamplingParams(max_tokens=self.output_len, temperature=0.0, ignore_eos=True)
        if self.warmup:  # one short request per rank, untimed (first-call allocations)
            dp.engine.add_request(list(self.prompts[0][:8]), SamplingParams(max_tokens=2, ignore_eos=True))
            while dp.step() is not None:
                pass
        before = engine_counters(dp)
        log: list[tuple[int, int, int]] = []
        _record_schedule(dp.engine, log)
        mine = dp.mine(len(self.prompts))
        rids = {dp.engine.add_request(list(self.prompts[i]), params): i for i in mine}
        first, last, step_s = {}, {}, []
        step = 0
        while True:
            start = time.perf_counter()
            outputs = dp.step()
            if outputs is None:
                break
            step_s.append(time.perf_counter() - start)
            if len(log) < step + 1:
                log.append((0, 0, 0))  # this rank had no work this lock-step
            log[step] = (log[step][0], log[step][1], len(outputs))
            for out in outputs:
                i = rids.get(out.request_id)
                if i is not None:
                    first.setdefault(i, step)
                    if out.finish_reason is not None:
                        last[i] = step
            step += 1
        weights = dp.model.weight_bytes()
        mine_result = {"log": log, "first": first, "last": last, "step_s": step_s,
                       "memory": weights["dense"] + weights["experts"] + dp.engine.runner.cache.nbytes(),
                       "tp_rank": getattr(dp, "tp_rank", 0), "counters": counters_since(before, engine_counters(dp))}
        return _gather(dp, mine_result)


def engine_counters(dp) -> dict:
    """The engine's running totals: capacity copies, offload hits / misses / prefetches, tracked steps."""
    from moetune.engine.build import capacity_counts
    from moetune.moe.layer import MoELayer

    model = dp.model
    out = {**capacity_counts(model), "moe_layers": sum(isinstance(x.mlp, MoELayer) for x in model.layers),
           "top_k": model.spec.moe.router.top_k, "computed": dp.engine.stats.computed_tokens,
           "distinct": list(dp.engine.stats.distinct_experts), "verified": dp.engine.stats.verified,
           "draft_tokens": dp.engine.stats.draft_tokens, "accepted_tokens": dp.engine.stats.accepted_tokens}
    stats = model.experts.stats() if hasattr(model.experts, "stats") else {}
    for key in ("hits", "misses", "prefetch_issued", "prefetch_used"):
        out[key] = sum(row[key] for row in stats.values()) if stats else None
    return out


def counters_since(before: dict, after: dict) -> dict:
    """What the timed requests added to each counter (the warm-up's counts taken off)."""
    out = {k: (after[k] - before[k] if isinstance(after[k], int) and before[k] is not None else after[k])
           for k in after if k not in ("moe_layers", "top_k", "distinct")}
    out.update(moe_layers=after["moe_layers"], top_k=after["top_k"], distinct=after["distinct"][len(before["distinct"]):])
    return out


def counter_detail(ranks: list[dict], capacity_policy: str) -> dict:
    """Metrics.detail figures of the ranks' counters (module docstring)."""
    c = [part["counters"] for part in ranks]
    out: dict = {}
    if capacity_policy != "none":
        routed = sum(x["computed"] * x["top_k"] * x["moe_layers"] for x in c)
        for key, name in (("dropped", "dropped_fraction"), ("buffered", "buffered_fraction")):
            out[name] = sum(x[key] for x in c) / routed if routed else 0.0
    if all(x["hits"] is not None for x in c) and sum(x["hits"] + x["misses"] for x in c):
        out["cache_hit_rate"] = sum(x["hits"] for x in c) / sum(x["hits"] + x["misses"] for x in c)
        issued = sum(x["prefetch_issued"] for x in c)
        out["prefetch_precision"] = sum(x["prefetch_used"] for x in c) / issued if issued else 0.0
    drafted, verified = sum(x["draft_tokens"] for x in c), sum(x["verified"] for x in c)
    if drafted:
        accepted = sum(x["accepted_tokens"] for x in c)
        out.update(spec_acceptance_rate=accepted / drafted, spec_tokens_per_verify=(accepted + verified) / verified)
    distinct = [d for x in c for d in x["distinct"]]
    if distinct:
        out["distinct_experts_per_step"] = sum(distinct) / len(distinct)
    return out


def _record_schedule(engine, log: list) -> None:
    """Note (prompt tokens, decode tokens, 0) of every step the engine schedules."""
    schedule = engine.scheduler.schedule

    def recording():
        out = schedule()
        if out.entries:
            decode = sum(1 for e in out.entries if e.is_decode)
            prefill = sum(e.num_tokens for e in out.entries if not e.is_decode)
            log.append((prefill, decode, 0))  # sampled: filled in from the step's outputs
        return out

    engine.scheduler.schedule = recording


def _gather(dp, result: dict) -> dict | None:
    if getattr(dp, "world", 1) == 1:
        return {"ranks": [result]}
    import torch.distributed as dist

    parts: list = [None] * dp.world
    dist.all_gather_object(parts, result, group=dp.ctx.group)
    # one part per DP group: the G ranks of a tensor-parallel group log the same steps and tokens
    return {"ranks": [p for p in parts if p["tp_rank"] == 0]} if dp.rank == 0 else None


class LocalRank:
    """The DPGenerator surface `MeasureJob` uses, for one rank in this process."""

    rank, world = 0, 1

    def __init__(self, generator):
        self.generator = generator

    @property
    def engine(self):
        return self.generator.engine

    @property
    def model(self):
        return self.generator.model

    def mine(self, n: int) -> list[int]:
        return list(range(n))

    def step(self):
        if not self.engine.has_unfinished():
            return None
        return self.engine.step()


def request_prompts(cfg: RunConfig, prompts_file: str | None, w: SimWorkload) -> tuple[tuple[int, ...], ...]:
    """The profile's prompts (bundled held-out prompts by default), tokenized, cycled, cut/padded."""
    from moetune.engine.tokenizer import load_tokenizer
    from moetune.model.registry import resolve_model
    from moetune.profile.workload import Workload, load_prompt_texts, prompts_path

    texts = load_prompt_texts(prompts_path(Workload(prompts=prompts_file)))
    tok = load_tokenizer(resolve_model(cfg.model.path))
    out = []
    for i, n in enumerate(w.prompt_lens):
        ids = tok.encode(texts[i % len(texts)]) or [0]
        out.append(tuple((ids * (n // len(ids) + 1))[:n]))
    return tuple(out)


def measure(cfg: RunConfig, prompts: tuple[tuple[int, ...], ...], w: SimWorkload, engine_extra: dict | None = None,
            act_bytes_estimate: float = 0.0) -> Metrics:
    """Run `cfg` on this machine; rank-0 clocks."""
    from moetune.config import parse_config

    job = MeasureJob(prompts, w.output_len)
    cfg = _sized(cfg, w, engine_extra)
    if cfg.parallel.world > 1:  # EP and/or TP ranks
        from moetune.engine.distributed import run_ranks

        result = run_ranks(cfg, job)
    else:
        from moetune.engine.build import build_generator

        result = job(LocalRank(build_generator(parse_config(cfg.model_dump()))))
    return _to_metrics(result, w, cfg.parallel.world, act_bytes_estimate, cfg.parallel.capacity_policy)


def _sized(cfg: RunConfig, w: SimWorkload, extra: dict | None) -> RunConfig:
    """The KV pool sized for the workload (the simulator assumes no preemption)."""
    from moetune.config import parse_config

    data = cfg.model_dump()
    per_rank = -(-w.num_requests // cfg.parallel.ep_size)
    seqs = min(cfg.engine.max_num_seqs, per_rank)
    per_seq = -(-(max(w.prompt_lens) + w.output_len + 1) // cfg.engine.block_size)
    data["engine"].update({"num_kv_blocks": seqs * per_seq + 4, "prefix_caching": False, **(extra or {})})
    return parse_config(data, source="measure")


def _to_metrics(result: dict, w: SimWorkload, R: int, act_bytes: float, capacity_policy: str = "none") -> Metrics:
    import numpy as np

    from moetune.search.cost.summary import summarize_steps

    ranks = result["ranks"]
    S = len(ranks[0]["step_s"])
    logs = np.zeros((S, 3))
    first, last = np.zeros(w.num_requests, dtype=np.int64), np.zeros(w.num_requests, dtype=np.int64)
    for part in ranks:
        rows = np.array(part["log"][:S] + [(0, 0, 0)] * max(0, S - len(part["log"])), dtype=np.float64)
        logs += rows.reshape(S, 3)
        for i, s in part["first"].items():
            first[i] = s
        for i, s in part["last"].items():
            last[i] = s
    peak = max(part["memory"] for part in ranks) + act_bytes
    return summarize_steps(False, R, w, logs[:, 0], logs[:, 1], logs[:, 2], ranks[0]["step_s"], first, last, peak,
                           None, {"steps": S, **counter_detail(ranks, capacity_policy)})


def placement_file_for(cfg: RunConfig, loads, out_dir: Path, redundant: int, ep_size: int) -> str:
    """Write the EPLB placement of the trace's loads for this model (the recipe names the file)."""
    from moetune.model.registry import resolve_model
    from moetune.model.validate import read_spec
    from moetune.moe.placement import make_placement, write_placement

    spec = read_spec(resolve_model(cfg.model.path))
    p = make_placement("eplb", spec.moe.num_experts, ep_size, spec.moe_layers, redundant, loads,
                       model_type=spec.model_type)
    path = Path(out_dir) / f"eplb-r{ep_size}-n{redundant}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_placement(p, path, loads, spec.num_layers)
    return str(path)
