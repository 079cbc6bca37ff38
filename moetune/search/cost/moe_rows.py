"""Which measured fused-MoE rows price an engine's expert format (cost/op_tables.py's `AicBackend.moe_rows`).

The package's tables fill a shape their engine version lacks from that engine's older collections (its
"shared layer": H200 vLLM 0.24.0 ← 0.19.0), and one quant mode's rows are whatever kernel its collector
ran. Each row carries its `kernel_source`; the rows that price a deployment are those of the kernel the
engine runs for the launch moetune writes:

| engine, expert format | what the launch runs | rows used |
|---|---|---|
| vLLM, per-tensor fp8 (`--quantization fp8`, online from a bf16 checkpoint) | its online fp8 MoE method: fp8 weights with dynamic per-tensor activation scales; vLLM's fp8 MoE oracle (`fused_moe/oracle/fp8.py`) offers FlashInfer CUTLASS only for static activation scales (ModelOpt checkpoints, `FlashInferExperts._supports_quant_scheme`), so it runs the Triton fused MoE | the newest version whose rows are a Triton kernel: vLLM 0.24.0's per-tensor fp8 rows are `vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts` (ModelOpt's static-scale method; 3–4× the bf16 Triton rows on Qwen3-30B-A3B at EP 1), so 0.19.0's `vllm_fused_moe` rows price it |
| anything else | the table's own kernel | the asked version's rows, else the newest older version holding the shape |

The trial's `op_sources` names the rows whenever they are not the asked version's own.
"""

from __future__ import annotations

# (engine, the tables' quant mode) → kernel_source substrings of what the engine runs for moetune's launch
ENGINE_KERNELS = {("vllm", "fp8"): ("triton", "vllm_fused_moe")}


def source_keys(db) -> list[tuple[str, dict]]:
    """(version, {(quant, D, I, K, E, tp, ep): kernel_source}) of each fused-MoE source the tables read, in
    their order (the asked version first); [] where the package's sources cannot be read."""
    try:
        import pyarrow.parquet as pq

        report = getattr(db, "_materialize_source_reports", None)  # the package's source report (0.12: no public
        if report is not None:  # name); without it, the reports the package made so far
            report()
        out = []
        cols = ["moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size"]
        for src in (getattr(db, "data_provenance", None) or {}).get("moe_perf.parquet", []):
            if src.get("exists"):
                t = pq.read_table(src["path"], columns=cols + ["kernel_source"]).to_pydict()
                out.append((str(src["version"]), dict(zip(zip(*(t[c] for c in cols)), t["kernel_source"]))))
        return out
    except Exception:  # a package layout without these reports: no row origin is named
        return []


def runs(engine: str, quant: str, kernel: str) -> bool:
    """Whether `kernel` (a row's kernel_source) is what the engine runs for this expert format."""
    wanted = ENGINE_KERNELS.get((engine, quant))
    return wanted is None or any(w in kernel for w in wanted)


def pick(sources: list[tuple[str, dict]], engine: str, asked: str, key: tuple) -> tuple[str | None, str | None]:
    """(the version to query for key's rows — None: the asked tables, whose own fill gives the first source
    holding it —, the note naming the rows where they are not the asked version's own kernel rows)."""
    holding = [(v, keys[key]) for v, keys in sources if key in keys]
    if not holding:
        return None, None
    quant = key[0]
    first_version, first_kernel = holding[0]
    good = next(((v, k) for v, k in holding if runs(engine, quant, k)), None)
    if good is None:  # only another method's kernel holds the shape: its rows, said
        return None, (f"{quant} fused-MoE rows of {engine} {first_version} are {first_kernel}, not what the launch "
                      "runs: no rows of that kernel")
    if good[0] == first_version:
        older = None if first_version == asked else (f"{quant} fused-MoE rows of {engine} {first_version}: the "
                                                     "asked version has none for this shape")
        return None, older
    version, kernel = good
    return version, (f"{quant} fused-MoE rows of {engine} {version} ({kernel}, what the launch runs): {engine} "
                     f"{first_version}'s are {first_kernel}, another quantization method's kernel")
