"""``megabatch``: a length-grouped baseline in the style of HF transformers' LengthGroupedSampler.

A random permutation is cut into megabatches of ``m * W * B`` with ``m = clamp(S // 4, 1, 50)``
steps (HF's ``mega_batch_mult`` rule: at most 50, at most a quarter of the epoch, so a small
pool still gets four megabatches to shuffle between); each megabatch is sorted by
cost, heaviest first, then cut into steps. Within a step rank ``r`` takes the ``r``-th
consecutive batch of ``B`` (how ``accelerate`` shards a batch sampler). Unlike HF, the
heaviest sample is not moved to the first step, and the megabatch spans all ranks.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan.caps import PoolLimits

__all__ = ["plan", "MEGABATCH_MULT", "megabatch_steps"]

#: Most steps per megabatch (HF's ``mega_batch_mult`` default).
MEGABATCH_MULT = 50


def megabatch_steps(num_steps: int) -> int:
    """Steps per megabatch for an epoch of ``num_steps`` steps: ``clamp(S // 4, 1, 50)``."""
    return max(1, min(num_steps // 4, MEGABATCH_MULT))


def plan(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    bucket_ids: NDArray[np.int32] | None,
    limits: PoolLimits | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch by sorting random megabatches.

    Returns:
        (S, W, B) int64 pool indices; ``plan[s, r]`` is positions ``r*B .. r*B+B-1`` of step ``s``.
    """
    del bucket_ids, limits
    step = world_size * batch_size
    perm = rng.permutation(costs.size)
    mega = np.arange(costs.size) // (megabatch_steps(costs.size // step) * step)
    order = perm[np.lexsort((-costs[perm], mega))]
    return order.astype(np.int64).reshape(-1, world_size, batch_size)
