"""Shared building blocks of the strategies: cut an order into steps, split steps across ranks.

All functions are vectorized across steps; the only Python loops run over the ``W * B`` slot
positions of one step.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan.lpt import lpt_assign

__all__ = ["partition_steps", "permute_ranks"]


def partition_steps(
    order: NDArray[np.int64], costs: NDArray[np.float64], world_size: int, batch_size: int
) -> NDArray[np.int64]:
    """Cut ``order`` into consecutive steps of ``W*B`` and split each step across ranks (LPT).

    Args:
        order: (P,) pool indices, P % (W*B) == 0; step ``s`` is ``order[s*W*B:(s+1)*W*B]``.
        costs: (P,) costs of the pool.

    Returns:
        (S, W, B) int64 pool indices; same step membership as ``order``.
    """
    steps = order.reshape(-1, world_size * batch_size)
    cols = lpt_assign(costs[steps], world_size, batch_size)
    s = steps.shape[0]
    return np.take_along_axis(steps, cols.reshape(s, -1), axis=1).reshape(cols.shape)


def permute_ranks(
    plan: NDArray[np.int64], rng: np.random.Generator, speeds: NDArray[np.float64] | None = None
) -> NDArray[np.int64]:
    """Relabel the ranks of every step by an independent random permutation.

    LPT puts the heaviest item on rank 0 and fills ranks in a fixed pattern; relabeling keeps
    every step's balance but stops any rank from being systematically heavy or light. With
    ``speeds`` (W,) a rank's batch moves only to a rank of the same speed (its work fits that speed).
    """
    s, w, _ = plan.shape
    key = rng.random((s, w))
    if speeds is not None:  # sort by speed first: a permutation within each group of equal speed
        groups = np.unique(speeds, return_inverse=True)[1]
        key = key + groups[None, :]
        perm = np.argsort(key, axis=1)
        place = np.argsort(np.argsort(groups, kind="stable"))  # rank r's place in speed order
        return np.take_along_axis(plan, perm[:, place][:, :, None], axis=1)
    perm = np.argsort(key, axis=1)
    return np.take_along_axis(plan, perm[:, :, None], axis=1)
