"""The fill step of ``budget``: items, heaviest first, each to the bin furthest below its target.

Bins are ordered by the tuple ``(key, tie, bin)`` with ``key = load - target``; each item goes to
the smallest bin (that fits the caps) and raises its key by the item's cost: the one LPT of
``lidarshard.transforms.plan.lpt``. Without caps that is ``lpt_rounds``; with caps, ``lpt_capped``
runs the rounds up to the first item they would put over a cap (each bin chosen before it fits, so
the heap would choose it too), then ``lpt_heap`` with ``CapState`` as its room, where a bin a cap
blocks is parked off the heap until an item small enough for its room comes.

``Packed`` holds the result per bin (members in insertion order, loads) and repairs empty bins.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan.caps import PoolLimits
from lidarshard.transforms.plan.lpt import lpt_heap, lpt_rounds

__all__ = ["Packed", "CapState", "fill", "lpt_capped"]


def sequential_sums(bins: NDArray[np.int64], values: NDArray[np.float64], n: int) -> list[float]:
    """(n,) per-bin sums of ``values`` added in order, as the scalar loop adds them (``bincount``
    accumulates in input order from 0.0)."""
    return np.bincount(bins, weights=values, minlength=n).tolist()


class CapState:
    """Per-bin samples, cost and points that the caps are checked against (Python scalars: the
    heap loop is scalar)."""

    def __init__(
        self, limits: PoolLimits, costs: NDArray[np.float64], first: NDArray[np.int64], n: int
    ) -> None:
        caps = limits.caps
        points = limits.points if caps.max_points is not None else None  # only checked against its cap
        self.max_n, self.max_c = caps.max_samples, caps.max_cost
        self.max_p = caps.max_points if points is not None else None
        self.cost_of, self.points_of = costs, points
        self.cost = costs.tolist()
        self.pt = points.tolist() if points is not None else None
        self.counts = [1] * first.size + [0] * (n - first.size)
        self.loads = (costs[first] if first.size else np.zeros(n)).tolist()
        self.pts = points[first].tolist() if points is not None and first.size else [0] * n

    def blocked(self, b: int, item: int) -> int:
        """-1 when bin b can take pool entry ``item`` within every cap, else the cap it exceeds:
        0 cost, 1 points, 2 samples (the bin is full)."""
        if self.max_n is not None and self.counts[b] >= self.max_n:
            return 2
        if self.max_c is not None and self.loads[b] + self.cost[item] > self.max_c:
            return 0
        if self.max_p is not None and self.pt is not None and self.pts[b] + self.pt[item] > self.max_p:
            return 1
        return -1

    def room(self, b: int, cap: int) -> float:
        """What bin b has left below the cost (0) or points (1) cap, widened by a relative 1e-9 for
        the cost so rounding never keeps a bin that fits off the heap (a looser room only means a
        needless look)."""
        if cap == 0:
            assert self.max_c is not None
            return self.max_c * (1.0 + 1e-9) - self.loads[b]
        assert self.max_p is not None
        return self.max_p - self.pts[b]

    def needs(self, item: int) -> tuple[float, float]:
        """(cost, points) that pool entry ``item`` needs from a bin's room (0 points without a
        points cap)."""
        return self.cost[item], self.pt[item] if self.pt is not None else 0

    def first_over(self, items: NDArray[np.int64], bins: NDArray[np.int64]) -> int:
        """Index of the first of ``items`` (K,) that, put into ``bins`` (K,) in turn on top of the
        present contents, exceeds a cap; K when none does. Sums within a relative 1e-9 of the cost
        cap count as over (vectorized sums round differently from the sequential ones)."""
        k = items.size
        if not k:
            return 0
        o = np.argsort(bins, kind="stable")
        b = bins[o]
        head = np.flatnonzero(np.append(True, b[1:] != b[:-1]))
        size = np.diff(np.append(head, k))

        def after(vals: NDArray, now: list) -> NDArray:  # the bin's total once each item is in
            v = vals[o]
            run = np.cumsum(v)
            return np.asarray(now)[b] + run - np.repeat(run[head] - v[head], size)

        over = np.zeros(k, dtype=bool)
        if self.max_n is not None:
            over[o] |= after(np.ones(k, dtype=np.int64), self.counts) > self.max_n
        if self.max_c is not None:
            over[o] |= after(self.cost_of[items], self.loads) > self.max_c * (1.0 - 1e-9)
        if self.max_p is not None and self.points_of is not None:
            over[o] |= after(self.points_of[items], self.pts) > self.max_p
        return int(np.argmax(over)) if over.any() else k

    def add_many(self, items: NDArray[np.int64], bins: NDArray[np.int64]) -> None:
        """Put ``items`` (K,) into ``bins`` (K,) in turn (the same sums as ``add`` one by one)."""
        n = len(self.counts)
        seq = np.concatenate([np.arange(n), bins])
        self.counts = (np.asarray(self.counts) + np.bincount(bins, minlength=n)).tolist()
        self.loads = sequential_sums(seq, np.concatenate([self.loads, self.cost_of[items]]), n)
        if self.points_of is not None:
            got = np.bincount(bins, weights=self.points_of[items], minlength=n)
            self.pts = (np.asarray(self.pts, dtype=np.int64) + got.astype(np.int64)).tolist()

    def add(self, b: int, item: int) -> bool:
        """Put ``item`` into bin b; True when the bin is now full (``max_samples``)."""
        self.counts[b] += 1
        self.loads[b] += self.cost[item]
        if self.pt is not None:
            self.pts[b] += self.pt[item]
        return self.max_n is not None and self.counts[b] >= self.max_n


def lpt_capped(
    key0: NDArray[np.float64], tie: NDArray[np.float64], items: NDArray[np.int64], x: NDArray, state: CapState
) -> NDArray[np.int64] | None:
    """``lpt_heap``'s assignment, the vectorized way as far as the caps allow.

    ``lpt_rounds`` assigns every item ignoring the caps; up to the first item it puts over a cap,
    each bin it chose also fits, so the heap would have chosen it too. Those items are kept and the
    heap takes over from there (arguments and result as ``lpt_heap``; ``state`` updated).
    """
    seq = lpt_rounds(key0, tie, x)
    j = state.first_over(items, seq)
    state.add_many(items[:j], seq[:j])
    if j == items.size:
        return seq
    n = key0.size
    keys = np.asarray(
        sequential_sums(np.concatenate([np.arange(n), seq[:j]]), np.concatenate([key0, x[:j]]), n)
    )
    rest = lpt_heap(keys, tie, items[j:], x[j:], state)
    return None if rest is None else np.concatenate([seq[:j], rest])


class Packed:
    """Bins as CSR: ``members[start[b] : start[b] + counts[b]]`` are bin b's pool indices in
    insertion order; ``loads`` (n,) their cost, summed in that order."""

    def __init__(
        self, members: NDArray[np.int64], counts: NDArray[np.int64], loads: NDArray[np.float64]
    ) -> None:
        self.members, self.counts, self.loads = members, counts, loads
        self.start = np.cumsum(counts) - counts

    @classmethod
    def of(cls, n: int, seq_items: NDArray[np.int64], seq_bins: NDArray[np.int64], costs: NDArray) -> Packed:
        """From (K,) pool indices and their (K,) bins in insertion order."""
        members = seq_items[np.argsort(seq_bins, kind="stable")]
        loads = np.bincount(seq_bins, weights=costs[seq_items], minlength=n)  # sequential sums
        # numpy's stubs type bincount as intp even with float weights
        return cls(members, np.bincount(seq_bins, minlength=n), loads)  # type: ignore[arg-type]

    def repair_empty(self, costs: NDArray[np.float64]) -> Packed | None:
        """Every empty bin takes one sample: the last item of the fullest bin. None: no donor."""
        empty = np.flatnonzero(self.counts == 0)
        if not empty.size:
            return self
        counts, loads, moved = self.counts.copy(), self.loads.copy(), []
        for b in empty.tolist():
            donor = int(np.argmax(counts))
            if counts[donor] < 2:
                return None
            counts[donor] -= 1
            item = int(self.members[self.start[donor] + counts[donor]])
            loads[donor] -= costs[item]
            loads[b] = 0.0 + costs[item]
            counts[b] = 1
            moved.append((b, item))
        within = np.arange(self.members.size) - np.repeat(self.start, self.counts)
        keep = within < np.repeat(counts, self.counts)  # donors lose their last members
        bins = np.repeat(np.arange(counts.size), self.counts)[keep]
        to, items = np.asarray(moved, dtype=np.int64).T
        out = Packed.of(
            counts.size, np.concatenate([self.members[keep], items]), np.concatenate([bins, to]), costs
        )
        return Packed(out.members, out.counts, loads)  # loads by the moves' own arithmetic

    def padded(self, layout: NDArray[np.int64]) -> NDArray[np.int64]:
        """(S, W, M) pool indices of the bins ``layout`` (S, W), ``-1`` beyond each bin's count."""
        flat = layout.ravel()
        c = self.counts[flat]
        out = np.full((flat.size, int(c.max())), -1, dtype=np.int64)
        rows = np.repeat(np.arange(flat.size), c)
        cols = np.arange(c.sum()) - np.repeat(np.cumsum(c) - c, c)
        out[rows, cols] = self.members[np.repeat(self.start[flat], c) + cols]
        return out.reshape(*layout.shape, -1)


def fill(
    first: NDArray[np.int64],
    rest: NDArray[np.int64],
    target: NDArray[np.float64],
    costs: NDArray[np.float64],
    tie: NDArray[np.float64],
    limits: PoolLimits,
) -> Packed | None:
    """Pack ``first`` one per bin (bin i takes ``first[i]``; may be empty), then ``rest`` (heaviest
    first) by LPT against ``target`` (n,); zero-cost items to the bins holding the fewest samples;
    empty bins repaired. None where the caps block."""
    n = target.size
    loads0 = costs[first] if first.size else np.zeros(n)
    key0, tie = loads0 - target, tie[:n]
    positive = costs[rest] > 0.0
    live, zero = rest[positive], rest[~positive]
    to_live: NDArray[np.int64] | None
    to_zero: NDArray[np.int64] | None
    if not limits.caps.active:
        to_live = lpt_rounds(key0, tie, costs[live])
        counts = np.bincount(np.concatenate([np.arange(first.size), to_live]), minlength=n)
        to_zero = lpt_rounds(counts.astype(np.float64), tie, np.ones(zero.size))
    else:
        state = CapState(limits, costs, first, n)
        to_live = lpt_capped(key0, tie, live, costs[live], state)
        if to_live is None:
            return None
        to_zero = lpt_capped(np.asarray(state.counts, np.float64), tie, zero, np.ones(zero.size), state)
        if to_zero is None:
            return None
    bins = np.concatenate([np.arange(first.size), to_live, to_zero])
    return Packed.of(n, np.concatenate([first, live, zero]), bins, costs).repair_empty(costs)
