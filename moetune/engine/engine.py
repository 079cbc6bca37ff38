"""Engine: requests in, tokens out, one `step()` at a time — schedule → run → postprocess.

Requests may be added or aborted between any two steps (continuous batching); each step mixes
decodes of running sequences with (chunks of) new prompts under the scheduler's token budget. The
KV cache is paged and shared through prefix caching. With `engine.speculative` a speculator
drafts tokens for each decoding sequence before the step, the step verifies them (1 to k + 1
tokens per sequence: engine/speculative/), and the KV of rejected draft tokens is rolled back;
with ":auto" k is chosen per step (speculative/adaptive.py) from the acceptance and the step times.
`Generator` wraps this for batch generation and streaming; a server drives `step()` from its own
loop.

A sequence whose sampling or stop check fails is finished alone, with finish_reason "error" and
the reason in `RequestOutput.error`; the step's other sequences carry on. Anything else that
escapes `step()` leaves the engine in an unknown state: `reset()` drops every request and starts
from empty queues and a fresh block pool, `self_check()` proves a forward still runs.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from moetune.config import EngineConfig, parse_speculative
from moetune.engine.block_manager import BlockManager
from moetune.engine.expert_trace import ExpertTraces
from moetune.engine.limits import max_len_of, prompt_refusal
from moetune.engine.model_runner import ModelRunner, StepObserver
from moetune.engine.sampling import SamplingParams, TokenLogprobs
from moetune.engine.routing import StepRouting
from moetune.engine.scheduler import Admission, FCFSAdmission, Scheduler, SchedulerOutput
from moetune.engine.sequence import Sequence
from moetune.engine.speculative.adaptive import AdaptiveK
from moetune.engine.speculative.base import HiddenStateSpeculator
from moetune.engine.speculative.experts import VerifyExperts
from moetune.engine.speculative.make import make_speculator
from moetune.errors import RequestError
from moetune.model.batch import StepKind
from moetune.model.kv_cache import bytes_per_token
from moetune.model.transformer import MoETransformer

log = logging.getLogger("moetune.engine")


@dataclass
class RequestOutput:
    request_id: int
    new_token: int
    text_delta: str
    finish_reason: str | None  # None while running; "error": this sequence failed (see `error`)
    logprobs: TokenLogprobs | None = None  # when the request's params ask for them
    error: str | None = None  # why the sequence failed (finish_reason "error"); new_token is then -1


@dataclass
class EngineStats:
    steps: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0, "mixed": 0})
    prompt_tokens: int = 0  # prompt tokens of the requests added
    prefix_cache_hit_tokens: int = 0  # of which found in the prefix cache (not computed)
    computed_tokens: int = 0  # tokens run through the model, recomputation included
    preemptions: int = 0
    expert_steps: int = 0  # steps whose distinct experts were counted (while experts are tracked)
    distinct_experts: list[int] = field(default_factory=list)  # Σ_layers distinct experts woken, per counted step
    verify_steps: int = 0  # steps that verified at least one draft (speculative decoding)
    verified: int = 0  # sequence-steps that verified a draft
    draft_tokens: int = 0  # draft tokens verified
    accepted_tokens: int = 0  # of which the target accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens a sequence gained per verify: accepted drafts + the target's own one."""
        return (self.accepted_tokens + self.verified) / self.verified if self.verified else 0.0


class Engine:
    def __init__(self, model: MoETransformer, tokenizer, eos_ids: frozenset[int], config: EngineConfig = EngineConfig()):
        self.model, self.tokenizer, self.eos_ids = model, tokenizer, eos_ids
        self.config = config
        self.max_len = max_len_of(config, model.spec.max_position)
        num_blocks = config.num_kv_blocks or _auto_blocks(model, config, self.max_len)
        self.blocks = BlockManager(num_blocks, config.block_size, config.prefix_caching)
        self.routing: StepRouting | None = None  # on under affinity, or `track_experts()`
        self.scheduler = Scheduler(config, self.blocks, self._admission())
        self.runner = ModelRunner(model, num_blocks, config.block_size)
        self.speculator = None
        self.adaptive: AdaptiveK | None = None  # ":auto": k per step (engine/speculative/adaptive.py)
        if config.speculative is not None:
            self.runner.experts = VerifyExperts()  # before the speculator: an MTP block's experts count too
            spec = parse_speculative(config.speculative)
            self.speculator = make_speculator(spec, model, config.max_num_seqs, self.max_len, Engine, self.runner)
            self.adaptive = AdaptiveK(spec.k) if spec.adaptive else None
        self.stats = EngineStats()
        self.traces: ExpertTraces | None = None  # on when the store takes history hints, or `keep_traces()`
        if config.scheduling == "affinity":
            self.track_experts()
        if model.experts.wants_hints:
            self.keep_traces()
        self._seqs: dict[int, Sequence] = {}
        self._ids = itertools.count()

    @property
    def observer(self) -> StepObserver | None:
        return self.runner.observer

    @observer.setter
    def observer(self, value: StepObserver | None) -> None:
        self.runner.observer = value

    def _admission(self) -> Admission:
        if self.config.scheduling != "affinity":
            return FCFSAdmission()
        from moetune.engine.affinity import AffinityAdmission, PromptExperts

        return AffinityAdmission(self.config.affinity_max_wait, PromptExperts(self.model))

    def track_experts(self) -> None:
        """Record each step's distinct experts (stats.distinct_experts) and each sequence's last
        routing (`Sequence.last_experts`, affinity's prediction) from the MoE layers' taps."""
        if self.routing is None:
            self.routing = StepRouting(self.model)
            self.routing.attach()

    def keep_traces(self) -> None:
        """Keep every computed token's routing beside its KV (engine/expert_trace.py); with a store that
        takes hints, hand it each step's history prediction before the forward."""
        self.track_experts()
        if self.traces is None and self.routing.mlps:
            spec = self.model.spec
            self.traces = ExpertTraces(self.blocks.num_blocks, self.config.block_size, len(self.routing.mlps),
                                       spec.moe.router.top_k)

    def add_request(self, prompt_ids: list[int], params: SamplingParams, priority: int = 0) -> int:
        """Queue a request; returns its id. Raises RequestError when it can never run."""
        max_len = self.check_request(prompt_ids, params)
        rid = next(self._ids)
        seq = Sequence(rid, list(prompt_ids), params, self.eos_ids, max_len, priority=priority, arrival=rid)
        self._seqs[rid] = seq
        self.scheduler.add(seq)
        self.stats.prompt_tokens += len(prompt_ids)
        return rid

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Raise RequestError when the request could never run here; else its token limit (prompt +
        completion). Engines built from one config agree (a front end checks before choosing a rank)."""
        max_len = min(self.max_len, len(prompt_ids) + params.max_tokens)
        self._check(prompt_ids, max_len)
        return max_len

    def abort(self, request_id: int) -> bool:
        """Stop a request now and free its KV blocks; False if it is not running or waiting."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        seq.finish_reason = seq.finish_reason or "abort"
        self._finish(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def sequence(self, request_id: int) -> Sequence | None:
        return self._seqs.get(request_id)

    def step(self) -> list[RequestOutput]:
        if self.adaptive is not None:  # an adaptive k fits whole decode steps' times (drafting included)
            self.adaptive.step_began()
        if self.speculator is not None:
            self.draft()
        sched = self.scheduler.schedule()
        self.stats.preemptions = self.scheduler.num_preemptions
        self.stats.prefix_cache_hit_tokens = self.scheduler.cached_tokens
        if not sched.entries:
            return []
        if self.routing is not None:
            self.routing.begin()
        if self.traces is not None and self.model.experts.wants_hints:
            self._hint(sched)
        tokens = self.runner.execute(sched)
        if self.routing is not None:
            self._note_experts(sched)
        self.stats.steps[sched.kind.value] += 1
        self.stats.computed_tokens += sched.num_tokens
        verified = any(e.num_draft for e in sched.entries)
        self.stats.verify_steps += verified
        out = self._postprocess(sched, tokens)
        if self.adaptive is not None and verified:
            self.adaptive.step_verified()
        if self.speculator is not None and isinstance(self.speculator, HiddenStateSpeculator):  # MTP: drafts
            # from this step's hidden states (isinstance of a Protocol costs ~14 µs a step, even of None)
            self.speculator.observe(sched, self.runner.last_batch, self.runner.last_hidden)
        if self.adaptive is not None and sched.kind is StepKind.DECODE:
            self.adaptive.step_ended(sched.num_tokens, verified)
        return out

    def _hint(self, sched: SchedulerOutput) -> None:
        """History hints: per MoE layer, the experts the step's decodes chose in their last tokens."""
        predicted = self.traces.predict([e.seq for e in sched.entries if e.is_decode])  # [Lm] sets
        for mlp, experts in zip(self.routing.mlps, predicted):
            self.model.experts.hint(mlp.layer, sorted(experts))

    def _note_experts(self, sched: SchedulerOutput) -> None:
        heard = self.routing.finish([e.num_tokens for e in sched.entries])
        at = 0
        for e, keys in zip(sched.entries, heard.last):
            if keys:
                e.seq.last_experts = keys
            if self.traces is not None and heard.ids is not None:
                rows = heard.ids[at : at + e.num_tokens].numpy().astype("int16")  # [n, Lm, K]
                self.traces.write(e.seq, e.seq.num_computed_tokens, rows)
            at += e.num_tokens
        self.stats.expert_steps += 1
        self.stats.distinct_experts.append(heard.distinct)

    def draft(self) -> None:
        """Draft tokens for every decoding sequence before a step (the scheduler may cut them). A
        sequence asking for logprobs decodes plainly (its output carries one token's logprobs)."""
        seqs = [s for s in self.scheduler.running if not s.in_prefill and s.params.logprobs is None]
        for s in self.scheduler.running:
            s.draft_ids, s.draft_probs = [], None
        k = self.speculator.k if self.adaptive is None else self.adaptive.choose(len(seqs))
        # a draft fills positions up to num_tokens - 1 + k; keep them inside the sequence's limit
        limits = [min(k, s.max_len - s.num_tokens - 1) for s in seqs]
        for seq, draft in zip(seqs, self.speculator.propose(seqs, limits)):
            seq.draft_ids, seq.draft_probs = draft.tokens, draft.probs

    def _postprocess(self, sched: SchedulerOutput, tokens: list[list[int]]) -> list[RequestOutput]:
        out, failures = [], self.runner.failures
        for e, new in zip(sched.entries, tokens):
            seq = e.seq
            if e.num_draft:  # the KV kept: the last token's and the accepted drafts' (appended below)
                valid = seq.num_computed_tokens + 1 + max(len(new) - 1, 0)
            else:
                seq.num_computed_tokens += e.num_tokens
                self.blocks.commit(seq)
            if new or seq.seq_id in failures:
                seq.in_prefill = False
                for token in new or [None]:
                    out.append(self._output(seq, token, failures.get(seq.seq_id)))
                    if seq.finished:
                        break
            if e.num_draft:
                self._verified(e, new, min(valid, seq.num_tokens))
            if seq.finished:
                self._finish(seq)
                del self._seqs[seq.seq_id]
        return out

    def _verified(self, e, new: list[int], valid: int) -> None:
        """After a verify entry's tokens are appended: `valid` tokens have their KV computed; the
        rejected draft tokens' blocks go back; stats; the speculator told."""
        seq, accepted = e.seq, max(len(new) - 1, 0)
        seq.num_computed_tokens = valid
        self.blocks.commit(seq)
        self.blocks.trim(seq, seq.num_tokens)
        self.stats.verified += 1
        self.stats.draft_tokens += e.num_draft
        self.stats.accepted_tokens += accepted
        self.speculator.accepted(seq, accepted)
        if self.adaptive is not None:
            self.adaptive.heard(e.num_draft, accepted)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        if self.speculator is not None:
            self.speculator.forget(seq)

    def _output(self, seq: Sequence, token: int | None, error: str | None) -> RequestOutput:
        """The sampled token appended (stop strings, detokenization), or the sequence failed alone."""
        if error is None:
            try:
                delta = seq.append(token, self._detokenize)
                return RequestOutput(seq.seq_id, token, delta, seq.finish_reason, self.runner.logprobs.get(seq.seq_id))
            except Exception as exc:
                error = f"stop check failed: {type(exc).__name__}: {exc}"
        log.error("request %d failed alone, the step's other sequences carry on: %s", seq.seq_id, error)
        seq.finish_reason = "error"
        return RequestOutput(seq.seq_id, -1, "", "error", error=error)

    def reset(self) -> None:
        """After a step failed half-way: drop every request (their callers are told by whoever drives
        the engine) and start again from empty queues, a fresh block pool and an empty prefix cache.
        The KV pool's contents need no clearing: a block is zeroed when it is handed out."""
        old = self.scheduler
        if self.speculator is not None:
            for seq in self._seqs.values():
                self.speculator.forget(seq)
        self._seqs.clear()
        self.blocks = BlockManager(self.blocks.num_blocks, self.config.block_size, self.config.prefix_caching)
        self.scheduler = Scheduler(self.config, self.blocks, self._admission())
        self.scheduler.policy = old.policy
        self.scheduler.num_preemptions, self.scheduler.cached_tokens = old.num_preemptions, old.cached_tokens
        self.runner.logprobs, self.runner.failures = {}, {}

    def self_check(self) -> None:
        """One token through the model outside the scheduler (the observer is not told); raises if
        the engine cannot compute a step any more. Run on an empty engine only (it writes block 1)."""
        observer, self.runner.observer = self.runner.observer, None
        try:
            hidden = self.runner.forward_prompts([[0]])  # [1, D]
            self.model.logits(hidden)
        finally:
            self.runner.observer = observer

    def _detokenize(self, ids: list[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(ids, skip_special_tokens=True)

    def _check(self, prompt_ids: list[int], max_len: int) -> None:
        n = len(prompt_ids)
        if refusal := prompt_refusal(n, self.max_len):
            raise RequestError(refusal)
        if not self.config.chunked_prefill and n > self.config.max_num_batched_tokens:
            raise RequestError(f"the prompt has {n} tokens, over engine.max_num_batched_tokens="
                               f"{self.config.max_num_batched_tokens} with chunked prefill off")
        if self.blocks.blocks_for(max_len) > self.blocks.num_blocks:
            raise RequestError(f"a request of up to {max_len} tokens needs {self.blocks.blocks_for(max_len)} KV blocks "
                               f"but the cache has {self.blocks.num_blocks}; raise engine.num_kv_blocks or kv_cache_gb")


def _auto_blocks(model: MoETransformer, config: EngineConfig, max_len: int) -> int:
    """Blocks for max_num_seqs full contexts, capped by kv_cache_gb (at least one full context)."""
    per_block = bytes_per_token(model.spec, model.dtype) * config.block_size
    want = config.max_num_seqs * ((max_len + config.block_size - 1) // config.block_size)
    cap = int(config.kv_cache_gb * 2**30) // per_block
    return max(min(want, cap), (max_len + config.block_size - 1) // config.block_size)
