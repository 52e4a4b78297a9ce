"""Step order of a planned epoch: ``--heaviest-first`` puts the epoch's heaviest rank-step at step 0. Pure.

The steps of a plan may run in any order without changing a rank batch or the balance. Moving the step
that holds the heaviest rank-step (most points, most predicted cost or the highest predicted peak memory:
the sums the caps bound) to the
front makes a rank that cannot fit it in memory fail at the first step, not hours in (Hugging Face's
length-grouped sampler puts its longest batch first for the same reason). The build applies it once per
epoch, after the strategy (``lidarshard.transforms.core.planner.plan_samples``); ``lidarshard validate``
re-derives that plan and checks its step 0 with :func:`step_peaks`.

Plans are ``(S, W, M)`` int64 indices into ``values``, ``-1`` = empty slot.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan.caps import rank_step_sums

__all__ = ["HEAVIEST_FIRST", "step_peaks", "heaviest_step", "heaviest_first"]

#: ``--heaviest-first`` values: leave the order (``off``), or order by the rank-step sum of ``num_points``
#: (``points``), of predicted ``cost`` (``cost``) or of predicted bytes (``memory``: the memory model of
#: ``--max-step-memory``, whose base is the same for every rank-step).
HEAVIEST_FIRST = ("off", "points", "cost", "memory")


def step_peaks(plan: NDArray[np.int64], values: NDArray) -> NDArray:
    """(S,) the heaviest rank-step of each step: max over ranks of the sum of ``values`` (P,) over the
    rank's slots (``caps.rank_step_sums``; ``-1`` slots count 0)."""
    if plan.shape[0] == 0 or plan.shape[1] == 0:
        return np.zeros(plan.shape[0], dtype=np.asarray(values).dtype)
    return rank_step_sums(plan, values).max(axis=1)


def heaviest_step(plan: NDArray[np.int64], values: NDArray) -> int:
    """Index of the step holding the heaviest rank-step of ``plan`` (S, W, M) by ``values`` (P,); the
    lowest such index on ties, 0 for an empty plan."""
    peaks = step_peaks(plan, values)
    return int(np.argmax(peaks)) if peaks.size else 0


def heaviest_first(plan: NDArray[np.int64], values: NDArray) -> NDArray[np.int64]:
    """``plan`` (S, W, M) with step 0 and the :func:`heaviest_step` swapped; every other step stays in
    place and no rank batch changes. Returns ``plan`` itself when step 0 is already the heaviest."""
    k = heaviest_step(plan, values)
    if k == 0:
        return plan
    out = plan.copy()
    out[[0, k]] = plan[[k, 0]]
    return out
