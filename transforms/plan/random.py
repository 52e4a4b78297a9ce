"""``random``: the baseline, PyTorch ``DistributedSampler`` semantics.

One permutation of the pool per epoch; rank ``r`` takes ``perm[r::W]`` and cuts it into
consecutive batches of ``B``. The permutation comes from numpy's ``default_rng`` seeded by
``(seed, epoch, strategy)``, so this matches DistributedSampler's *semantics* (shuffle, then
interleave across ranks), not the exact permutation torch's ``randperm`` would draw.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan.caps import PoolLimits

__all__ = ["plan"]


def plan(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    bucket_ids: NDArray[np.int32] | None,
    limits: PoolLimits | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch ignoring costs.

    Returns:
        (S, W, B) int64 with ``plan[s, r, b] = perm[(s*B + b)*W + r]``, i.e. rank ``r``'s
        stream is ``perm[r::W]``.
    """
    del bucket_ids, limits  # cost-blind by definition
    perm = rng.permutation(costs.size).astype(np.int64)
    return perm.reshape(-1, batch_size, world_size).transpose(0, 2, 1).copy()
