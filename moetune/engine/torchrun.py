"""Whether torchrun started this process, and as which rank: read from the environment alone (no
torch), so a command can size its mesh before torch loads."""

from __future__ import annotations

import os


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launching_rank() -> int:
    """The rank this process will be: torchrun's RANK, else 0 (this process spawns the others)."""
    return int(os.environ["RANK"]) if under_torchrun() else 0
