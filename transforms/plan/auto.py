"""``auto``: the more random of mixed (held within 0.001 of the reference) and budget, where as even.

Two candidates, each planned twice on the epoch's pool from its own generators (``rng.spawn(4)``):

1. ``mixed`` held within ``TOLERANCE`` (0.001) of the greedy equal-count reference (``mixed.plan_within``;
   at B == 1 ``balanced``'s jittered sort): as even as a sort of the costs, with what randomness that
   leaves (the default ``mixed`` allows 0.005);
2. ``budget`` (variable counts, equal cost per rank-step), within the caps.

Of the candidates whose first plan holds the caps and whose predicted linearity is within ``MARGIN`` (0.001)
of the best, the one whose two plans share the fewest step-mates (``pair_repeat_rate``: what the next epoch
would repeat) is chosen (ties: the order above), and its first plan returned. The choice is a function of
the pool, the seed and the epoch, so the same arguments give the same plan (``validate`` re-derives it);
the plan files show it (``rank_count`` B at every rank-step: mixed). Planning costs about four plans.

The plan is ``(S, W, M)`` int64 pool indices, ``-1`` padding where budget's counts vary.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan import budget, mixed
from lidarshard.transforms.plan.caps import PoolLimits, cap_breaches
from lidarshard.transforms.plan.metrics import linearity, pair_repeat_rate

__all__ = ["plan", "TOLERANCE", "MARGIN"]

#: How far below the greedy reference the even plan may be.
TOLERANCE = 0.001
#: How far below the most even candidate a more random one may be.
MARGIN = 0.001


def _fits(plan: NDArray[np.int64], costs: NDArray[np.float64], limits: PoolLimits | None) -> bool:
    """Whether ``plan`` (S, W, M) is within the caps of ``limits`` (none: yes)."""
    if limits is None or not limits.caps.active:
        return True
    return not cap_breaches(plan, limits.caps, costs, limits.points, limits.memory)


def plan(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    bucket_ids: NDArray[np.int32] | None,
    limits: PoolLimits | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch with the more random of ``mixed`` (within 0.001 of the reference) and ``budget``
    among those within ``MARGIN`` of the more even.

    Args:
        costs: (P,) pool costs, P % (W*B) == 0.

    Returns:
        (S, W, M) int64 pool indices, ``-1`` = empty slot (budget's variable counts).
    """
    gens = rng.spawn(4)
    w, b = world_size, batch_size
    plans = [
        [mixed.plan_within(costs, w, b, g, TOLERANCE) for g in gens[:2]],
        [budget.plan(costs, w, b, g, bucket_ids, limits) for g in gens[2:]],
    ]
    steps = costs.size // (w * b)  # auto keeps the pool's whole steps: budget may need more under a cap
    fits = [_fits(p[0], costs, limits) and len(p[0]) <= steps for p in plans]
    lins = [linearity(p[0], costs) if ok else -1.0 for p, ok in zip(plans, fits, strict=True)]
    even = [k for k, lin in enumerate(lins) if fits[k] and lin >= max(lins) - MARGIN]
    if not even:  # neither holds the caps in whole steps: mixed's plan, whose breach plan_epoch's check names
        return plans[0][0]
    pick = min(even, key=lambda k: (pair_repeat_rate(*plans[k]), k))
    return plans[pick][0]
