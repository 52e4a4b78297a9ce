"""``stratified``: the published recipe, every step draws from every cost bucket in proportion.

Each bucket is shuffled; its ``i``-th member (of ``n_k``) gets the fractional position
``(i + u) / n_k`` with ``u ~ U(0, 1)``; merging all buckets by position spreads each bucket
evenly over the epoch. The merged order is cut into steps of ``W*B`` and each step is split
across ranks with equal counts (LPT), with rank labels permuted per step.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.features.buckets import assign_buckets, default_num_buckets, quantile_edges
from lidarshard.transforms.plan._partition import partition_steps, permute_ranks
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
    """Plan one epoch with proportional bucket draws per step.

    Args:
        bucket_ids: (P,) bucket of each pool entry; ``None`` buckets ``costs`` by quantiles
            with ``default_num_buckets(P)``.

    Returns:
        (S, W, B) int64 pool indices.
    """
    del limits  # checked by plan_epoch
    p = costs.size
    if bucket_ids is None:
        bucket_ids = assign_buckets(costs, quantile_edges(costs, default_num_buckets(p)))
    ids = np.asarray(bucket_ids, dtype=np.int64)
    perm = rng.permutation(p)
    grouped = perm[np.argsort(ids[perm], kind="stable")]  # by bucket, shuffled within
    counts = np.bincount(ids, minlength=1)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    sizes = np.repeat(counts, counts).astype(np.float64)
    position = (np.arange(p) - starts + rng.random(p)) / sizes
    order = grouped[np.argsort(position, kind="stable")]
    return permute_ranks(partition_steps(order, costs, world_size, batch_size), rng)
