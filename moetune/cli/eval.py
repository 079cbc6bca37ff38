"""`moetune eval`: held-out perplexity of a deployment and its agreement with a reference model."""

from __future__ import annotations

from typing import Optional

import typer

from moetune.cli.options import ModelArgs, model_options


@model_options()
def eval_command(
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
    m: ModelArgs = ModelArgs(),
) -> None:
    """Perplexity (--text or the bundled sample); mean KL, top-1 and greedy agreement vs --reference."""
    import json
    from pathlib import Path

    from moetune.cli import checks
    from moetune.cli.options import apply_threads
    from moetune.engine.target import resolve_target

    if json_out not in (None, "-"):
        checks.output_file("--json", Path(json_out))
    cfg = m.checked()
    target = resolve_target(cfg)  # once: the checkpoint checked, device and dtype
    window = window if window is not None else min(512, target.spec.max_position)
    checks.context("--window", window, target.spec.max_position, "use a smaller --window")
    from moetune.bench.evaluate import evaluate, reference_target
    from moetune.bench.quality import EvalSettings

    ref_target = reference_target(target, reference)
    texts = _prompt_texts(prompts)
    body = _read_text(text)
    from moetune.cli.progress import progress

    apply_threads(cfg)
    s = EvalSettings(window=window, max_windows=max_windows, num_prompts=num_prompts, greedy_tokens=greedy_tokens)
    with progress("eval") as bar:
        result = evaluate(target, ref_target, body, texts, s, bar)
    if json_out == "-":
        print(json.dumps(result, indent=2))
        return
    if json_out is not None:
        Path(json_out).write_text(json.dumps(result, indent=2))
    a, p, rp = result["agreement"], result["perplexity"], result["reference_perplexity"]
    print(f"perplexity {p['ppl']:.4f} (reference {rp['ppl']:.4f}) over {p['tokens_scored']} tokens; "
          f"KL {a['kl']:.5f} nats, top-1 agreement {a['top1_agreement']:.4f} over {a['positions']} positions; "
          f"greedy match {a['greedy_match']:.3f}, greedy prefix {a['greedy_prefix']:.3f} over {a['prompts']} prompts; "
          f"expert bytes {result['expert_bytes'] / 1e6:.2f} MB, dense bytes {result['dense_bytes'] / 1e6:.2f} MB; "
          f"precision: {' · '.join(f'{k} {v}' for k, v in result['precision'].items())}")


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
