"""AIConfigurator's own static estimate of one configuration, as JSON on stdout: run by
bench_cluster_cases.py --peer with the Python of a throwaway venv holding `aiconfigurator`
(pip install aiconfigurator==0.12.0; outside this repo, never a moetune dependency).

  PEER_PYTHON peer_aiconfigurator.py MODEL_DIR SYSTEM ENGINE VERSION ISL OSL BATCH TP ATTN_DP MOE_TP MOE_EP
      [DIST [CTX [QUANT_JSON]]]

DIST: the MoE tables' token distribution (default balanced: every expert equally loaded, as moetune's
`--scale-routing balanced`; the peer's own default is power_law, alpha 1.2, set on its ModelConfig).
CTX > 0: its in-flight-batching steady state (`mode="agg"`, ctx_tokens CTX) instead of a static batch; the
output adds "mix_ops_ms" (its mixed step: CTX prompt tokens beside the decode rows, per op), "genonly_ops_ms"
(a decode-only step) and "scheduling" (how many of each a request's output spans, the rows of the mixed step).
QUANT_JSON: cli_estimate's quant keywords ({"gemm_quant_mode": "fp8", "kvcache_quant_mode": "fp8", ...}).

MODEL_DIR: a directory with the model's config.json (the package's own cached configs are copied
there by the benchmark). Prints {"ttft_ms", "tpot_ms", "tok_s_gpu", "decode_ops_ms": {op: ms per step}}.
"""

import json
import logging
import sys
import warnings


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import aiconfigurator.cli.api as api

    model, system, engine, version, isl, osl, batch, tp, dp, moe_tp, moe_ep = argv[:11]
    dist = argv[11] if len(argv) > 11 else "balanced"
    ctx_tokens = int(argv[12]) if len(argv) > 12 else 0
    quant = json.loads(argv[13]) if len(argv) > 13 else {}
    build = api._build_model_config  # the peer's own builder, its distribution set after (no CLI flag for it)

    def with_distribution(*args, **kwargs):
        cfg = build(*args, **kwargs)
        cfg.workload_distribution = dist
        return cfg

    api._build_model_config = with_distribution
    cli_estimate = api.cli_estimate
    steady = dict(mode="agg", ctx_tokens=ctx_tokens) if ctx_tokens > 0 else dict(mode="static")
    r = cli_estimate(model, system, backend_name=engine, backend_version=version or None,
                     isl=int(isl), osl=int(osl), batch_size=int(batch), tp_size=int(tp), attention_dp_size=int(dp),
                     moe_tp_size=int(moe_tp), moe_ep_size=int(moe_ep), **steady, **quant)
    if ctx_tokens > 0:
        ops = r.per_ops_data or {}
        print(json.dumps({"ttft_ms": float(r.ttft), "tpot_ms": float(r.tpot),
                          "tok_s_gpu": float(r.tokens_per_second_per_gpu), "version": r.backend_version,
                          "oom": bool(r.kv_cache_warning), "mix_ops_ms": ops.get("mix_step", {}),
                          "genonly_ops_ms": ops.get("genonly_step", {}), "scheduling": ops.get("scheduling", {})}))
        return
    gen = r.summary.get_generation_latency_dict() if r.summary is not None else {}
    ctx = r.summary.get_context_latency_dict() if r.summary is not None else {}
    steps = max(int(osl) - 1, 1)  # the generation dict sums the decode steps after the first token
    print(json.dumps({"ttft_ms": float(r.ttft), "tpot_ms": float(r.tpot), "tok_s_gpu": float(r.tokens_per_second_per_gpu),
                      "version": r.backend_version, "oom": bool(r.kv_cache_warning),
                      "decode_ops_ms": {k: float(v) / steps for k, v in gen.items()},
                      "prefill_ops_ms": {k: float(v) for k, v in ctx.items()}}))


if __name__ == "__main__":
    main(sys.argv[1:])
