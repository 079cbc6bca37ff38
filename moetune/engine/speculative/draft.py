"""Draft-model speculation: a second, smaller checkpoint with the target's vocabulary decodes k
tokens greedily after each sequence's known tokens; the target verifies them.

The draft model runs in an Engine of its own (its own paged KV cache and block pool) with prefix
caching on: each propose adds one request per sequence — its tokens so far, k greedy tokens to
go — and steps until they finish, so the draft recomputes only the tokens past the last full
block it cached before (those the target accepted since, and the one it added). Greedy drafts are
deterministic (q one-hot), so rejection sampling stays exact for a sampling target too. Sequences
a draft finishes early (the draft's own EOS is ignored) still give k tokens.
"""

from __future__ import annotations

import torch

from moetune.config import EngineConfig
from moetune.engine.sampling import SamplingParams
from moetune.engine.sequence import Sequence
from moetune.engine.speculative.base import Draft
from moetune.engine.speculative.check import check_draft_vocab


class DraftModelSpeculator:
    def __init__(self, k: int, draft_model, target_vocab: int, max_seqs: int, max_len: int, engine_class):
        """`engine_class`: moetune.engine.engine.Engine, handed in by the target's engine (this
        module does not import the engine that imports it)."""
        check_draft_vocab(draft_model.spec.vocab_size, target_vocab)
        self.k, self.model = k, draft_model
        context = min(max_len, draft_model.spec.max_position)
        per_seq = -(-context // 16) + 1
        # a full context per sequence: a propose reuses its sequence's cached blocks, then adds its tail
        config = EngineConfig(max_num_seqs=max_seqs, num_kv_blocks=max_seqs * per_seq, block_size=16,
                              max_num_batched_tokens=max(8192, max_seqs * 16), max_model_len=context)
        self.engine = engine_class(draft_model, None, frozenset(), config)  # no speculation of its own

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]:
        rids = {}
        for seq, limit in zip(seqs, limits):
            if limit > 0 and seq.num_tokens + limit < self.engine.max_len:
                ids = seq.token_ids(0, seq.num_tokens)
                rids[seq.seq_id] = self.engine.add_request(ids, SamplingParams(max_tokens=limit, ignore_eos=True))
        got: dict[int, list[int]] = {r: [] for r in rids.values()}
        try:
            with torch.inference_mode():
                while self.engine.has_unfinished():
                    for out in self.engine.step():
                        if out.new_token >= 0:
                            got[out.request_id].append(out.new_token)
        except BaseException:  # the target's step fails (its caller resets it); the draft starts clean too
            self.engine.reset()
            raise
        return [Draft(got[rids[s.seq_id]] if s.seq_id in rids else []) for s in seqs]

    def accepted(self, seq: Sequence, num_accepted: int) -> None:
        pass  # the draft's prefix cache keeps what it computed; the next propose reuses the kept part

    def forget(self, seq: Sequence) -> None:
        pass
