"""ServeMetrics: the server's Prometheus metrics in their own registry (prometheus-client).

Counters and histograms are updated by the handlers (event-loop thread); engine gauges and the
live expert load are read from the worker's snapshot and the load window when /metrics is scraped.
"""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from moetune.serve.expert_load import ExpertLoadWindow
from moetune.serve.worker import WorkerSnapshot

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0)
_TOKEN_GAP = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)


class ServeMetrics:
    def __init__(self, snapshot: WorkerSnapshot, window: ExpertLoadWindow):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("moetune_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("moetune_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("moetune_generation_tokens", "Tokens generated", registry=r)
        self.expert_flops = Counter("moetune_expert_flops", "Routed-expert FLOPs spent on requests (prompt and "
                                    "completion tokens, 6·D·I per token copy)", ["tenant"], registry=r)
        self.aborted = Counter("moetune_aborted_sequences", "Sequences aborted before finishing, by reason",
                               ["reason"], registry=r)
        self.deferred = Counter("moetune_qos_deferred_decodes", "Decodes held back a step because their tenant "
                                "was over its share of an expert's capacity", ["tenant"], registry=r)
        self.ttft = Histogram("moetune_time_to_first_token_seconds", "Arrival to first token",
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("moetune_inter_token_latency_seconds", "Time between two tokens of a sequence",
                             buckets=_TOKEN_GAP, registry=r)
        self.e2e = Histogram("moetune_e2e_request_latency_seconds", "Arrival to the last token of a request",
                             buckets=_LATENCY, registry=r)
        r.register(_EngineCollector(snapshot, window))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    def __init__(self, snapshot: WorkerSnapshot, window: ExpertLoadWindow):
        self.snapshot, self.window = snapshot, window

    def describe(self):
        return []  # collected on scrape only

    def collect(self):
        s = self.snapshot
        for name, doc, value in [
            ("moetune_queue_depth", "Sequences waiting to run (admitted, not yet scheduled)", s.waiting),
            ("moetune_running_sequences", "Sequences holding KV blocks and being computed", s.running),
            ("moetune_kv_blocks_used", "KV-cache blocks referenced by sequences", s.kv_blocks_used),
            ("moetune_kv_blocks_total", "KV-cache blocks in the pool", s.kv_blocks_total),
            ("moetune_engine_steps", "Engine steps run since start", s.steps),
            ("moetune_preemptions", "Sequences preempted (recomputed later) since start", s.preemptions),
            ("moetune_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache since start",
             s.prefix_cache_hit_tokens),
            ("moetune_engine_healthy", "1 while the engine takes requests, 0 once it failed and could not be "
             "reset (the server then exits non-zero)", s.healthy),
            ("moetune_engine_resets", "Times the engine was reset after a step failed", s.resets),
            *_speculative(s),
        ]:
            yield GaugeMetricFamily(name, doc, value=value)
        load = GaugeMetricFamily("moetune_expert_load", "Token copies routed to each expert over the last "
                                 "window of engine steps", labels=["layer", "expert"])
        balance = GaugeMetricFamily("moetune_expert_balancedness", "mean/max expert load per layer over the "
                                    "window (1 = even)", labels=["layer"])
        imbalance = GaugeMetricFamily("moetune_expert_imbalance", "max/mean expert load per layer over the "
                                      "window (1 = even)", labels=["layer"])
        for layer, counts, stats in self.window.stats():
            for expert, n in enumerate(counts):
                load.add_metric([str(layer), str(expert)], float(n))
            balance.add_metric([str(layer)], stats.balancedness)
            imbalance.add_metric([str(layer)], stats.imbalance)
        yield from (load, balance, imbalance)
        yield self._distinct()

    def _distinct(self) -> GaugeMetricFamily:
        """Distinct experts woken per engine step over the window (Σ over MoE layers): what expert-
        affinity scheduling lowers; quantiles of the window's steps, and their mean."""
        per_step = self.window.distinct_per_step()  # [S]
        g = GaugeMetricFamily("moetune_distinct_experts_per_step", "Distinct experts (summed over MoE layers) "
                              "an engine step woke, over the last window of steps", labels=["stat"])
        if len(per_step):
            for name, value in (("mean", per_step.mean()), ("p50", np.quantile(per_step, 0.5)),
                                ("p90", np.quantile(per_step, 0.9)), ("max", per_step.max())):
                g.add_metric([name], float(value))
        return g


def _speculative(s: WorkerSnapshot) -> list[tuple[str, str, float]]:
    """Speculative decoding since start (all 0 without engine.speculative)."""
    per_layer = 1 / s.expert_layers if s.expert_layers else 0.0
    per_step = 1 / s.verify_steps if s.verify_steps else 0.0
    return [
        ("moetune_spec_verify_steps", "Engine steps that verified draft tokens", s.verify_steps),
        ("moetune_spec_draft_tokens", "Draft tokens verified", s.draft_tokens),
        ("moetune_spec_accepted_tokens", "Draft tokens the target model accepted", s.accepted_tokens),
        ("moetune_spec_acceptance_rate", "Accepted / verified draft tokens",
         s.accepted_tokens / s.draft_tokens if s.draft_tokens else 0.0),
        ("moetune_spec_tokens_per_verify", "Tokens a sequence gained per verify (accepted drafts + 1)",
         (s.accepted_tokens + s.verified) / s.verified if s.verified else 0.0),
        ("moetune_spec_experts_per_layer_verify", "Distinct experts an MoE layer computed per verify step "
         "(the step's decode rows: last tokens and drafts)", s.experts_verify * per_layer),
        ("moetune_spec_experts_per_layer_plain", "Distinct experts the same steps' last tokens alone route to "
         "(a plain decode step at the same batch)", s.experts_plain * per_layer),
        ("moetune_spec_draft_experts_per_verify", "Distinct experts the drafter's MoE layer (an MTP block) read, "
         "per verify step (reads a plain decode never makes)", s.experts_draft * per_step),
    ]
