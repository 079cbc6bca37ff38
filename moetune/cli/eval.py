"""`moetune eval`: held-out perplexity of a deployment and its agreement with a reference model."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import BackendOpt, DeviceOpt, DtypeOpt, ModelOpt, RecipeOpt


def eval_command(
    model: Optional[str] = ModelOpt,
    recipe: Optional[str] = RecipeOpt,
    reference: Optional[str] = typer.Option(None, "--reference", help="Reference checkpoint (default: the same "
                                            "checkpoint without the recipe's quant and offload sections)."),
    text: Optional[str] = typer.Option(None, "--text", help="Text file for perplexity (default: the bundled "
                                       "held-out sample)."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Prompts for KL / agreement (default: the "
                                          "bundled held-out prompts)."),
    num_prompts: int = typer.Option(32, "--num-prompts", min=1),
    window: Optional[int] = typer.Option(None, "--window", min=2, help="Perplexity window S in tokens (default: "
                                         "512, or the model's context if shorter)."),
    max_windows: Optional[int] = typer.Option(None, "--max-windows", min=1),
    greedy_tokens: int = typer.Option(16, "--greedy-tokens", min=1),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the numbers as JSON to this file "
                                           "('-' = stdout only, as JSON)."),
    dtype: Optional[str] = DtypeOpt,
    device: Optional[str] = DeviceOpt,
    kernel_backend: Optional[str] = BackendOpt,
) -> None:
    """Perplexity (--text or the bundled sample); mean KL, top-1 and greedy agreement vs --reference."""
    import json
    from pathlib import Path

    from moetune.cli import checks
    from moetune.cli.options import Target, checked_config

    if json_out not in (None, "-"):
        checks.output_file("--json", Path(json_out))
    cfg = checked_config(model, recipe, dtype, device, kernel_backend)
    target = Target(cfg)
    window = window if window is not None else min(512, target.spec.max_position)
    checks.context("--window", window, target.spec.max_position, "use a smaller --window")
    ref_cfg = _reference_config(cfg, reference, target)
    Target(ref_cfg)
    texts = _prompt_texts(prompts)
    body = _read_text(text)

    from moetune.bench.quality import EvalSettings, agreement, encode_prompts, perplexity
    from moetune.engine.build import build_generator

    s = EvalSettings(window=window, max_windows=max_windows, num_prompts=num_prompts, greedy_tokens=greedy_tokens)
    ours = build_generator(_no_prefix_cache(cfg))
    result = {"model": str(target.model_dir), "reference": str(Target(ref_cfg).model_dir),
              "quant": cfg.quant.model_dump() if cfg.quant else None,
              "offload": cfg.offload.model_dump() if cfg.offload else None,
              "expert_bytes": ours.model.experts.nbytes()}
    result["perplexity"] = perplexity(ours, ours.encode(body), s)
    ref = build_generator(_no_prefix_cache(ref_cfg))
    result["reference_perplexity"] = perplexity(ref, ref.encode(body), s)
    result["agreement"] = agreement(ours, ref, encode_prompts(ours, texts, s), s)
    if json_out == "-":
        print(json.dumps(result, indent=2))
        return
    if json_out is not None:
        Path(json_out).write_text(json.dumps(result, indent=2))
    a, p, rp = result["agreement"], result["perplexity"], result["reference_perplexity"]
    print(f"perplexity {p['ppl']:.4f} (reference {rp['ppl']:.4f}) over {p['tokens_scored']} tokens; "
          f"KL {a['kl']:.5f} nats, top-1 agreement {a['top1_agreement']:.4f} over {a['positions']} positions; "
          f"greedy match {a['greedy_match']:.3f}, greedy prefix {a['greedy_prefix']:.3f} over {a['prompts']} prompts; "
          f"expert bytes {result['expert_bytes'] / 1e6:.2f} MB")


def _reference_config(cfg, reference: Optional[str], target):
    from moetune.config import parse_config
    from moetune.errors import UsageError
    from moetune.model.quant_checkpoint import read_quantization

    if reference is None and read_quantization(target.model_dir, target.spec) is not None:
        raise UsageError(f"'{target.model_dir}' is a quantized checkpoint: give --reference DIR (its "
                         "full-precision source)")
    data = {**cfg.model_dump(), "quant": None, "offload": None}
    if reference is not None:
        data["model"] = {**data["model"], "path": reference}
    return parse_config(data, source="--reference")


def _no_prefix_cache(cfg):
    """forward_prompts writes the cache's first blocks directly: no prefix cache may point at them."""
    from moetune.config import parse_config

    data = cfg.model_dump()
    data["engine"] = {**data["engine"], "prefix_caching": False}
    return parse_config(data)


def _read_text(path: Optional[str]) -> str:
    from pathlib import Path

    from moetune.errors import UsageError
    from moetune.model.registry import bundled_asset

    file = Path(path) if path is not None else bundled_asset("eval/heldout-sample.txt")
    try:
        body = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--text '{file}' cannot be read as UTF-8 text ({getattr(exc, 'strerror', None) or exc})") \
            from None
    if len(body.strip()) < 2:
        raise UsageError(f"--text '{file}' is empty; perplexity needs at least two tokens")
    return body


def _prompt_texts(path: Optional[str]) -> list[str]:
    from pathlib import Path

    from moetune.profile.workload import Workload, load_prompt_texts, prompts_path

    return load_prompt_texts(Path(path) if path is not None else prompts_path(Workload()))
