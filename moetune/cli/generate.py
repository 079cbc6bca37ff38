"""`moetune generate`: stream one completion to stdout (only the completion; the rest to stderr)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from moetune.cli.options import ModelArgs, flag, model_options


@model_options("ep", "tp", "spec")
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="Prompt text."),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    stop: List[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    ignore_eos: bool = flag(False, "--ignore-eos"),
    chat: bool = flag(False, "--chat", help="Wrap the prompt as a user message with the model's "
                                                             "chat template."),
    m: ModelArgs = ModelArgs(),
) -> None:
    """Generate a completion for one prompt, streamed to stdout."""
    import functools

    from moetune.cli import checks

    checks.sampling(max_tokens, temperature, top_p, top_k, seed)
    checks.text("--prompt", prompt)
    for s in stop:
        checks.text("--stop", s)
    cfg = m.checked()  # the flags and the recipe, before torch loads (a mistake here answers in a blink)
    from moetune.cli.footprint import target_parts
    from moetune.cli.options import apply_threads
    from moetune.engine.limits import context_words, max_len_of
    from moetune.engine.target import resolve_target
    from moetune.model.checkpoint import open_checkpoint

    checkpoint = open_checkpoint(cfg.model.path)  # config.json and the safetensors headers: no torch yet
    limit = max_len_of(cfg.engine, checkpoint.spec.max_position)  # the engine's rule (engine.max_model_len cuts)
    if max_tokens > limit - 1:  # never cut silently: the context holds the prompt too
        from moetune.errors import UsageError

        whose = context_words(cfg.engine, checkpoint.spec.max_position)
        raise UsageError(f"--max-tokens {max_tokens} is more than {whose} of {limit:,} tokens leaves "
                         f"after a prompt; give at most {limit - 1:,}")
    target = resolve_target(cfg, checkpoint)  # once: the placement, device and dtype; a speculator it refuses
    tokenizer, ids = _prompt_ids(target, prompt, chat)  # refused here when over the context, not after the load
    prompt_tokens = len(ids)
    checks.fits("generate", target_parts(target, 1, min(prompt_tokens + max_tokens, limit), prompt_tokens,
                                         prompt_tokens), target.device, "use a smaller model or --dtype bf16")
    from moetune.engine.build import build_generator
    from moetune.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=seed, stop=tuple(stop), ignore_eos=ignore_eos)
    if cfg.parallel.world > 1:
        from moetune.engine.distributed import run_ranks

        run_ranks(cfg, functools.partial(_stream_rank, ids, params))
        return
    apply_threads(cfg)
    generator = build_generator(target, tokenizer=tokenizer)
    _print(generator.stream(ids, params))


def _prompt_ids(target, prompt: str, chat: bool) -> tuple[object, list[int]]:
    """(the checkpoint's tokenizer, the prompt's ids as the engine will run them), refused by the engine's
    own rule when the context cannot hold them: the tokenizer loads in a moment, the model (its kernels
    compiled) in tens of seconds."""
    from moetune.engine.limits import prompt_refusal
    from moetune.engine.tokenizer import load_encoder
    from moetune.errors import RequestError

    tokenizer, encode = load_encoder(target.model_dir, target.spec)
    ids = encode(_prompt(tokenizer, prompt, chat))
    if refusal := prompt_refusal(len(ids), target.max_len):
        raise RequestError(f"prompt 0: {refusal}")  # the words the Generator uses for its one prompt
    return tokenizer, ids


def _stream_rank(ids: list[int], params, dp) -> None:
    """Every rank steps; rank 0 serves the one request and alone prints."""
    pieces = dp.stream(ids, params)
    if dp.rank == 0:
        _print(pieces)
    else:
        for _ in pieces:
            pass


def _prompt(tokenizer, prompt: str, chat: bool) -> str:
    if not chat:
        return prompt
    from moetune.engine.tokenizer import apply_chat_template

    return apply_chat_template(tokenizer, [{"role": "user", "content": prompt}])


def _print(pieces) -> None:
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
