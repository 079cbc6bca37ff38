"""The MoE layer as phases: router → permute → dispatch → experts → combine → unpermute."""
