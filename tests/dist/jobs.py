"""Jobs run on every rank by the distributed tests (module level: spawned ranks unpickle them)."""

from __future__ import annotations

import os

from moetune.engine.sampling import SamplingParams


def parity(prompts: list[list[int]], max_tokens: list[int], dp):
    """Prompt logits and greedy completions; rank 0 returns them (the others None)."""
    logits = dp.prompt_logits(prompts)
    done = dp.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    if dp.rank != 0:
        return None
    return logits, [c.token_ids for c in done], dp.idle_steps


def die_on(rank: int, prompts: list[list[int]], dp):
    """Rank `rank` exits abruptly after its first lock-step; the others go on."""
    dp.step()
    if dp.rank == rank:
        os._exit(3)
    return dp.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))


def dispatch_roundtrip(slot_ids: list[list[list[int]]], num_slots: int, ctx):
    """Hand-made routing (slot_ids[rank] = that rank's [T, K] physical slots) through the
    AllToAllDispatcher; the "expert" of slot p multiplies by p + 1. Every rank's observations."""
    import torch
    import torch.distributed as dist

    from moetune.moe.all_to_all import AllToAllDispatcher
    from moetune.moe.permute import permute

    R, D = ctx.world, 4
    per_rank = num_slots // R
    ids = torch.tensor(slot_ids[ctx.rank], dtype=torch.long).view(-1, 2)  # [T, K]
    x = torch.randn(ids.shape[0], D, generator=torch.Generator().manual_seed(ctx.rank))  # [T, D]
    perm = permute(x, ids, num_slots)
    dispatcher = AllToAllDispatcher(R, ctx.rank, per_rank)
    sent = dispatcher.dispatch(perm)
    local = torch.repeat_interleave(torch.arange(per_rank), sent.offsets.diff())  # [N] local slot of each row
    back = dispatcher.combine(sent.x * (ctx.rank * per_rank + local + 1)[:, None].float(), sent)
    sorted_slot = ids.reshape(-1)[perm.sorted_copy_ids]  # [T*K] slot of each sorted copy
    expected = perm.x_sorted * (sorted_slot + 1)[:, None].float()
    mine = {"received": int(sent.x.shape[0]), "offsets": sent.offsets.tolist(), "exact": torch.equal(back.y_sorted, expected),
            "dispatch_bytes": sent.bytes_sent, "combine_bytes": back.bytes_sent}
    every: list = [None] * R
    dist.all_gather_object(every, mine)
    return every


def logits_and_bytes(prompts: list[list[int]], dp):
    """Prompt logits (rank 0) and the bytes every rank's dispatcher sent for them (summed)."""
    import torch
    import torch.distributed as dist

    from moetune.moe.layer import MoELayer

    dispatcher = next(layer.mlp.dispatcher for layer in dp.model.layers if isinstance(layer.mlp, MoELayer))
    dispatcher.reset_stats()
    logits = dp.prompt_logits(prompts)
    sent = torch.tensor([dispatcher.bytes_sent])
    dist.all_reduce(sent)
    return None if dp.rank != 0 else (logits, int(sent.item()))


def sampled_on_every_rank(prompts: list[list[int]], seed: int | None, dp):
    """Temperature sampling (seeded per request, or from each process's RNG, set differently on
    every rank): the tokens every rank's engine produced, by rank (rank 0 returns them)."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(1000 + dp.rank)  # each process's own RNG differs
    params = SamplingParams(max_tokens=12, temperature=1.3, seed=seed, ignore_eos=True)
    mine = dp.mine(len(prompts))
    rids = dp._add([prompts[i] for i in mine], [params] * len(mine), mine)
    seqs = [dp.engine.sequence(r) for r in rids]
    while dp.step() is not None:
        pass
    every: list = [None] * dp.world
    dist.all_gather_object(every, {i: s.output_ids for i, s in zip(mine, seqs)})
    return every if dp.rank == 0 else None


def loaded(dp):
    """(bytes of checkpoint tensors this rank read, its resident weight bytes) of every rank."""
    import torch.distributed as dist

    mine = (dp.model.bytes_read, sum(dp.model.weight_bytes().values()))
    every: list = [None] * dp.world
    dist.all_gather_object(every, mine)
    return every if dp.rank == 0 else None


def parity_with_capacity(prompts: list[list[int]], max_tokens: list[int], dp):
    """`parity`, plus the copies this rank's capacity buffered, dropped and rerouted (every rank's)."""
    from moetune.engine.build import capacity_counts

    logits = dp.prompt_logits(prompts)
    done = dp.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    counts = capacity_counts(dp.model)
    if dp.rank != 0:
        return None
    return logits, [c.token_ids for c in done], counts


def speculative_parity(prompts: list[list[int]], max_tokens: list[int], dp):
    """Greedy completions (rank 0's gathered answer) and, of every rank, the drafts its speculator
    offered (per propose call: seq id, its length then, the tokens) and its engine's speculative counters."""
    import torch.distributed as dist

    offered, propose = [], dp.engine.speculator.propose

    def recording(seqs, limits):
        drafts = propose(seqs, limits)
        offered.extend((s.seq_id, s.num_tokens, d.tokens) for s, d in zip(seqs, drafts) if d.tokens)
        return drafts

    dp.engine.speculator.propose = recording
    done = dp.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
    st = dp.engine.stats
    mine = {"drafts": offered, "draft_tokens": st.draft_tokens, "accepted": st.accepted_tokens,
            "verify_steps": st.verify_steps}
    every: list = [None] * dp.world
    dist.all_gather_object(every, mine)
    return ([c.token_ids for c in done], every) if dp.rank == 0 else None
