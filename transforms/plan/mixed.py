"""``mixed``: random rank batches, grouped into steps by their total cost.

``balanced`` builds every step from neighbours in cost, so the same samples meet again epoch
after epoch. With ``B >= 2`` a rank's batch can mix a big and a small sample: what must match
within a step is the *sum* of each rank's batch, not its members. So:

1. cut a random permutation of the pool into ``P / B`` random rank batches (``B`` samples each);
2. sort the batches by a jittered key ``log(batch cost) + eps * u``, ``u ~ U(-1, 1)``;
3. cut that order into steps of ``W`` batches;
4. per step, keep the random batches or re-split the step's ``W*B`` samples with equal-count LPT,
   whichever has the smaller slowest rank (the step's members stay the same either way);
5. permute rank labels per step and shuffle the step order.

Sums of ``B`` random costs are dense and concentrated, so neighbouring batches have nearly equal
sums while their members are drawn afresh each epoch: step-mates rarely meet again. ``eps`` is the
largest rung of ``balanced.EPS_LADDER`` whose predicted linearity is within ``TOLERANCE`` of the
equal-count bound (bisection, as in ``balanced``). Where a heavy tail makes random batches miss
the target at every eps (a giant's random partner shifts its batch sum by more than the gap to
the next giant), the heaviest ``k`` steps' worth of samples are planned as ``balanced`` plans
them (jittered sort of single costs) and only the rest as random batches; ``k`` grows from 0 over
``_tail_ladder`` until the epoch passes (``k = S, eps = 0`` is the bound itself), then is bisected
down between that rung and the one below. Those tail steps hold cost neighbours, the same ones
every epoch, so they are where step-mates repeat: the fewest of them, and the tail gets its own
jitter (the largest rung that passes with an exact head), before the head's jitter is chosen with
the tail's fixed. With ``B == 1`` a batch is one sample and the strategy is ``balanced`` itself
(as random as balance allows there).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan import balanced
from lidarshard.transforms.plan._partition import partition_steps, permute_ranks
from lidarshard.transforms.plan.caps import PoolLimits
from lidarshard.transforms.plan.lpt import chunk_rows, lpt_assign
from lidarshard.transforms.plan.metrics import linearity, step_linearity

__all__ = ["plan", "plan_within", "choose_steps"]


#: Steps re-split at a time: LPT's temporaries (~8 arrays of the steps' size) stay small (4 MiB at W*B = 128).
_CHUNK_STEPS = 1 << 9
#: Bisection steps that refine the number of tail steps between two rungs of ``_tail_ladder``.
_K_REFINE = 6


def _split_steps(batches: NDArray[np.int64], costs: NDArray[np.float64], w: int) -> NDArray[np.int64]:
    """(S, W, B) steps of ``W`` consecutive batches, each re-split by LPT where that is better.

    Args:
        batches: (P/B, B) pool indices in step order, overwritten (the caller's own copy).
    """
    steps = batches.reshape(-1, w, batches.shape[1])
    rows = chunk_rows(w * batches.shape[1])
    for a in range(0, steps.shape[0], rows):  # every step on its own: same result as at once
        steps[a : a + rows] = _split_chunk(steps[a : a + rows], costs)
    return steps


def _split_chunk(steps: NDArray[np.int64], costs: NDArray[np.float64]) -> NDArray[np.int64]:
    """``_split_steps`` of (s, W, B) steps."""
    s, w, b = steps.shape
    if s == 0:
        return steps
    flat = steps.reshape(s, w * b)
    cols = lpt_assign(costs[flat], w, b).reshape(s, -1)
    lpt = np.take_along_axis(flat, cols, axis=1).reshape(s, w, b)
    keep = costs[steps].sum(-1).max(axis=1) <= costs[lpt].sum(-1).max(axis=1)
    return np.where(keep[:, None, None], steps, lpt)


def _tail_ladder(num_steps: int) -> list[int]:
    """Numbers of heaviest steps to plan sorted: 0, then S/64, S/32, ... up to all S."""
    return sorted({0, num_steps} | {-(-num_steps // 2**k) for k in range(6, 0, -1)})


def _batch_sums(costs: NDArray[np.float64], batches: NDArray[np.int64]) -> NDArray[np.float64]:
    """(N,) cost of each of the (N, B) batches, summed column by column (same bits on every CPU)."""
    total = costs[batches[:, 0]].copy()
    for j in range(1, batches.shape[1]):
        total += costs[batches[:, j]]
    return total


def _bisect(
    build: Callable[[float], NDArray[np.int64]], ok: Callable[[NDArray[np.int64]], bool]
) -> tuple[float, NDArray[np.int64]]:
    """The largest ``EPS_LADDER`` rung for which ``ok(build(eps))``, and its steps.

    The last rung (eps 0) is known to pass; linearity falls as eps grows, so the rungs are bisected
    like ``balanced.choose_eps``. Only the newest passing rung's steps are held (8 bytes a sample);
    the last rung's are built again when no other rung passes.
    """
    ladder = balanced.EPS_LADDER
    lo, hi = 0, len(ladder) - 1  # invariant: rung hi passes
    best = None
    while lo < hi:
        mid = (lo + hi) // 2
        steps = build(ladder[mid])
        if ok(steps):
            hi, best = mid, steps
        else:
            lo = mid + 1
        del steps
    return ladder[hi], best if best is not None else build(ladder[hi])


class _Split:
    """The pool cut at ``k`` tail steps: random head batches and the ``k * W * B`` heaviest samples.

    Args:
        k: tail steps.
        costs: (P,) pool costs.
        by_cost: (P,) pool order by (cost, ``u_item``); may be empty when ``k == 0``.
        shuffled: (P,) random permutation of the pool (the head batches, in that order).
        u_item: (P,) per-sample jitter draws in [-1, 1) (the tail's; empty when ``k == 0``).
        u_head: (P / B,) per-batch jitter draws in [-1, 1) (the head's; a prefix is used).
    """

    def __init__(
        self,
        k: int,
        costs: NDArray[np.float64],
        w: int,
        b: int,
        by_cost: NDArray[np.int64],
        shuffled: NDArray[np.int64],
        u_item: NDArray[np.float64],
        u_head: NDArray[np.float64],
    ) -> None:
        self.k, self.costs, self.w, self.b, self.u_item = k, costs, w, b, u_item
        cut = costs.size - k * w * b
        self.tail = by_cost[cut:]
        if k:  # the samples left of the cut, in shuffled order (k = 0, the usual case: all of them)
            in_head = np.zeros(costs.size, dtype=bool)
            in_head[by_cost[:cut]] = True
            self.head = shuffled[in_head[shuffled]].reshape(-1, b)
        else:
            self.head = shuffled.reshape(-1, b)
        self.tail_log = balanced.log_cost(costs)[self.tail] if self.tail.size else np.empty(0)
        self.head_log = balanced.log_cost(_batch_sums(costs, self.head))
        self.u_head = u_head[: self.head.shape[0]]

    def build(self, eps_head: float, eps_tail: float) -> NDArray[np.int64]:
        """(S, W, B) steps: head steps (jitter ``eps_head``), then tail steps (``eps_tail``)."""
        order = balanced.jittered_order(self.head_log, self.u_head, eps_head)
        h_steps = _split_steps(self.head[order], self.costs, self.w)
        if not self.tail.size:
            return h_steps
        t = self.tail[balanced.jittered_order(self.tail_log, self.u_item[self.tail], eps_tail)]
        return np.concatenate([h_steps, partition_steps(t, self.costs, self.w, self.b)])


def choose_steps(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    tolerance: float = balanced.TOLERANCE,
) -> tuple[int, NDArray[np.int64]]:
    """Fewest tail steps, then most jitter (tail first, then head), within ``tolerance`` of the bound.

    The heaviest ``k`` steps' worth of samples are planned as ``balanced`` plans (jittered
    sort of single costs, LPT); the rest as random batches (module docstring). ``k`` runs up
    ``_tail_ladder`` and is then bisected between the last rung that missed and the first that
    passed; ``k = S`` with both jitters 0 is the bound itself, so some ``k`` always passes.

    Args:
        costs: (P,) pool costs, P % (W*B) == 0.

    Returns:
        (k, (S, W, B) pool indices in unshuffled step order: head steps, then tail steps).
    """
    w, b = world_size, batch_size
    per_step = w * b
    target = step_linearity(np.sort(costs).reshape(-1, per_step), w, b) - tolerance
    again = copy.deepcopy(rng)  # u_item drawn again from here once a tail needs it (k > 0): 8 bytes a sample
    rng.uniform(-1.0, 1.0, costs.size)
    u_item = np.empty(0)
    shuffled = rng.permutation(costs.size).astype(np.int64, copy=False)
    u_head = rng.uniform(-1.0, 1.0, costs.size // b)
    by_cost = np.empty(0, np.int64)  # order by (cost, u_item): sorted once a tail is needed (k > 0)

    def ok(steps: NDArray[np.int64]) -> bool:
        return linearity(steps, costs) >= target

    def split(k: int) -> tuple[_Split, NDArray[np.int64]]:
        nonlocal by_cost, u_item
        if k and not by_cost.size:
            u_item = again.uniform(-1.0, 1.0, costs.size)
            by_cost = np.lexsort((u_item, costs)).astype(np.int64, copy=False)
        cut = _Split(k, costs, w, b, by_cost, shuffled, u_item, u_head)
        return cut, cut.build(0.0, 0.0)  # the most balanced jitter: if it misses, so does every other

    missed = -1
    for k in _tail_ladder(costs.size // per_step):
        cut, exact = split(k)
        if ok(exact):
            break
        missed = k
        del cut, exact
    else:  # pragma: no cover
        raise AssertionError("k = S, eps = 0 reproduces the bound and must pass")
    for _ in range(_K_REFINE):  # fewer tail steps: bisect between the rung that missed and k
        if k - missed <= 1:
            break
        mid = (missed + k) // 2
        cut_mid, exact_mid = split(mid)
        if ok(exact_mid):
            k, cut, exact = mid, cut_mid, exact_mid
        else:
            missed = mid
        del cut_mid, exact_mid
    del exact  # what passed at eps 0: _bisect builds it again if no jitter passes
    eps_tail = _bisect(lambda e: cut.build(0.0, e), ok)[0] if k else 0.0
    eps_head, steps = _bisect(lambda e: cut.build(e, eps_tail), ok)
    return k, steps


def plan(
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    rng: np.random.Generator,
    bucket_ids: NDArray[np.int32] | None,
    limits: PoolLimits | None = None,
) -> NDArray[np.int64]:
    """Plan one epoch near the equal-count bound whose step-mates change between epochs.

    Caps (``limits``) are not planned for, only checked by ``plan_epoch``, as for ``balanced``.

    Returns:
        (S, W, B) int64 pool indices.
    """
    del bucket_ids, limits
    return plan_within(costs, world_size, batch_size, rng, balanced.TOLERANCE)


def plan_within(
    costs: NDArray[np.float64], world_size: int, batch_size: int, rng: np.random.Generator, tolerance: float
) -> NDArray[np.int64]:
    """``plan`` held within ``tolerance`` of the bound (``plan`` is ``balanced.TOLERANCE``'s): (S, W, B)."""
    if batch_size == 1:
        return balanced.plan_within(costs, world_size, batch_size, rng, tolerance)
    _, steps = choose_steps(costs, world_size, batch_size, rng, tolerance)
    steps = permute_ranks(steps, rng)
    return steps[rng.permutation(steps.shape[0])]
