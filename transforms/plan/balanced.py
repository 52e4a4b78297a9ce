"""``balanced``: group similar costs into the same step, then split each step evenly.

Per-step partitioning alone is capped by the largest sample of a random step; what works is
putting similar-cost samples into the same step. The best equal-count plan (``bound``: sort all
costs, cut into consecutive steps, split each step) has no randomness, so this strategy sorts by
a *jittered* key ``log(cost) + eps * u`` with ``u ~ U(-1, 1)``: where costs are dense, samples
within a factor ``~exp(2 eps)`` of each other swap places between epochs; the sparse heavy tail
stays nearly sorted. Then:

1. cut the jittered order into steps of ``W*B``;
2. split each step across ranks (LPT with equal counts; ``B == 1`` is one item per rank);
3. permute rank labels per step (no rank is systematically heavy);
4. shuffle the step order (no size-sorted curriculum).

``eps`` is chosen per epoch: the largest value on ``EPS_LADDER`` whose linearity is within
``TOLERANCE`` of the bound, found by bisection (linearity falls as eps grows). So randomness is
as large as balance allows. The last rung, 0, sorts exactly (ties broken randomly) and reaches
the bound by construction.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan._partition import partition_steps, permute_ranks
from lidarshard.transforms.plan.caps import PoolLimits
from lidarshard.transforms.plan.metrics import greedy_reference_linearity, step_linearity

__all__ = ["plan", "plan_within", "choose_eps", "log_cost", "jittered_order", "EPS_LADDER", "TOLERANCE"]

#: Jitter amplitudes in natural-log units, largest (most random) first, halving down to ~6e-5,
#: then 0. The fine end matters for B == 1, where a step's max-to-mean spread grows about
#: linearly with eps, so ``TOLERANCE`` allows eps of only a few thousandths; that still mixes
#: hundreds of neighbours where costs are dense.
EPS_LADDER = tuple(2.0**-k for k in range(-1, 15)) + (0.0,)
#: Accept an eps whose predicted linearity is at least ``bound - TOLERANCE``.
TOLERANCE = 0.005


_LN2 = 0.6931471805599453


def portable_log(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Natural log of x > 0 built only from frexp, +, *, / (each correctly rounded by IEEE 754).

    ``np.log`` may differ by an ulp between CPUs (SIMD dispatch), which could reorder the jittered
    sort and break byte-identical plans across workers; this one gives the same bits everywhere.
    Absolute error < 1e-12 (atanh series on the mantissa in [0.5, 1)).
    """
    m, e = np.frexp(x)
    z = (m - 1.0) / (m + 1.0)  # in [-1/3, 0)
    s = z * z
    acc = np.full_like(z, 1.0 / 31.0)
    for k in range(29, 0, -2):  # Horner over 1 + s/3 + s^2/5 + ... + s^15/31
        acc = acc * s + 1.0 / k
    return e * _LN2 + 2.0 * z * acc


def log_cost(costs: NDArray[np.float64]) -> NDArray[np.float64]:
    """(P,) log of costs; zero costs are clamped to half the smallest positive cost."""
    positive = costs[costs > 0]
    floor = positive.min() / 2 if positive.size else 1.0
    return portable_log(np.maximum(costs, floor))


def jittered_order(logc: NDArray[np.float64], u: NDArray[np.float64], eps: float) -> NDArray[np.int64]:
    """(P,) order by ``logc + eps * u``; eps 0 sorts exactly, ``u`` breaking ties."""
    if eps == 0:
        return np.lexsort((u, logc)).astype(np.int64, copy=False)  # exact sort, random tie-break
    return np.argsort(logc + eps * u, kind="stable").astype(np.int64, copy=False)


def _linearity(order: NDArray[np.int64], costs: NDArray[np.float64], w: int, b: int) -> float:
    return step_linearity(costs[order].reshape(-1, w * b), w, b)


def choose_eps(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    u: NDArray[np.float64],
    tolerance: float = TOLERANCE,
) -> tuple[float, NDArray[np.int64]]:
    """Largest ladder eps within ``tolerance`` of the bound, and its (P,) step order.

    Args:
        costs: (P,) pool costs, P % (W*B) == 0.
        u: (P,) jitter draws in [-1, 1).
    """
    w, b = world_size, batch_size
    logc = log_cost(costs)
    bound = greedy_reference_linearity(costs, w, b)
    lo, hi = 0, len(EPS_LADDER) - 1  # invariant: rung hi passes
    best = None  # the order of rung hi once computed (only the newest passing one is held)
    while lo < hi:
        mid = (lo + hi) // 2
        order = jittered_order(logc, u, EPS_LADDER[mid])
        if _linearity(order, costs, w, b) >= bound - tolerance:
            hi, best = mid, order
        else:
            lo = mid + 1
        del order
    return EPS_LADDER[hi], best if best is not None else jittered_order(logc, u, EPS_LADDER[hi])


def plan(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    bucket_ids: NDArray[np.int32] | None,
    limits: PoolLimits | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch close to the equal-count bound, with as much randomness as it allows.

    Returns:
        (S, W, B) int64 pool indices.
    """
    del bucket_ids, limits  # works on exact costs
    return plan_within(costs, world_size, batch_size, rng, TOLERANCE)


def plan_within(
    costs: NDArray[np.float64], world_size: int, batch_size: int, rng: np.random.Generator, tolerance: float
) -> NDArray[np.int64]:
    """``plan`` held within ``tolerance`` of the bound (``plan`` is ``TOLERANCE``'s): (S, W, B) pool indices."""
    u = rng.uniform(-1.0, 1.0, costs.size)
    _, order = choose_eps(costs, world_size, batch_size, u, tolerance)
    steps = permute_ranks(partition_steps(order, costs, world_size, batch_size), rng)
    return steps[rng.permutation(steps.shape[0])]
