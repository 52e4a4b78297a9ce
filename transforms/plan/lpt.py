"""LPT, the one greedy longest-first assignment: every planner, the evaluation shards and the
elastic re-plan call it.

The rule: bins carry a key (a load, or a load minus a target) and a tie-break; items come in a
given order (heaviest first), and each goes to the bin with the smallest ``(key, tie, bin)``
among the bins with room for it, whose key then grows by the item's increment. Three ways to run
it give the same assignment (``tests/test_lpt.py`` holds them to one scalar reference):

- ``lpt_heap``: the scalar heap; a ``Room`` says which bins an item fits (a count per bin, the
  caps of ``budget``); bins that are full for good leave the heap;
- ``lpt_rounds``: no room limit, exact and vectorized in rounds (tens of rounds an epoch instead of
  one heap step per item): the budget fill and the re-plan's leftover step;
- ``lpt_assign``: equal counts (each of ``W`` ranks takes ``B`` items of a step, keys start at 0,
  ties by rank), vectorized across all the steps of an epoch at once: the equal-count planners.

``lpt_free`` splits each step with free counts (every rank at least one item, caps and rank speeds):
``rebalance``'s split of random's steps. Without speeds and caps, on positive costs, it is the rule too.

Pure numpy.
"""

from __future__ import annotations

import heapq
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

__all__ = ["Room", "CountRoom", "lpt_heap", "lpt_rounds", "lpt_assign", "lpt_free", "chunk_rows"]

#: Items that equal-count LPT and its callers hold temporaries for at a time (a few MiB whatever the epoch's
#: size; every step is split on its own, so the result is the same as all at once).
CHUNK_ITEMS = 1 << 18
_MIN_ROUND = 64  # items tried at least per round: after a short round, the next tries 4x as many


class Room(Protocol):
    """What ``lpt_heap`` asks of the bins' contents (updated in place as items go in)."""

    def needs(self, item: int) -> tuple[float, float]:
        """(cost, points) that ``item`` needs from a bin's room (what unparks a parked bin)."""
        ...

    def blocked(self, b: int, item: int) -> int:
        """-1 when bin b takes ``item``; else 0 (cost) or 1 (points: b is parked with its room) or
        2 (b is full for good)."""
        ...

    def room(self, b: int, cap: int) -> float:
        """Bin b's room below cap 0 (cost) or 1 (points)."""
        ...

    def add(self, b: int, item: int) -> bool:
        """Put ``item`` into bin b; True when b is now full for good."""
        ...


class CountRoom:
    """Bins that hold ``base`` items each, and the first ``extra`` bins to reach ``base`` one more.

    ``CountRoom(W, B)`` is the equal-count split of one step; ``CountRoom(W, N // W, N % W)`` spreads
    N items with counts within one. Full is for good: counts only grow and ``extra`` only shrinks.
    """

    def __init__(self, n: int, base: int, extra: int = 0) -> None:
        self.count, self.base, self.extra = [0] * n, base, extra

    def _full(self, b: int) -> bool:
        return self.count[b] >= self.base + (self.extra > 0)

    def needs(self, item: int) -> tuple[float, float]:
        return 0.0, 0.0  # no bin is ever parked

    def blocked(self, b: int, item: int) -> int:
        return 2 if self._full(b) else -1

    def room(self, b: int, cap: int) -> float:
        raise AssertionError("CountRoom parks no bin")

    def add(self, b: int, item: int) -> bool:
        self.count[b] += 1
        if self.count[b] == self.base + 1:
            self.extra -= 1
        return self._full(b)


def lpt_heap(
    key0: NDArray[np.float64], tie: NDArray[np.float64], items: NDArray[np.int64], x: NDArray, state: Room
) -> NDArray[np.int64] | None:
    """LPT with room: each item to the smallest ``(key, tie, bin)`` that ``state`` lets take it.

    A bin that a cap blocks for the current item is *parked*, off the heap, under that cap with its
    room (cap - content); it returns to the heap, key unchanged, once an item small enough for that
    room comes (a bin full for good, by count, never returns). So each item looks only at bins that
    may fit it, not at every blocked bin below the one it takes: planning time stays near
    ``K log n`` where re-scanning the blocked bins for every item grew as ``K * n``; the assignment
    is the same.

    Args:
        key0: (n,) initial keys; tie: (n,) tie-breaks; items: (K,) pool indices; x: (K,) their key
            increments; state: the bins' room (``CountRoom``, budget's caps), updated in place.

    Returns:
        (K,) bin of each item, or None where an item fits no bin.
    """
    heap = list(zip(key0.tolist(), tie.tolist(), range(key0.size), strict=True))
    heapq.heapify(heap)
    parked: tuple[list, list] = ([], [])  # by cost room, by points room: (-room, key, tie, bin)
    out = np.empty(items.size, dtype=np.int64)
    for i, (item, step) in enumerate(zip(items.tolist(), x.tolist(), strict=True)):
        for shelf, need in zip(parked, state.needs(item), strict=True):
            while shelf and -shelf[0][0] >= need:
                heapq.heappush(heap, heapq.heappop(shelf)[1:])
        while heap and (blocked := state.blocked(heap[0][2], item)) >= 0:
            entry = heapq.heappop(heap)
            if blocked < 2:  # a full bin (max_samples) is dropped for good
                heapq.heappush(parked[blocked], (-state.room(entry[2], blocked), *entry))
        if not heap:
            return None
        key, t, b = heapq.heappop(heap)
        out[i] = b
        if not state.add(b, item):
            heapq.heappush(heap, (key + step, t, b))
    return out


def lpt_rounds(
    key0: NDArray[np.float64], tie: NDArray[np.float64], x: NDArray[np.float64]
) -> NDArray[np.int64]:
    """Exact LPT without a room limit, vectorized in rounds.

    The bins are kept sorted; a *round* gives the next ``k`` items to the ``k`` smallest bins in
    order, ``k`` the longest prefix where every bin is still smaller than each bin already raised
    in the round (so the heap would choose the same); then the raised bins are merged back into
    the sorted order. Rounds are long wherever items are small next to the spread of keys.

    Args:
        key0: (n,) initial key of each bin (load - target).
        tie: (n,) tie-break of each bin (then the bin id).
        x: (K,) key increment of each item, in assignment order.

    Returns:
        (K,) bin of each item: the same as a heap of ``(key, tie, bin)`` that gives each item to
        its smallest entry.
    """
    n = key0.size
    if not x.size:
        return np.empty(0, dtype=np.int64)
    ids = np.lexsort((tie, key0))  # ascending (key, tie, bin): lexsort is stable
    key, tie_s = key0[ids], tie[ids]
    out = np.empty(x.size, dtype=np.int64)
    j, m = 0, n
    while j < x.size:
        m = min(m, n, x.size - j)
        raised = key[:m] + x[j : j + m]
        low = np.minimum.accumulate(raised)
        stop = np.append(key[1:m] >= low[:-1], True)  # a raised bin is as small: the heap may choose it
        k = min(int(np.argmax(stop)) + 1, m)
        out[j : j + k] = ids[:k]
        j += k
        _merge_front(key, tie_s, ids, raised[:k])
        m = n if k == m else max(_MIN_ROUND, 4 * k)
    return out


def _merge_front(key: NDArray, tie: NDArray, ids: NDArray, raised: NDArray) -> None:
    """In place: the first ``k = raised.size`` bins of the sorted arrays take the keys ``raised``;
    merge them back into the sorted rest (ascending ``(key, tie, bin)``)."""
    k = raised.size
    hi = k + int(np.searchsorted(key[k:], raised.max(), side="right"))  # the rest beyond stays
    t = np.argsort(raised, kind="stable")
    new = (raised[t], tie[:k][t], ids[:k][t])
    old = (key[k:hi].copy(), tie[k:hi].copy(), ids[k:hi].copy())
    left = np.searchsorted(old[0], new[0], side="left")
    if (np.searchsorted(old[0], new[0], side="right") > left).any() or (new[0][1:] == new[0][:-1]).any():
        s = np.lexsort(tuple(np.concatenate([a, b]) for a, b in zip(new[::-1], old[::-1], strict=True)))
        for arr, a, b in zip((key, tie, ids), new, old, strict=True):
            arr[:hi] = np.concatenate([a, b])[s]  # equal keys: order by tie, then bin
        return
    dest = left + np.arange(k)  # raised bin r lands after `left[r]` untouched ones and r raised
    free = np.ones(hi, dtype=bool)
    free[dest] = False
    for arr, a, b in zip((key, tie, ids), new, old, strict=True):
        arr[:hi][dest] = a
        arr[:hi][free] = b


def lpt_assign(step_costs: NDArray[np.float64], world_size: int, batch_size: int) -> NDArray[np.int64]:
    """Equal-count LPT of every step at once: each rank gets exactly ``batch_size`` items.

    Items are taken heaviest first (ties: lower column); each goes to the least-loaded rank that
    still has a free slot (ties: lowest rank): ``lpt_heap`` with ``CountRoom(W, B)``, keys and ties
    0, run on every step at once. Within a rank, slot 0 holds its heaviest item.

    Args:
        step_costs: (S, W*B) cost of each item of each step.

    Returns:
        (S, W, B) int64 column indices into ``step_costs`` (each row a permutation of 0..W*B-1).
    """
    s, n = step_costs.shape
    out = np.empty((s, world_size, batch_size), dtype=np.int64)
    rows = chunk_rows(n)
    for a in range(0, s, rows):
        out[a : a + rows] = _assign(step_costs[a : a + rows], world_size, batch_size)
    return out


def chunk_rows(n: int) -> int:
    """Steps of ``n`` items each to work on at a time (``CHUNK_ITEMS`` items)."""
    return max(1, CHUNK_ITEMS // max(n, 1))


def _assign(step_costs: NDArray[np.float64], w: int, b: int) -> NDArray[np.int64]:
    """``lpt_assign`` of (s, W*B) steps at once."""
    order = np.argsort(-step_costs, axis=1, kind="stable")
    ordered = np.take_along_axis(step_costs, order, axis=1)
    if b == 1:  # one item per rank: any one-to-one assignment is the partition
        return order[:, :, None]
    if b > 2:
        return _loop(order, ordered, w, b)
    # B = 2, the W heaviest items > 0: item j < W goes to rank j (the lowest still at 0); then every rank holds
    # one item and stays open until its second, so the rest go to the ranks in the order of their loads
    # (ascending; ties: lower rank). A step with a zero among its W heaviest items takes the loop.
    out = np.empty((len(order), w, 2), dtype=np.int64)
    ahead = ordered[:, w - 1] > 0
    second = np.empty((int(ahead.sum()), w), dtype=np.int64)
    np.put_along_axis(second, np.argsort(ordered[ahead, :w], axis=1, kind="stable"), order[ahead, w:], axis=1)
    out[ahead] = np.stack([order[ahead, :w], second], axis=2)
    if not ahead.all():
        out[~ahead] = _loop(order[~ahead], ordered[~ahead], w, 2)
    return out


def _loop(order: NDArray[np.int64], ordered: NDArray[np.float64], w: int, b: int) -> NDArray[np.int64]:
    """``_assign`` item by item: (s, W*B) items of each step heaviest first (``order``, their costs ``ordered``)."""
    s, n = order.shape
    out = np.empty((s, w, b), dtype=np.int64)
    loads = np.zeros((s, w))
    open_loads = np.zeros((s, w))  # loads, +inf where the rank is full
    counts = np.zeros((s, w), dtype=np.int64)
    rows = np.arange(s)
    for j in range(n):
        r = np.argmin(open_loads, axis=1)
        slot = counts[rows, r]
        out[rows, r, slot] = order[:, j]
        loads[rows, r] += ordered[:, j]
        counts[rows, r] = slot + 1
        open_loads[rows, r] = np.where(slot + 1 < b, loads[rows, r], np.inf)
    return out


def lpt_free(
    step_costs: NDArray[np.float64],
    world_size: int,
    speeds: NDArray[np.float64] | None = None,
    needs: NDArray[np.float64] | None = None,
    room: NDArray[np.float64] | None = None,
) -> NDArray[np.int64]:
    """Free-count LPT of every step at once: each rank gets at least one item, counts are otherwise free.

    Items are taken heaviest first (ties: lower column). The ``W`` heaviest go one to each rank, the
    heaviest to the fastest (ties: lowest rank); each later item goes to the rank that would finish it
    first, ``(load + cost) / speed`` (ties: lowest rank), among the ranks whose room it fits; where it fits
    none, to the one that would finish it first (the caller's cap check then names the breach).

    Args:
        step_costs: (S, n) cost of each item of each step, n >= W.
        speeds: (W,) relative rank speeds > 0; None: all equal.
        needs: (S, n, k) what each item takes of a rank-step's room (samples, cost, points, bytes), or None.
        room: (k,) each rank-step's room in those units (with ``needs``).

    Returns:
        (S, n) int64 rank of each item.
    """
    s, n = step_costs.shape
    w = world_size
    if n < w:
        raise ValueError(f"a step of {n} items cannot give each of {w} ranks one")
    order = np.argsort(-step_costs, axis=1, kind="stable")
    cost = np.take_along_axis(step_costs, order, axis=1)
    speed = np.ones(w) if speeds is None else np.asarray(speeds, dtype=np.float64)
    first = np.argsort(-speed, kind="stable")  # ranks, fastest first
    ranks = np.empty((s, n), dtype=np.int64)
    ranks[:, :w] = first[None, :]
    loads = np.zeros((s, w))
    loads[:, first] = cost[:, :w]
    rows = np.arange(s)
    need = None if needs is None else np.take_along_axis(needs, order[:, :, None], axis=1)
    used = None
    if need is not None:
        used = np.zeros((s, w, need.shape[2]))
        used[:, first, :] = need[:, :w, :]
    for j in range(w, n):
        finish = (loads + cost[:, j : j + 1]) / speed[None, :]
        if need is not None and used is not None and room is not None:
            fits = np.all(used + need[:, j, None, :] <= room, axis=2)
            r = np.argmin(np.where(fits, finish, np.inf), axis=1)
            stuck = ~np.any(fits, axis=1)
            r[stuck] = np.argmin(finish[stuck], axis=1)
            used[rows, r] += need[:, j, :]
        else:
            r = np.argmin(finish, axis=1)
        ranks[:, j] = r
        loads[rows, r] += cost[:, j]
    out = np.empty_like(ranks)
    np.put_along_axis(out, order, ranks, axis=1)
    return out
