"""MTP speculation: the checkpoint's own multi-token-prediction module (model/mtp.py) drafts from
the target's hidden states — after each target step, before the next.

After a step, each computed row p of a live sequence (a prefill chunk's rows, a decode's one, a
verify entry's last token and its accepted drafts; not the rejected ones) has the target's hidden
state h_p and a known next token t_{p+1}: the module runs on all of them at once, writing its KV
at position p (vLLM's convention), and the last row of each sequence that decodes next (all its
known tokens but the last computed) gives draft token 1. Tokens 2..k chain the module on its own
output (position p + 1 with the drafted token, and so on), as vLLM chains a one-layer MTP.

Its KV cache is a one-layer paged cache of its own that shares the target's block tables: a
sequence's MTP KV at position p sits in the same block and slot as its target KV, so admission,
freeing, preemption (recomputation reruns the module on the recomputed rows), the rollback of
rejected drafts (their slots are rewritten by the next step's run) and prefix hits come with the
target's blocks. Chained positions past a sequence's blocks go to scratch blocks after the pool
(`per_seq` per drafting sequence), never read beyond the chain that wrote them. With prefix
caching, the MTP KV at a cached block's last slot was computed with the next token of the
request that cached it (the hash covers the block's own tokens): a hint at acceptance, never at
output, which the target's verification keeps exact. Drafts are greedy (q one-hot), so rejection
sampling stays exact for a sampling target too.
"""

from __future__ import annotations

from typing import Callable

import torch

from moetune.engine.sampling import greedy_tokens
from moetune.engine.scheduler import SchedulerOutput
from moetune.engine.sequence import Sequence
from moetune.engine.speculative.base import Draft
from moetune.engine.speculative.experts import VerifyExperts
from moetune.model.batch import StepBatch, StepKind
from moetune.model.mtp import MTPModule
from moetune.moe.layer import MoELayer

Spans = list[tuple[list[int], int, list[int]]]  # per sequence: (token ids, position of the first, block table)


class MTPSpeculator:
    def __init__(self, k: int, module: MTPModule, num_blocks: int, block_size: int, max_seqs: int,
                 build_batch: Callable[[Spans, StepKind], StepBatch], experts: VerifyExperts | None = None):
        """`build_batch`: the target runner's StepBatch builder (ModelRunner.build_batch); `experts`:
        the engine's verify-step counts, which then count the experts an MoE block reads too."""
        self.k, self.module, self.build_batch = k, module, build_batch
        self.num_blocks, self.block_size = num_blocks, block_size
        self.per_seq = -(-k // block_size) + 1  # scratch blocks per drafting sequence (chained positions)
        scratch = max_seqs * self.per_seq
        self.cache = module.new_cache(num_blocks + scratch, block_size)
        self.cache.zero_blocks(list(range(num_blocks + 1, num_blocks + scratch + 1)))
        self.drafts: dict[int, tuple[int, list[int]]] = {}  # seq_id → (its num_tokens then, the k tokens)
        self.forwards = 0  # module forwards run (one per observed step, + k - 1 chained ones)
        mlp = module.block.mlp
        if experts is not None and isinstance(mlp, MoELayer):
            per_expert = sum(t.nbytes for t in mlp.store.tensors()) // module.spec.moe.num_experts
            experts.watch_drafter(mlp, per_expert)

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]:
        out = []
        for seq, limit in zip(seqs, limits):
            at, tokens = self.drafts.get(seq.seq_id, (-1, []))
            out.append(Draft(tokens[:limit] if at == seq.num_tokens and limit > 0 else []))
        return out

    def accepted(self, seq: Sequence, num_accepted: int) -> None:
        pass  # `observe` already drafted from what the target kept

    def forget(self, seq: Sequence) -> None:
        self.drafts.pop(seq.seq_id, None)

    @torch.inference_mode()
    def observe(self, sched: SchedulerOutput, batch: StepBatch, hidden: torch.Tensor) -> None:
        """After the target's step (tokens appended, rejected drafts trimmed): run the module on the
        step's kept rows (`hidden` [T, D] is the target's output for the step's `batch`) and draft
        for every live sequence that decodes next."""
        if sched.new_blocks:
            self.cache.zero_blocks(sched.new_blocks)
        spans, rows, ready = [], [], []
        for e, start, q, ctx in zip(sched.entries, batch.starts(), batch.query_lens, batch.context_lens):
            seq, p0 = e.seq, ctx - q  # p0: the step's first position for this sequence
            n = seq.num_computed_tokens - p0  # rows kept (a verify entry's rejected drafts left out)
            if seq.finished or n <= 0:
                continue
            if seq.num_computed_tokens == seq.num_tokens - 1:  # decodes next: draft for it
                ready.append((len(spans), seq))
            spans.append((seq.token_ids(p0 + 1, p0 + n + 1), p0, seq.block_table))
            rows += range(start, start + n)
        if not spans:
            return
        step = self.build_batch(spans, _kind(spans))
        out = self.module.forward(step.input_ids, hidden[torch.tensor(rows, device=hidden.device)], step, self.cache)
        self.forwards += 1
        if not ready:
            return
        ends = step.last_token_index()[torch.tensor([j for j, _ in ready], device=hidden.device)]
        self._chain([spans[j] for j, _ in ready], [seq for _, seq in ready], out[ends])

    def _chain(self, spans: Spans, seqs: list[Sequence], last: torch.Tensor) -> None:
        """last [R, D]: the module's output at each ready sequence's last row → k draft tokens each."""
        drafts = [[t] for t in greedy_tokens(self.module.logits(last))]
        for j in range(1, self.k):
            chain = []
            for r, (seq, (ids, p0, table)) in enumerate(zip(seqs, spans)):
                first = self.num_blocks + 1 + r * self.per_seq
                chain.append(([drafts[r][-1]], p0 + len(ids) + j - 1, table + list(range(first, first + self.per_seq))))
            step = self.build_batch(chain, StepKind.DECODE)
            last = self.module.forward(step.input_ids, last, step, self.cache)  # [R, D]
            self.forwards += 1
            for r, t in enumerate(greedy_tokens(self.module.logits(last))):
                drafts[r].append(t)
        for seq, tokens in zip(seqs, drafts):
            self.drafts[seq.seq_id] = (seq.num_tokens, tokens)


def _kind(spans: Spans) -> StepKind:
    single = [len(ids) == 1 for ids, _, _ in spans]
    return StepKind.DECODE if all(single) else StepKind.MIXED if any(single) else StepKind.PREFILL
