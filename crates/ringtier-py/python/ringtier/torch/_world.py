"""Which rank of how many this process is: given, or torch.distributed's, or ``RANK`` and
``WORLD_SIZE`` from the environment (what ``torchrun`` sets)."""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch.distributed as dist


def rank_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """``(rank, world_size)``: the given pair, else the initialised process group's, else
    ``RANK``/``WORLD_SIZE`` (``(0, 1)`` when unset). Giving only one of them is a ``ValueError``."""
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither (then torch.distributed's are used)")
    if rank is not None and world_size is not None:
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


__all__ = ["rank_world"]
