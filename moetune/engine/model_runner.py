"""ModelRunner: a scheduled step → StepBatch (tokens, positions, slot mapping, block tables) → the
model's forward → logits of the rows that sample → sampled tokens.

Only sequences whose known tokens are all computed after this step sample (decodes, and prompts
whose last chunk this is); the LM head runs on their rows alone, and on every row of a verify
entry (its last token and its draft tokens: engine/speculative/verify.py). Greedy rows are sampled with one
argmax over the batch. A row whose sampling raises (a NaN in its logits, a bad generator) is
reported in `failures` and gets no token; the other rows of the step are unaffected.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Protocol

import numpy as np
import torch

from moetune.engine.sampling import TokenLogprobs, greedy_tokens, sample, token_logprobs
from moetune.engine.scheduler import SchedulerOutput
from moetune.engine.speculative.base import Draft
from moetune.engine.speculative.experts import VerifyExperts
from moetune.engine.speculative.verify import verify
from moetune.model.batch import StepBatch, StepKind
from moetune.model.kv_cache import PagedKVCache
from moetune.model.transformer import MoETransformer


class StepObserver(Protocol):
    """Told about each step's forward (kind: "prefill", "decode" or "mixed"); the profiler implements it."""

    def step_begin(self, kind: str, batch: StepBatch) -> None: ...

    def step_end(self, kind: str, batch: StepBatch) -> None: ...


class ModelRunner:
    def __init__(self, model: MoETransformer, num_blocks: int, block_size: int):
        self.model = model
        self.block_size = block_size
        self.cache: PagedKVCache = model.new_cache(num_blocks, block_size)
        self.observer: StepObserver | None = None
        self.logprobs: dict[int, TokenLogprobs] = {}  # seq_id → of the last execute(), for seqs that asked
        self.failures: dict[int, str] = {}  # seq_id → why its sampling failed in the last execute()
        self.experts: VerifyExperts | None = None  # set: verify steps count the experts they wake
        self.last_batch: StepBatch | None = None  # the last execute()'s batch and the target's hidden
        self.last_hidden: torch.Tensor | None = None  # states of all its rows [T, D] (MTP drafts from them)

    def execute(self, sched: SchedulerOutput) -> list[list[int]]:
        """Run one scheduled step; the tokens each entry yields ([] while its prompt is unfinished
        or its sampling failed; 1 .. num_draft + 1 for a verify entry)."""
        if sched.new_blocks:
            self.cache.zero_blocks(sched.new_blocks)
        batch = self.prepare(sched)
        samplers = [i for i, e in enumerate(sched.entries)
                    if e.seq.num_computed_tokens + e.num_tokens - e.num_draft == e.seq.num_tokens]
        if self.observer is not None:
            self.observer.step_begin(batch.kind.value, batch)
        with self._counting_experts(sched, batch):
            hidden = self.model.forward(batch, self.cache)  # [T, D]
        self.last_batch, self.last_hidden = batch, hidden
        rows = self._logit_rows(sched, batch, samplers, hidden.shape[0])  # [S'] or None: every row
        logits = self.model.logits(hidden if rows is None else hidden[rows])  # [S', V]
        if self.observer is not None:
            self.observer.step_end(batch.kind.value, batch)
        self.failures = {}
        tokens: list[list[int]] = [[] for _ in sched.entries]
        plain = [i for i in samplers if not sched.entries[i].num_draft]
        at = self._verify_all(sched, samplers, logits, tokens)
        seqs = [sched.entries[i].seq for i in plain]
        plain_logits = logits if len(plain) == len(samplers) else logits[at]  # [S, V]
        sampled = self._sample(plain_logits, seqs)
        for i, token in zip(plain, sampled):
            tokens[i] = [] if token is None else [token]
        if self.failures:  # logprobs of the rows that sampled
            ok = [j for j, t in enumerate(sampled) if t is not None]
            plain_logits, seqs, sampled = plain_logits[ok], [seqs[j] for j in ok], [sampled[j] for j in ok]
        self.logprobs = self._logprobs(plain_logits, seqs, sampled)
        return tokens

    def prepare(self, sched: SchedulerOutput) -> StepBatch:
        spans = [(e.seq.token_ids(e.seq.num_computed_tokens, e.seq.num_computed_tokens + e.num_tokens - e.num_draft)
                  + e.seq.draft_ids[: e.num_draft], e.seq.num_computed_tokens, e.seq.block_table)
                 for e in sched.entries]
        return self.build_batch(spans, sched.kind)

    def _counting_experts(self, sched: SchedulerOutput, batch: StepBatch):
        """On a verify step (with `experts` set): count the experts of its decode rows and of the
        rows a plain decode would compute (engine/speculative/experts.py)."""
        if self.experts is None or not any(e.num_draft for e in sched.entries):
            return nullcontext()
        decode_rows, plain_rows = [], []
        for e, start, n in zip(sched.entries, batch.starts(), batch.query_lens):
            if e.is_decode:
                decode_rows += range(start, start + n)
                plain_rows.append(start)
        return self.experts.watching(self.model, decode_rows, plain_rows)

    def _logit_rows(self, sched: SchedulerOutput, batch: StepBatch, samplers: list[int], T: int):
        """Rows of the step's hidden states whose logits are needed: each sampling entry's last
        row, every row of a verify entry; None when that is every row in order (a decode step)."""
        if len(samplers) == batch.num_seqs == T:
            return None
        ends = batch.last_token_index().tolist()
        rows = []
        for i in samplers:
            rows += range(ends[i] - sched.entries[i].num_draft, ends[i] + 1)
        return rows

    def _verify_all(self, sched: SchedulerOutput, samplers: list[int], logits: torch.Tensor,
                    tokens: list[list[int]]) -> list[int]:
        """Verify each verify entry's draft on its k + 1 logit rows (into `tokens`); returns the
        logit rows of the other sampling entries."""
        plain_rows, r = [], 0
        for i in samplers:
            e = sched.entries[i]
            if not e.num_draft:
                plain_rows.append(r)
                r += 1
                continue
            seq, k = e.seq, e.num_draft
            draft = Draft(seq.draft_ids[:k], None if seq.draft_probs is None else seq.draft_probs[:k])
            try:
                tokens[i] = verify(logits[r : r + k + 1], draft, seq.params, seq.generator)
            except Exception as exc:  # this sequence alone fails, as a plain row's sampling does
                self.failures[seq.seq_id] = f"sampling failed: {type(exc).__name__}: {exc}"
            r += k + 1
        self._agree_verified(sched, samplers, tokens)
        return plain_rows

    def _agree_verified(self, sched: SchedulerOutput, samplers: list[int], tokens: list[list[int]]) -> None:
        """Under tensor parallelism a sampled verify keeps the group's rank 0's tokens (each process's
        RNG may differ; greedy verification agrees already, from the same gathered logits)."""
        tp = self.model.tp
        verified = [i for i in samplers if sched.entries[i].num_draft]
        if tp is None or all(sched.entries[i].seq.params.greedy for i in verified):
            return
        for i, kept in zip(verified, tp.agree_lists([tokens[i] for i in verified])):
            tokens[i] = kept

    def forward_prompts(self, prompts: list[list[int]]) -> torch.Tensor:
        """Hidden states [T, D] of every token of fresh prompts, run as one prefill step outside the
        scheduler (logit checks, routing capture); they occupy the cache's first blocks."""
        bs, spans, next_block = self.block_size, [], 1
        for ids in prompts:
            n = (len(ids) + bs - 1) // bs
            spans.append((list(ids), 0, list(range(next_block, next_block + n))))
            next_block += n
        if next_block - 1 > self.cache.num_blocks:
            raise ValueError(f"{next_block - 1} blocks needed, the cache has {self.cache.num_blocks}")
        self.cache.zero_blocks(list(range(1, next_block)))
        batch = self.build_batch(spans, StepKind.PREFILL)
        if self.observer is not None:
            self.observer.step_begin(batch.kind.value, batch)
        hidden = self.model.forward(batch, self.cache)
        if self.observer is not None:
            self.observer.step_end(batch.kind.value, batch)
        return hidden

    def build_batch(self, spans: list[tuple[list[int], int, list[int]]], kind: StepKind) -> StepBatch:
        """spans: per sequence (new token ids, position of the first, its block table)."""
        ids, positions, slots, query_lens, context_lens = [], [], [], [], []
        bs = self.block_size
        for tokens, start, table in spans:
            end = start + len(tokens)
            ids += tokens
            positions += range(start, end)
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            query_lens.append(len(tokens))
            context_lens.append(end)
        width = max(len(table) for _, _, table in spans)
        tables = [table + [0] * (width - len(table)) for _, _, table in spans]
        num_single = next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))
        dev = self.model.device
        return StepBatch(_long(ids, dev), _long(positions, dev), query_lens, context_lens, _long(slots, dev),
                         _long(tables, dev), kind, num_single)

    def _logprobs(self, logits: torch.Tensor, seqs, sampled: list[int]) -> dict[int, TokenLogprobs]:
        want = [j for j, s in enumerate(seqs) if s.params.logprobs is not None]
        if not want:
            return {}
        rows = token_logprobs(logits[want], [sampled[j] for j in want], [seqs[j].params.logprobs for j in want])
        return {seqs[j].seq_id: r for j, r in zip(want, rows)}

    def _sample(self, logits: torch.Tensor, seqs) -> list[int | None]:
        """logits [S, V] → one token per sequence (None where its sampling failed: see `failures`)."""
        if not seqs:
            return []
        if all(s.params.greedy for s in seqs):
            return greedy_tokens(logits)
        tokens = [self._sample_one(row, s) for row, s in zip(logits, seqs)]
        return tokens if self.model.tp is None else self.model.tp.agree(tokens)  # one draw per TP group

    def _sample_one(self, row: torch.Tensor, seq) -> int | None:
        try:
            return sample(row, seq.params, seq.generator)
        except Exception as exc:  # this sequence alone fails (the engine finishes it with an error)
            self.failures[seq.seq_id] = f"sampling failed: {type(exc).__name__}: {exc}"
            return None


def _long(values: list, device: torch.device) -> torch.Tensor:
    """An int64 tensor of a (nested) list: on the CPU through numpy (~1 µs, torch.tensor ~3 µs)."""
    if device.type == "cpu":
        return torch.from_numpy(np.array(values, dtype=np.int64))
    return torch.tensor(values, dtype=torch.long, device=device)
