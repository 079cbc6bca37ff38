"""AIConfigurator's own search and its steady-state estimate of one deployment, as JSON on stdout: run by
`bench_cluster_cases.py --cross` (benchmarks/peer_cross.py) with the Python of a throwaway venv holding
`aiconfigurator` (pip install aiconfigurator==0.12.0; never a moetune dependency). Each side at its own
defaults (the peer's MoE tables at its default power-law token distribution).

  PEER_PYTHON peer_best.py best MODEL_DIR GPUS SYSTEM ENGINE ISL OSL TTFT_MS TPOT_MS
      its default agg-vs-disagg search (`cli_default`): the chosen experiment's best row, both experiments' best
  PEER_PYTHON peer_best.py agg MODEL_DIR SYSTEM ENGINE ISL OSL JSON
      `cli_estimate(mode="agg")` (its in-flight batching steady state) of the deployment in JSON
      ({"batch_size", "ctx_tokens", "tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
      "gemm_quant_mode", "moe_quant_mode", "kvcache_quant_mode"}; "mode": "disagg" and the prefill_* /
      decode_* fields of cli_estimate for a disaggregated one)
"""

import json
import logging
import sys
import warnings

KEEP = ("concurrency", "bs", "ttft", "tpot", "tokens/s/gpu", "tokens/s/gpu_cluster", "num_total_gpus", "tp", "dp",
        "moe_tp", "moe_ep", "gemm", "kvcache", "moe", "ctx_tokens", "(p)bs", "(p)workers", "(d)bs", "(d)workers",
        "(p)tp", "(p)dp", "(p)moe_tp", "(p)moe_ep", "(d)tp", "(d)dp", "(d)moe_tp", "(d)moe_ep", "(p)gemm", "(p)moe",
        "(p)kvcache", "(d)gemm", "(d)moe", "(d)kvcache")


def _plain(v):
    return v.item() if hasattr(v, "item") else v


def best(model, gpus, system, engine, isl, osl, ttft, tpot) -> dict:
    import aiconfigurator.cli.api as api

    r = api.cli_default(model, int(gpus), system, backend=engine, isl=int(isl), osl=int(osl), ttft=float(ttft),
                        tpot=float(tpot))
    rows = {}
    for exp, df in r.best_configs.items():
        if df is not None and len(df):
            rows[exp] = {k: _plain(df.iloc[0][k]) for k in KEEP if k in df.columns}
    return {"chosen": r.chosen_exp, "throughputs": {k: float(v) for k, v in r.best_throughputs.items()}, "rows": rows}


def agg(model, system, engine, isl, osl, spec: str) -> dict:
    import aiconfigurator.cli.api as api

    kw = json.loads(spec)
    r = api.cli_estimate(model, system, backend_name=engine, isl=int(isl), osl=int(osl), **kw)
    return {"ttft_ms": float(r.ttft), "tpot_ms": float(r.tpot), "tok_s_gpu": float(r.tokens_per_second_per_gpu),
            "concurrency": float(r.concurrency), "oom": bool(getattr(r, "kv_cache_warning", False))}


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    out = best(*argv[1:9]) if argv[0] == "best" else agg(*argv[1:7])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
