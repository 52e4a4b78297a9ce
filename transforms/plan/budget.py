"""``budget``: every rank gets the same predicted cost at every step; counts per rank may differ.

Equal-count plans are capped by the equal-count bound, which falls on heavy tails. Here a rank
that gets one large scene and a rank that gets three small ones do the same work. For S steps
(``S = P // (W*B)``, so the mean count per rank-step is B) the S*W rank-steps are *bins*:

1. order the pool heaviest first by a jittered key ``log(cost) + jitter * u`` (u ~ U(-1, 1));
   ``jitter`` is the largest on ``JITTER_LADDER`` whose plan stays within ``TOLERANCE`` of the
   exact order's linearity (bisection), so plans differ between epochs as much as balance allows;
2. targets: every bin targets the level ``lambda`` that spreads the total cost evenly, except
   *high steps*: while the items heavier than ``lambda`` do not fit into the high steps'
   capacity, the heaviest item that does not fit opens a high step whose W bins target its cost
   (``lambda`` is recomputed from the cost left), so one big scene is matched by several small
   ones on the other ranks;
3. fill: the items, heaviest first, each go to the bin furthest below its target that still fits
   the caps (LPT against targets; ties broken by a random bin order); zero-cost items go to the
   bins holding the fewest samples; an empty bin takes the lightest item of the fullest bin;
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
over a cap, and the number of steps is raised until the caps leave room for every item.

The plan is ``(S, W, M)`` int64 pool indices, ``M`` the largest count, ``-1`` padding the rest;
every rank-step holds at least one sample.
"""

from __future__ import annotations

import heapq

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan._partition import permute_ranks
from lidarshard.transforms.plan.balanced import log_cost
from lidarshard.transforms.plan.caps import Caps, PoolLimits
from lidarshard.transforms.plan.metrics import load_linearity

__all__ = ["plan", "SLACK_LADDER", "TARGET", "JITTER_LADDER", "TOLERANCE", "to_padded"]

#: Mean-count factors tried in turn (fewer steps, more samples per rank-step): at most +5%.
SLACK_LADDER = (1.0, 1.01, 1.02, 1.03, 1.04, 1.05)
#: Predicted linearity at which the ladder stops.
TARGET = 0.995
#: Jitter amplitudes of the heaviest-first order (natural-log units), most random first, halving
#: to ~6e-5 (the fine end matters near one sample per bin, as for ``balanced``); the largest whose
#: plan stays within ``TOLERANCE`` of the exact order's linearity is used.
JITTER_LADDER = tuple(2.0**-k for k in range(0, 15))
#: Linearity that randomness may cost (against the unjittered plan).
TOLERANCE = 0.003


class _Bins:
    """S*W bins: members, cost load, points and the caps."""

    def __init__(
        self, n: int, costs: NDArray[np.float64], caps: Caps, points: NDArray[np.int64] | None
    ) -> None:
        self.costs = costs
        self.members: list[list[int]] = [[] for _ in range(n)]
        self.load = [0.0] * n  # Python floats: the packing loop is scalar
        self.pts = [0] * n
        self.caps = caps
        self.points = None if points is None else points.tolist()

    def fits(self, b: int, item: int, cost: float) -> bool:
        c = self.caps
        if c.max_samples is not None and len(self.members[b]) >= c.max_samples:
            return False
        if c.max_cost is not None and self.load[b] + cost > c.max_cost:
            return False
        return not (
            c.max_points is not None
            and self.points is not None
            and self.pts[b] + self.points[item] > c.max_points
        )

    def add(self, b: int, item: int, cost: float) -> None:
        self.members[b].append(item)
        self.load[b] += cost
        if self.points is not None:
            self.pts[b] += self.points[item]

    def loads(self) -> NDArray[np.float64]:
        """(n,) cost per bin."""
        return np.asarray(self.load)


def _levels(x: NDArray[np.float64], steps: int, w: int) -> tuple[NDArray[np.float64], float]:
    """((k,) targets of the k high steps, free level lambda) for heaviest-first costs ``x``.

    The free level is what the cost left after the high steps gives each remaining bin; items above
    it must fit into the high steps' capacity ``W * sum(targets)``. While they do not, the heaviest
    item that does not fit opens another high step at its own cost.
    """
    total, csum = float(x.sum()), np.cumsum(x)
    tops: list[float] = []
    cap = lam = 0.0
    while len(tops) < steps:
        lam = (total - w * cap) / (w * (steps - len(tops)))
        above = int(np.searchsorted(-x, -lam, side="left"))  # items heavier than lam
        if lam <= 0 or above == 0 or csum[above - 1] <= w * cap:
            break
        tops.append(float(x[min(int(np.searchsorted(csum, w * cap, side="right")), x.size - 1)]))
        cap += tops[-1]
    return np.asarray(tops), max(lam, 0.0) if len(tops) < steps else 0.0


def _pack(
    order: NDArray[np.int64], costs: NDArray[np.float64], steps: int, w: int, limits: PoolLimits, tie: NDArray
) -> tuple[_Bins, int] | None:
    """Water-level packing: every item of ``order`` (heaviest first) to one of ``steps * w`` bins.

    Returns:
        (bins, k high steps: bins ``0 .. k*W-1``, step by step), or None where the caps block.
    """
    n = steps * w
    x = costs[order]
    if n == x.size:  # one sample per bin: the equal-count optimum
        return _pack_sorted(order, costs, steps, w, limits, tie)
    tops, lam = _levels(x, steps, w)
    target = np.full(n, lam)
    target[: tops.size * w] = np.repeat(tops, w)
    bins = _Bins(n, costs, limits.caps, limits.points)
    return (bins, tops.size) if _fill(bins, target, order, x, limits, tie) else None


def _pack_sorted(
    order: NDArray[np.int64], costs: NDArray[np.float64], steps: int, w: int, limits: PoolLimits, tie: NDArray
) -> tuple[_Bins, int] | None:
    """Sorted packing: the ``steps * w`` heaviest items one per bin in ``order`` (consecutive bins
    form a step), then the rest fill each bin up to its step's heaviest bin (LPT). Best when the
    pool holds about one item per bin (``B == 1``); all ``steps`` keep their grouping."""
    n = steps * w
    exact = order  # heaviest first by the (jittered) key: exact with jitter 0
    bins = _Bins(n, costs, limits.caps, limits.points)
    for b, item in enumerate(exact[:n].tolist()):
        bins.add(b, item, float(costs[item]))
    target = bins.loads().reshape(steps, w).max(axis=1).repeat(w)
    rest = exact[n:]
    return (bins, steps) if _fill(bins, target, rest, costs[rest], limits, tie) else None


def _fill(
    bins: _Bins,
    target: NDArray[np.float64],
    items: NDArray[np.int64],
    x: NDArray[np.float64],
    limits: PoolLimits,
    tie: NDArray,
) -> bool:
    """LPT against targets: each item (heaviest first) to the bin furthest below its target that
    fits the caps; zero-cost items by count; empty bins repaired. False where the caps block."""
    n = len(bins.members)
    heap = list(zip((np.asarray(bins.loads()) - target).tolist(), tie[:n].tolist(), range(n), strict=True))
    heapq.heapify(heap)
    zero = []
    capped = limits.caps.active
    max_samples = limits.caps.max_samples
    members, load = bins.members, bins.load
    for item, cost in zip(items.tolist(), x.tolist(), strict=True):
        if cost <= 0.0:
            zero.append(item)
            continue
        if not capped:  # fast path
            key, t, b = heap[0]
            members[b].append(item)
            load[b] += cost
            heapq.heapreplace(heap, (key + cost, t, b))
            continue
        skipped = []
        while heap and not bins.fits(heap[0][2], item, cost):
            skipped.append(heapq.heappop(heap))
        if not heap:
            return False
        key, t, b = heapq.heappop(heap)
        bins.add(b, item, cost)
        full = max_samples is not None and len(members[b]) >= max_samples
        for entry in skipped if full else [*skipped, (key + cost, t, b)]:
            heapq.heappush(heap, entry)
    if zero and not _place_by_count(bins, zero, tie):
        return False
    return _repair_empty(bins)


def _place_by_count(bins: _Bins, items: list[int], tie: NDArray) -> bool:
    """Zero-cost items to the bins holding the fewest samples (that fit the caps)."""
    heap = [(len(m), float(tie[b]), b) for b, m in enumerate(bins.members)]
    heapq.heapify(heap)
    for item in items:
        skipped = []
        while heap and not bins.fits(heap[0][2], item, 0.0):
            skipped.append(heapq.heappop(heap))
        if not heap:
            return False
        _, t, b = heapq.heappop(heap)
        bins.add(b, item, 0.0)
        for entry in [*skipped, (len(bins.members[b]), t, b)]:
            heapq.heappush(heap, entry)
    return True


def _repair_empty(bins: _Bins) -> bool:
    """Give every empty bin one sample: the last (lightest) item of the fullest bin."""
    counts = np.array([len(m) for m in bins.members])
    for b in np.flatnonzero(counts == 0):
        donor = int(np.argmax(counts))
        if counts[donor] < 2:
            return False
        item = bins.members[donor].pop()
        cost = float(bins.costs[item])
        bins.load[donor] -= cost
        bins.add(b, item, cost)
        if bins.points is not None:
            bins.pts[donor] -= bins.points[item]  # the item's points moved with it
        counts[donor] -= 1
        counts[b] = 1
    return True


def _steps_of(bins: _Bins, k: int, w: int) -> list[list[int]]:
    """Bin ids per step: tail steps as packed, the rest sorted by load and cut into steps of W."""
    n = len(bins.members)
    free = np.arange(k * w, n)
    free = free[np.argsort(bins.loads()[free], kind="stable")]
    ids = np.concatenate([np.arange(k * w), free])
    return ids.reshape(-1, w).tolist()


def _linearity(bins: _Bins, layout: list[list[int]]) -> float:
    return load_linearity(bins.loads()[np.asarray(layout)])


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


def to_padded(bins: list[list[int]], layout: list[list[int]]) -> NDArray[np.int64]:
    """(S, W, M) int64 from per-bin members, ``-1`` beyond each bin's count."""
    m = max(len(bins[b]) for step in layout for b in step)
    out = np.full((len(layout), len(layout[0]), m), -1, dtype=np.int64)
    for s, step in enumerate(layout):
        for r, b in enumerate(step):
            out[s, r, : len(bins[b])] = bins[b]
    return out


def _attempt(
    costs: NDArray[np.float64],
    w: int,
    limits: PoolLimits,
    order: NDArray[np.int64],
    tie: NDArray[np.float64],
    candidates: list[int],
) -> tuple[float, _Bins, list[list[int]]] | None:
    """Pack ``order`` into each step count of ``candidates`` in turn: (linearity, bins, step layout)
    of the first plan that reaches ``TARGET``, else the best; None when the caps leave no room."""
    p = costs.size
    best, tried = None, set()
    for steps in candidates:
        if steps in tried:
            continue
        tried.add(steps)
        packed = _pack(order, costs, steps, w, limits, tie)
        while packed is None and steps < p // w:  # the caps leave no room: more steps
            steps = min(steps + max(1, steps // 20), p // w)
            tried.add(steps)
            packed = _pack(order, costs, steps, w, limits, tie)
        if packed is None:
            continue
        found = [packed]
        if steps * w < p:
            found.append(_pack_sorted(order, costs, steps, w, limits, tie))
        for bins, high in (f for f in found if f is not None):
            layout = _steps_of(bins, high, w)
            lin = _linearity(bins, layout)
            if best is None or lin > best[0]:
                best = (lin, bins, layout)
        if best[0] >= TARGET:
            break
    return best


def plan(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    bucket_ids: NDArray[np.int32] | None,
    limits: PoolLimits | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch with equal cost per rank-step and variable counts.

    Args:
        costs: (P,) pool costs, P >= world_size (need not be a multiple of W*B).
        limits: caps and the pool's points; None: no caps.

    Returns:
        (S, W, M) int64 pool indices, ``-1`` = empty slot; every pool entry exactly once and every
        rank-step non-empty.
    """
    del bucket_ids
    w, p = world_size, costs.size
    if p < w:
        raise ValueError(f"budget needs at least W = {w} samples per epoch, the pool holds {p}")
    limits = limits or PoolLimits(Caps())
    u, tie = rng.uniform(-1.0, 1.0, p), rng.random(p)
    logc = log_cost(costs)

    def attempt(jitter: float, candidates: list[int]) -> tuple[float, _Bins, list[list[int]]] | None:
        order = np.argsort(-(logc + jitter * u), kind="stable").astype(np.int64)
        return _attempt(costs, w, limits, order, tie, candidates)

    lo = _min_steps(costs, w, limits)
    ladder = [min(max(int(np.ceil(p / (w * batch_size * f))), lo, 1), p // w) for f in SLACK_LADDER]
    best = attempt(0.0, ladder)
    if best is None:
        raise ValueError(f"budget: the caps leave no room to plan {p} samples on {w} ranks")
    steps = [len(best[2])]  # the jittered plans keep the exact order's step count
    lo, hi = 0, len(JITTER_LADDER)  # bisection: largest jitter within TOLERANCE of the exact order
    while lo < hi:
        mid = (lo + hi) // 2
        got = attempt(JITTER_LADDER[mid], steps)
        if got is not None and got[0] >= best[0] - TOLERANCE:
            best, hi = got, mid
        else:
            lo = mid + 1
    out = permute_ranks(to_padded(best[1].members, best[2]), rng)
    return out[rng.permutation(out.shape[0])]
