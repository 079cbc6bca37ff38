"""`moetune eval` assembled from resolved Targets: the deployment (the recipe's quant / offload) and
its reference built without prefix caching, perplexity of both on one text, and their agreement
(KL, top-1, greedy) on the held-out prompts. The command only parses, calls `evaluate` and prints."""

from __future__ import annotations

from moetune.bench.quality import EvalSettings


def reference_target(target, reference: str | None):
    """The reference of a deployment: `reference` (a checkpoint), else the same checkpoint without
    the recipe's quant and offload sections (refused for a checkpoint `moetune quantize` wrote)."""
    from moetune.config import parse_config
    from moetune.errors import UsageError
    from moetune.model.quant_checkpoint import read_block

    if reference is None and read_block(target.model_dir) is not None:
        raise UsageError(f"'{target.model_dir}' is a quantized checkpoint: give --reference DIR (its "
                         "full-precision source)")
    data = {**target.config.model_dump(), "quant": None, "offload": None}
    if reference is not None:
        data["model"] = {**data["model"], "path": reference}
    return target.with_config(parse_config(data, source="--reference"))


def evaluate(target, ref_target, body: str, texts: list[str], s: EvalSettings, bar=None) -> dict:
    """Perplexity of ours and the reference on `body`; agreement on the first `s.num_prompts` of `texts`.
    `bar`: a progress reporter (`phase(name, total)`, `update(advance=1)`: cli/progress.py), told each phase."""
    from moetune.bench.precision import model_precision
    from moetune.bench.quality import agreement, encode_prompts, perplexity
    from moetune.engine.build import build_generator

    def phase(name: str, total: int | None = None) -> None:
        if bar is not None:
            bar.phase(name, total)

    def hooks(name: str) -> dict:  # each measurement a phase: its steps are the bar's total
        if bar is None:
            return {}
        return {"on_start": lambda n: bar.phase(name, total=n), "on_step": lambda: bar.update(advance=1)}

    cfg = target.config
    phase("loading model")
    ours = build_generator(_no_prefix_cache(target))
    result = {"model": str(target.model_dir), "reference": str(ref_target.model_dir),
              "quant": cfg.quant.model_dump() if cfg.quant else None,
              "offload": cfg.offload.model_dump() if cfg.offload else None,
              "expert_bytes": ours.model.experts.nbytes(), "dense_bytes": ours.model.weight_bytes()["dense"],
              "precision": model_precision(ours.model)}
    result["perplexity"] = perplexity(ours, ours.encode(body), s, **hooks("perplexity windows"))
    phase("loading reference")
    ref = build_generator(_no_prefix_cache(ref_target))
    result["reference_perplexity"] = perplexity(ref, ref.encode(body), s, **hooks("reference perplexity windows"))
    result["agreement"] = agreement(ours, ref, encode_prompts(ours, texts, s), s, **hooks("agreement"))
    return result


def _no_prefix_cache(target):
    """forward_prompts writes the cache's first blocks directly: no prefix cache may point at them."""
    from moetune.config import parse_config

    data = target.config.model_dump()
    data["engine"] = {**data["engine"], "prefix_caching": False}
    return target.with_config(parse_config(data))
