"""Who this process is in the job: its global rank and the world size.

The one place that decides it: the default process group's when torch.distributed is
initialized, else torchrun's ``$RANK`` / ``$WORLD_SIZE``, else rank 0 of 1. Never raises and
never imports torch when it is not imported yet (a process that has not imported torch has no
process group).
"""

from __future__ import annotations

import os
import sys


def _from_dist() -> tuple[int, int] | None:
    """(rank, world size) of the default process group, None when there is none."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        return None
    return None


def env_rank() -> int | None:
    """``$RANK`` as torchrun sets it; None when unset or not a whole number."""
    value = os.environ.get("RANK", "")
    return int(value) if value.isdigit() else None


def process_rank() -> int:
    """This process' global rank: the default group's when it exists, else ``$RANK``, else 0."""
    known = _from_dist()
    if known is not None:
        return known[0]
    rank = env_rank()
    return rank if rank is not None else 0


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): the default group's, else ``$RANK`` / ``$WORLD_SIZE``, else (0, 1)."""
    known = _from_dist()
    if known is not None:
        return known
    world = os.environ.get("WORLD_SIZE", "")
    return process_rank(), (int(world) if world.isdigit() else 1)
