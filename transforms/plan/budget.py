"""``budget``: every rank gets the same predicted cost at every step; counts per rank may differ.

Equal-count plans are capped by the equal-count bound, which falls on heavy tails. Here a rank
that gets one large scene and a rank that gets three small ones do the same work. For S steps
(``S = P // (W*B)``, so the mean count per rank-step is B) the S*W rank-steps are *bins*:

1. order the pool heaviest first by a jittered key ``log(cost) + jitter * u`` (u ~ U(-1, 1));
   ``jitter`` is the largest on ``JITTER_LADDER`` whose plan stays within ``TOLERANCE`` of the
   exact order's linearity and at or above ``FLOOR`` where the exact order reaches it (within
   ``TOLERANCE_UNDER`` where it does not); bisection, the jittered plans keeping the exact order's
   step count and way of packing; so plans differ between epochs as much as balance allows;
2. targets: every bin targets the level ``lambda`` that spreads the total cost evenly, except
   *high steps*: while the items heavier than ``lambda`` do not fit into the high steps'
   capacity, the heaviest item that does not fit opens a high step whose W bins target its cost
   (``lambda`` is recomputed from the cost left), so one big scene is matched by several small
   ones on the other ranks; where the fill pushes a high step's bins above its target, the step's
   target is raised to its heaviest bin (the largest overshoots first, within ``RAISE_SHARE`` of
   the free bins' cost) and the pool packed again, ``REFINE`` times; the best plan is kept;
3. fill: the items, heaviest first, each go to the bin furthest below its target that still fits
   the caps (LPT against targets; ties broken by a random bin order); zero-cost items go to the
   bins holding the fewest samples; an empty bin takes the lightest item of the fullest bin
   (``_budget_fill``: vectorized in rounds; with caps the rounds hold up to the first item they
   would put over a cap and a heap that parks blocked bins goes on from there; the same
   assignment);
4. the other bins are sorted by load and cut into steps of W (similar loads share a step);
   rank labels are permuted per step and the step order is shuffled.

Each step count is also packed the *sorted* way (the S*W heaviest items one per bin in key
order, consecutive bins a step, the rest filling each bin up to its step's heaviest bin),
which wins near one item per bin; the better of the two is kept. When the pool is exactly one
item per bin that is the exact sort cut into steps of W, the equal-count optimum.

With ``B == 1`` every bin would hold exactly one item; so when a plan misses ``TARGET`` the
strategy retries with fewer steps, raising the mean count per rank-step by up to 5%
(``SLACK_LADDER``), and keeps the first plan that reaches ``TARGET`` (else the best one).
Caps (``PoolLimits``) are honoured by construction: a bin never takes an item that would push it
over a cap, and the number of steps is raised until the caps leave room for every item. The memory
cap is planned through the points room (``_memory_as_points``), so it cannot be combined with a points cap.

The plan is ``(S, W, M)`` int64 pool indices, ``M`` the largest count, ``-1`` padding the rest;
every rank-step holds at least one sample.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan._budget_fill import Packed, fill
from lidarshard.transforms.plan._partition import permute_ranks
from lidarshard.transforms.plan.balanced import log_cost
from lidarshard.transforms.plan.caps import Caps, PoolLimits
from lidarshard.transforms.plan.metrics import load_linearity

__all__ = [
    "plan",
    "caps_problem",
    "SLACK_LADDER",
    "TARGET",
    "JITTER_LADDER",
    "TOLERANCE",
    "FLOOR",
    "TOLERANCE_UNDER",
    "REFINE",
    "RAISE_SHARE",
]

#: Mean-count factors tried in turn (fewer steps, more samples per rank-step): at most +5%.
SLACK_LADDER = (1.0, 1.01, 1.02, 1.03, 1.04, 1.05)
#: Predicted linearity at which the ladder stops.
TARGET = 0.995
#: Jitter amplitudes of the heaviest-first order (natural-log units), most random first, halving
#: to ~6e-5 (the fine end matters near one sample per bin, as for ``balanced``); the largest whose
#: plan stays within ``TOLERANCE`` of the exact order's linearity is used.
JITTER_LADDER = tuple(2.0**-k for k in range(0, 15))
#: Linearity that randomness may cost (against the unjittered plan) ...
TOLERANCE = 0.005
#: ... but never below this, where the unjittered plan reaches it; where it does not, randomness
#: may cost only ``TOLERANCE_UNDER``.
FLOOR = 0.99
TOLERANCE_UNDER = 0.001
#: Times a water-level packing is redone with its high steps' targets raised to their heaviest bins
#: (the best plan is kept) ...
REFINE = 2
#: ... by at most this share of the free bins' cost at a time (B = 1 leaves them little).
RAISE_SHARE = 0.3


def _levels(x: NDArray[np.float64], steps: int, w: float) -> tuple[NDArray[np.float64], float]:
    """((k,) targets of the k high steps, free level lambda) for heaviest-first costs ``x``.

    The free level is what the cost left after the high steps gives each remaining bin; items above
    it must fit into the high steps' capacity ``W * sum(targets)``. While they do not, the heaviest
    item that does not fit opens another high step at its own cost.
    """
    total, csum, neg = float(x.sum()), np.cumsum(x), -x
    tops: list[float] = []
    cap = lam = 0.0
    while len(tops) < steps:
        lam = (total - w * cap) / (w * (steps - len(tops)))
        above = int(np.searchsorted(neg, -lam, side="left"))  # items heavier than lam
        if lam <= 0 or above == 0 or csum[above - 1] <= w * cap:
            break
        tops.append(float(x[min(int(np.searchsorted(csum, w * cap, side="right")), x.size - 1)]))
        cap += tops[-1]
    return np.asarray(tops), max(lam, 0.0) if len(tops) < steps else 0.0


def _raised(tops: NDArray[np.float64], heaviest: NDArray[np.float64], room: float) -> NDArray[np.float64]:
    """(k,) high-step targets raised to their heaviest bins (k,), the largest overshoots first, as
    long as the raises add up to at most ``room`` per rank (cost the free bins give up); a copy."""
    over = np.maximum(heaviest - tops, 0.0)
    first = np.argsort(-over, kind="stable")
    take = first[np.cumsum(over[first]) <= room]
    out = tops.copy()
    out[take] += over[take]
    return out


def _pack(
    order: NDArray[np.int64],
    costs: NDArray[np.float64],
    steps: int,
    w: int,
    limits: PoolLimits,
    tie: NDArray,
    speeds: NDArray[np.float64] | None = None,
) -> tuple[Packed, int] | None:
    """Water-level packing: every item of ``order`` (heaviest first) to one of ``steps * w`` bins.

    The fill may push a high step's bins above its target (an item larger than every bin's room);
    then the step's target is raised to its heaviest bin (``_raised``), the free level lowered to
    match, and the pool packed again, ``REFINE`` times (no more once a plan reaches ``TARGET``); the
    best of the plans is returned.

    With ``speeds`` (W,) the levels are times on the fastest rank: bin ``i`` is rank ``i % W``'s and
    targets the level times that rank's speed (``_times``).

    Returns:
        (bins, k high steps: bins ``0 .. k*W-1``, step by step), or None where the caps block.
    """
    n = steps * w
    x = costs[order]
    if n == x.size:  # one sample per bin: the equal-count optimum
        return _pack_sorted(order, costs, steps, w, limits, tie, speeds)
    fast = 1.0 if speeds is None else float(speeds.max())  # items as times on the fastest rank, x / fast;
    ws = w if speeds is None else float(speeds.sum()) / fast  # a step at time L holds L * ws of them
    tops, lam = _levels(x if speeds is None else x / fast, steps, ws)
    k, total = tops.size, float(x.sum()) / fast
    per_bin = np.ones(w) if speeds is None else speeds  # (W,) cost per unit of level: levels are times
    best: tuple[float, Packed] | None = None
    for _ in range(REFINE + 1):
        target = np.full(n, lam)
        target[: k * w] = np.repeat(tops, w)
        if speeds is not None:
            target *= np.tile(per_bin, steps)
        bins = fill(order[:0], order, target, costs, tie, limits)
        if bins is None:
            break
        lin = load_linearity(_times(bins.loads[_steps_of(bins, k, w, speeds)], speeds))
        if best is None or lin > best[0]:
            best = (lin, bins)
        if k == 0 or k == steps or lin >= TARGET:  # no high step, no free bin to give up cost, or good
            break
        high = bins.loads[: k * w].reshape(k, w) / per_bin[None, :]  # as levels
        raised = _raised(tops, high.max(axis=1), RAISE_SHARE * lam * (steps - k))
        lam = (total - ws * float(raised.sum())) / (ws * (steps - k))
        if np.array_equal(raised, tops) or lam <= 0.0:  # nothing to raise, or no cost left to move
            break
        tops = raised
    return None if best is None else (best[1], k)


def _pack_sorted(
    order: NDArray[np.int64],
    costs: NDArray[np.float64],
    steps: int,
    w: int,
    limits: PoolLimits,
    tie: NDArray,
    speeds: NDArray[np.float64] | None = None,
) -> tuple[Packed, int] | None:
    """Sorted packing: the ``steps * w`` heaviest items one per bin in ``order`` (consecutive bins
    form a step), then the rest fill each bin up to its step's heaviest bin (LPT). Best when the
    pool holds about one item per bin (``B == 1``); all ``steps`` keep their grouping. With ``speeds``
    each step's k-th heaviest item goes to its k-th fastest rank and the bins fill up to the step's
    slowest time, in proportion to their speed."""
    n = steps * w
    if speeds is None:
        target = costs[order[:n]].reshape(steps, w).max(axis=1).repeat(w)
        bins = fill(order[:n], order[n:], target, costs, tie, limits)
        return None if bins is None else (bins, steps)
    heads = order[:n].reshape(steps, w)
    heads = np.take_along_axis(heads, np.argsort(-costs[heads], axis=1, kind="stable"), axis=1)
    seeded = np.empty_like(heads)
    seeded[:, np.argsort(-speeds, kind="stable")] = heads  # heaviest of a step on its fastest rank
    level = (costs[seeded] / speeds[None, :]).max(axis=1)  # (steps,) the step's time
    target = (level[:, None] * speeds[None, :]).reshape(-1)
    bins = fill(seeded.reshape(-1), order[n:], target, costs, tie, limits)
    return None if bins is None else (bins, steps)


def _steps_of(bins: Packed, k: int, w: int, speeds: NDArray[np.float64] | None = None) -> NDArray[np.int64]:
    """(S, W) bin ids per step: tail steps as packed, the rest sorted by load and cut into steps of W;
    with ``speeds`` bin ``i`` is rank ``i % W``'s: each rank's free bins sorted by load, the m-th of
    every rank a step (column r holds rank r's bins)."""
    n = bins.loads.size
    if speeds is not None:
        grid = np.arange(k * w, n).reshape(-1, w)  # (S - k, W): rank r's free bins in column r
        grid = np.take_along_axis(grid, np.argsort(bins.loads[grid], axis=0, kind="stable"), axis=0)
        return np.concatenate([np.arange(k * w).reshape(-1, w), grid])
    free = np.arange(k * w, n)
    free = free[np.argsort(bins.loads[free], kind="stable")]
    return np.concatenate([np.arange(k * w), free]).reshape(-1, w)


def _times(loads: NDArray[np.float64], speeds: NDArray[np.float64] | None) -> NDArray[np.float64]:
    """(S, W) rank-step loads as times (``load / speed``); the loads themselves without speeds."""
    return loads if speeds is None else loads / speeds[None, :]


def _memory_as_points(limits: PoolLimits) -> PoolLimits:
    """``limits`` with the memory cap planned as a points cap: each entry's bytes rounded up to whole
    bytes, the room the cap leaves above the model's base rounded down, so a fill within that points
    room is within the memory cap (``plan_epoch`` still checks the plan against the caps as given)."""
    mem = limits.caps.memory
    if mem is None or limits.memory is None:
        return limits
    room = max(int(np.floor(mem.max_bytes - mem.model.base)), 1)
    caps = dataclasses.replace(limits.caps, max_points=room, memory=None)
    return PoolLimits(caps, np.ceil(limits.memory).astype(np.int64))


def caps_problem(caps: Caps, world_size: int) -> str | None:
    """Why ``budget`` cannot plan under ``caps`` on ``world_size`` ranks whatever the pool, or None: refused
    for every pool alike, before anything is planned (``PlanConfig`` asks, and ``plan`` again).

    The memory cap is planned as a points cap (``_memory_as_points``), so the two cannot be combined. Every
    rank-step holds at least one sample and nothing is dropped or padded, so a cap of one sample per rank-step
    leaves every rank-step exactly one: each epoch's pool (and each step group's, after its weights) would have
    to be a multiple of W, which depends on the pool, not on the plan (a plan of 200 samples succeeds and one of
    201, or a step group of 61, cannot be made)."""
    if caps.memory is not None and caps.max_points is not None:
        return "budget plans within --max-step-memory or --max-points-per-rank-step, not both: drop one"
    if caps.max_samples == 1 and world_size > 1:
        return (
            f"--max-samples-per-rank-step 1 with --strategy budget on {world_size} ranks leaves every rank-step "
            f"exactly one sample, so every epoch's pool would have to be a multiple of {world_size}: give 2 or "
            "more, or plan one sample a rank-step with an equal-count strategy (--batch-size 1)"
        )
    return None


def _min_steps(costs: NDArray[np.float64], w: int, limits: PoolLimits) -> int:
    """Fewest steps the caps allow (a necessary condition: total / (W * cap))."""
    c, need = limits.caps, 1
    if c.max_samples is not None:
        need = max(need, -(-costs.size // (w * c.max_samples)))
    if c.max_cost is not None:
        need = max(need, int(np.ceil(costs.sum() / (w * c.max_cost))))
    if c.max_points is not None and limits.points is not None:
        need = max(need, int(np.ceil(limits.points.sum() / (w * c.max_points))))
    return need


def _attempt(
    costs: NDArray[np.float64],
    w: int,
    limits: PoolLimits,
    order: NDArray[np.int64],
    tie: NDArray[np.float64],
    candidates: list[int],
    kinds: tuple[str, ...] = ("level", "sorted"),
    speeds: NDArray[np.float64] | None = None,
) -> tuple[float, Packed, NDArray[np.int64], str] | None:
    """Pack ``order`` into each step count of ``candidates`` in turn, each way of ``kinds``:
    (linearity, bins, step layout, kind) of the first plan that reaches ``TARGET``, else the best;
    None when the caps leave no room."""
    p = costs.size
    best: tuple[float, Packed, NDArray[np.int64], str] | None = None
    tried: set[int] = set()
    for steps in candidates:
        if steps in tried:
            continue
        tried.add(steps)
        first = kinds[0]
        packed = _PACKS[first](order, costs, steps, w, limits, tie, speeds)
        while packed is None and steps < p // w:  # the caps leave no room: more steps
            steps = min(steps + max(1, steps // 20), p // w)
            tried.add(steps)
            packed = _PACKS[first](order, costs, steps, w, limits, tie, speeds)
        if packed is None:
            continue
        found: list[tuple[tuple[Packed, int] | None, str]] = [(packed, first)]
        found += [
            (_PACKS[k](order, costs, steps, w, limits, tie, speeds), k) for k in kinds[1:] if steps * w < p
        ]
        for got, kind in found:
            if got is None:
                continue
            layout = _steps_of(got[0], got[1], w, speeds)
            lin = load_linearity(_times(got[0].loads[layout], speeds))
            if best is None or lin > best[0]:
                best = (lin, got[0], layout, kind)
        if best is not None and best[0] >= TARGET:  # set above: found holds a plan
            break
    return best


_PACKS = {"level": _pack, "sorted": _pack_sorted}


def plan(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    bucket_ids: NDArray[np.int32] | None,
    limits: PoolLimits | None = None,
    speeds: NDArray[np.float64] | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch with equal cost per rank-step and variable counts.

    Args:
        costs: (P,) pool costs, P >= world_size (need not be a multiple of W*B).
        limits: caps and the pool's points; None: no caps.
        speeds: (W,) relative rank speeds (``--rank-speed``): rank r's cost at every step in proportion
            to ``speeds[r]`` (equal times); ranks are relabelled only among equal speeds. None: all equal.

    Returns:
        (S, W, M) int64 pool indices, ``-1`` = empty slot; every pool entry exactly once and every
        rank-step non-empty.
    """
    del bucket_ids
    w, p = world_size, costs.size
    if p < w:
        raise ValueError(f"budget needs at least W = {w} samples per epoch, the pool holds {p}")
    problem = caps_problem(limits.caps, w) if limits is not None else None
    if problem:
        raise ValueError(problem)
    limits = _memory_as_points(limits or PoolLimits(Caps()))
    u, tie = rng.uniform(-1.0, 1.0, p), rng.random(p)
    logc = log_cost(costs)

    def attempt(jitter: float, candidates: list[int], kinds: tuple[str, ...]) -> tuple | None:
        order = np.argsort(-(logc + jitter * u), kind="stable").astype(np.int64)
        return _attempt(costs, w, limits, order, tie, candidates, kinds, speeds)

    lo = _min_steps(costs, w, limits)
    ladder = [min(max(int(np.ceil(p / (w * batch_size * f))), lo, 1), p // w) for f in SLACK_LADDER]
    best = attempt(0.0, ladder, ("level", "sorted"))
    if best is None:
        raise ValueError(
            f"budget: the caps leave no room to plan {p} samples on {w} ranks with a sample in every rank-step "
            "and none over a cap: raise the caps"
        )
    # the jittered plans keep the exact order's step count and way of packing; they may cost up to
    # TOLERANCE, but never take a plan at or above FLOOR below it
    again = [len(best[2])]
    floor = max(best[0] - TOLERANCE, FLOOR) if best[0] >= FLOOR else best[0] - TOLERANCE_UNDER
    lo, hi = 0, len(JITTER_LADDER)  # bisection: largest jitter within the tolerance
    while lo < hi:
        mid = (lo + hi) // 2
        got = attempt(JITTER_LADDER[mid], again, (best[3],))
        if got is not None and got[0] >= floor:
            best, hi = got, mid
        else:
            lo = mid + 1
    out = permute_ranks(best[1].padded(best[2]), rng, None if speeds is None else speeds)
    return out[rng.permutation(out.shape[0])]
