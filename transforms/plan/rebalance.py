"""``rebalance``: random's steps, each split across ranks by cost; every step's gradient stays random's.

Each step holds exactly the ``W*B`` samples that the seeded ``random`` plan puts in it (the same pool,
seed and epoch: ``plan_epoch`` hands this strategy ``random``'s generator, ``SEEDED_AS``); only which rank
trains which of them changes, with free counts per rank (``lpt_free``: the ``W`` heaviest one to each
rank, the heaviest to the fastest, then each sample to the rank that would finish it first, within the
caps; then ``REFINE_PASSES`` times at most, in every step, the best move or swap of one sample between the
slowest and the fastest-finishing rank that lowers the slower of the two, ``_refine``). Under the loaders' ``loss_scale`` (``W / N`` over a step's ``N`` samples) the DDP gradient of
every step is the mean over the same global batch as PyTorch's ``DistributedSampler``'s, so nothing
about what the model sees changes but the split; BatchNorm statistics are per rank (per batch) without
SyncBatchNorm, so those do change. Rank labels are permuted per step (among ranks of equal speed).

Balance is what a step's ``W*B`` random samples allow: at ``B == 1`` each rank holds one sample and
the plan is ``random``'s; the larger ``B``, the closer to even. Pair repeat is ``random``'s (the steps
are its steps).

The plan is ``(S, W, M)`` int64 pool indices, ``M`` the largest count, ``-1`` padding the rest; every
rank-step holds at least one sample and ``S = P / (W*B)``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan import random as random_
from lidarshard.transforms.plan._partition import permute_ranks
from lidarshard.transforms.plan.caps import PoolLimits
from lidarshard.transforms.plan.dense import dense_plan
from lidarshard.transforms.plan.lpt import lpt_free

__all__ = ["plan"]

#: Steps split at a time: ``lpt_free``'s temporaries (a few arrays of the steps' size) stay bounded.
_CHUNK_STEPS = 1 << 12
#: Improvement passes after LPT (each moves or swaps one sample between two ranks of every step).
REFINE_PASSES = 32


def _first_of(mask: NDArray[np.bool_], width: int) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """((S, width) column indices of each row's True entries, in column order, then padding; (S, width)
    which of them are real)."""
    cols = np.argsort(~mask, axis=1, kind="stable")[:, :width]
    return cols, np.take_along_axis(mask, cols, axis=1)


def _refine(
    cost: NDArray[np.float64],
    ranks: NDArray[np.int64],
    w: int,
    speed: NDArray[np.float64],
    need: NDArray[np.float64] | None,
    room: NDArray[np.float64] | None,
) -> NDArray[np.int64]:
    """``ranks`` (S, n) of items ``cost`` (S, n) improved: per pass, in every step, the move of one item
    from the slowest rank (time = load / speed) to the rank that finishes first, or the swap of one item
    of each, that gives the lower max of the two times, where it is below the slowest time (ties: the
    lowest item columns). The slowest rank keeps one item; the caps (``need`` (S, n, k), ``room`` (k,))
    hold. A copy; stops early when no step improves."""
    ranks = ranks.copy()
    s, n = cost.shape
    rows = np.arange(s)
    flat = rows[:, None] * w
    for _ in range(REFINE_PASSES):
        loads = np.bincount((flat + ranks).ravel(), cost.ravel(), s * w).reshape(s, w)
        times = loads / speed[None, :]
        hi, lo = np.argmax(times, axis=1), np.argmin(times, axis=1)
        in_hi, in_lo = ranks == hi[:, None], ranks == lo[:, None]
        xs, x_ok = _first_of(in_hi, int(in_hi.sum(axis=1).max()))
        ys, y_ok = _first_of(in_lo, int(in_lo.sum(axis=1).max()))
        x = np.where(x_ok, np.take_along_axis(cost, xs, axis=1), 0.0)
        y = np.concatenate(
            [np.where(y_ok, np.take_along_axis(cost, ys, axis=1), 0.0), np.zeros((s, 1))], axis=1
        )
        moved = x[:, :, None] - y[:, None, :]  # (S, X, Y+1): cost from hi to lo; the last column moves only
        new_hi = (loads[rows, hi][:, None, None] - moved) / speed[hi][:, None, None]
        new_lo = (loads[rows, lo][:, None, None] + moved) / speed[lo][:, None, None]
        score = np.maximum(new_hi, new_lo)
        ok = x_ok[:, :, None] & np.concatenate([y_ok, np.ones((s, 1), bool)], axis=1)[:, None, :]
        ok[:, :, -1] &= (in_hi.sum(axis=1) >= 2)[:, None]
        ok &= (hi != lo)[:, None, None]
        if need is not None and room is not None:
            nx = np.take_along_axis(need, xs[:, :, None], axis=1) * x_ok[:, :, None]
            ny = np.take_along_axis(need, ys[:, :, None], axis=1) * y_ok[:, :, None]
            ny = np.concatenate([ny, np.zeros((s, 1, need.shape[2]))], axis=1)
            used = np.zeros((s * w, need.shape[2]))
            np.add.at(used, (flat + ranks).ravel(), need.reshape(s * n, -1))
            used = used.reshape(s, w, -1)
            shift = nx[:, :, None, :] - ny[:, None, :, :]
            ok &= (used[rows, hi][:, None, None, :] - shift <= room).all(axis=3)
            ok &= (used[rows, lo][:, None, None, :] + shift <= room).all(axis=3)
        score = np.where(ok, score, np.inf).reshape(s, -1)
        best = np.argmin(score, axis=1)
        better = score[rows, best] < times[rows, hi] * (1.0 - 1e-12)
        if not better.any():
            break
        i, j = np.divmod(best, y.shape[1])
        at = rows[better]
        ranks[at, xs[at, i[better]]] = lo[better]
        swap = better & (j < ys.shape[1])
        ranks[rows[swap], ys[rows[swap], j[swap]]] = hi[swap]
    return ranks


def _room(
    costs: NDArray[np.float64], limits: PoolLimits | None
) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    """((P, k) what each pool entry takes of a rank-step's room, (k,) the room) of the active caps, or None."""
    if limits is None or not limits.caps.active:
        return None
    c, cols, room = limits.caps, [], []
    if c.max_samples is not None:
        cols.append(np.ones(costs.size))
        room.append(float(c.max_samples))
    if c.max_cost is not None:
        cols.append(costs)
        room.append(float(c.max_cost))
    if c.max_points is not None and limits.points is not None:
        cols.append(np.asarray(limits.points, dtype=np.float64))
        room.append(float(c.max_points))
    if c.memory is not None and limits.memory is not None:
        cols.append(np.asarray(limits.memory, dtype=np.float64))
        room.append(float(c.memory.max_bytes - c.memory.model.base))
    if not cols:
        return None
    return np.stack(cols, axis=1), np.asarray(room)


def _grouped(items: NDArray[np.int64], ranks: NDArray[np.int64], w: int) -> NDArray[np.int64]:
    """(S, W, M) plan of (S, n) items and their ranks (S, n): each rank's items in their given order,
    ``-1`` after them (scattered by ``dense.dense_plan``, the one rows-to-array rule)."""
    s, n = items.shape
    by_rank = np.argsort(ranks, axis=1, kind="stable")
    items = np.take_along_axis(items, by_rank, axis=1)
    ranks = np.take_along_axis(ranks, by_rank, axis=1)
    counts = np.zeros((s, w), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(s), n), ranks.ravel()), 1)
    start = np.cumsum(counts, axis=1) - counts  # (S, W) first position of each rank's items
    slot = np.arange(n)[None, :] - np.take_along_axis(start, ranks, axis=1)
    step = np.repeat(np.arange(s), n)
    return dense_plan(step, ranks.ravel(), slot.ravel(), items.ravel(), s, w, int(counts.max(initial=1)))


def plan(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    bucket_ids: NDArray[np.int32] | None,
    limits: PoolLimits | None = None,
    speeds: NDArray[np.float64] | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch: ``random``'s steps (``rng`` must be the generator ``random`` gets), each split by
    ``lpt_free`` within the caps and for the rank ``speeds`` (W,) (None: all equal).

    Args:
        costs: (P,) pool costs, P % (W*B) == 0.

    Returns:
        (P / (W*B), W, M) int64 pool indices, ``-1`` = empty slot; each step the samples of ``random``'s.
    """
    del bucket_ids
    w = world_size
    steps = random_.plan(costs, w, batch_size, rng, None, None).reshape(-1, w * batch_size)
    room = _room(costs, limits)
    parts = []
    for a in range(0, steps.shape[0], _CHUNK_STEPS):
        chunk = steps[a : a + _CHUNK_STEPS]
        needs = None if room is None else room[0][chunk]
        ranks = lpt_free(costs[chunk], w, speeds, needs, None if room is None else room[1])
        speed = np.ones(w) if speeds is None else np.asarray(speeds, dtype=np.float64)
        ranks = _refine(costs[chunk], ranks, w, speed, needs, None if room is None else room[1])
        parts.append(_grouped(chunk, ranks, w))
    width = max((p.shape[2] for p in parts), default=batch_size)
    out = np.full((steps.shape[0], w, width), -1, dtype=np.int64)
    at = 0
    for p in parts:
        out[at : at + p.shape[0], :, : p.shape[2]] = p
        at += p.shape[0]
    return permute_ranks(out, rng, speeds)
