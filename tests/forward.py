"""Hidden states of whole prompts through the engine's ModelRunner (one prefill step, no scheduler)."""

import torch

from moetune.engine.model_runner import ModelRunner


def prompt_hidden(model, prompts: list[list[int]], block_size: int = 4) -> torch.Tensor:
    """[T, D]: every token of every prompt, in order."""
    blocks = sum(-(-len(p) // block_size) for p in prompts)
    return ModelRunner(model, num_blocks=blocks, block_size=block_size).forward_prompts(prompts)
