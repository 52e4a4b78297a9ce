"""The rest of an epoch on another world size, exactly: merge ranks or plan the remaining entries again.

Pure numpy; imports neither Beam nor torch. Plans are ``(S, W, M)`` int64 arrays of samples rows,
``-1`` marking an empty slot (every rank-step holds >= 1 entry).

* :func:`merge_ranks` folds ``W`` ranks onto a divisor ``W'`` (when ``B'`` is ``B`` or ``(W/W')*B`` and
  counts are equal): a rearrangement, nothing random, never less balanced than the original steps.
* :func:`replan_pool` plans a multiset of remaining entries on ``W' x B'`` with the manifest's
  strategy (``lidarshard.transforms.plan.plan_epoch``) and neither drops nor repeats an entry: the
  ``q = R // (W'*B')`` full steps come from the strategy; the ``r = R % (W'*B')`` lightest entries
  left over form one more step spread over all ranks (``r >= W'``) or join the last full step
  (``r < W'``), greedily onto the least-loaded rank. Such steps hold uneven counts, so trainers
  scale the summed loss by ``W' / N_step`` (``ElasticPlan.loss_scales``).
* :func:`check_exact` is the consumer's check that consumed + remaining is the epoch's plan.
* :class:`ElasticPlan` chains switches: ``plan.switch(consumed_steps, W', B')``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan import ANY_POOL, STRATEGIES, VARIABLE_COUNT, plan_epoch, seeds
from lidarshard.transforms.plan.caps import PoolLimits, check_caps
from lidarshard.transforms.plan.lpt import lpt_rounds
from lidarshard.transforms.plan.metrics import greedy_reference_linearity, linearity
from lidarshard.transforms.plan.order import heaviest_first

__all__ = ["ElasticPlan", "Switch", "merge_ranks", "replan_pool", "check_exact"]

#: One switch: after ``consumed_steps`` steps of the current plan, continue on ``(W', B')``.
Switch = tuple[int, int, int]


def merge_ranks(
    rows: NDArray[np.int64], world_size: int, *, keep_batch_size: bool = False
) -> NDArray[np.int64]:
    """Fold ``W`` ranks onto ``W'`` (a divisor of ``W``): new rank ``r'`` takes old ranks ``r'k..r'k+k-1``.

    Args:
        rows: (S, W, M) plan of any ids (``-1`` slots travel with their rank-step).
        world_size: W' with ``W % W' == 0``; ``k = W / W'``.
        keep_batch_size: False: concatenate the k batches, (S, W', k*M), global batch unchanged.
            True: run them one after another, (k*S, W', M), step ``s*k + j`` holding old rank
            ``r'k + j`` of step ``s`` on rank ``r'``.

    Returns:
        The merged plan, a rearrangement of ``rows`` (same multiset, steps stay in order).
    """
    s, w, b = rows.shape
    if world_size < 1 or w % world_size:
        raise ValueError(f"world_size {world_size} does not divide the plan's {w} ranks")
    k = w // world_size
    rows = np.ascontiguousarray(rows)
    if not keep_batch_size:
        return rows.reshape(s, world_size, k * b)
    return rows.reshape(s, world_size, k, b).transpose(0, 2, 1, 3).reshape(s * k, world_size, b)


def replan_pool(
    pool: NDArray[np.int64],
    costs: NDArray[np.float64],
    strategy: str,
    world_size: int,
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    bucket_ids: NDArray[np.int32] | None = None,
    limits: PoolLimits | None = None,
) -> NDArray[np.int64]:
    """Plan every entry of ``pool`` exactly once on ``world_size x batch_size`` with ``strategy``.

    Args:
        pool: (R,) samples rows still to train this epoch (a multiset: repeats stay repeats).
        costs: (N,) cost of every samples row; bucket_ids: (N,) or None; limits: caps with (N,) points.
        strategy: the manifest's strategy (a key of ``lidarshard.transforms.plan.STRATEGIES``).
        seed, epoch: seed the strategy and the order it sees (derive ``seed`` from the switch history).

    Returns:
        (S', W', M) int64 samples rows, ``-1`` = empty slot; every rank-step holds >= 1 entry. Equal-count
        strategies: ``R // (W'*B')`` full steps, then the leftover (module docstring).

    Raises:
        ValueError: ``0 < R < W'`` (some rank would get nothing), or the result breaks the manifest's caps.
    """
    w, b = int(world_size), int(batch_size)
    r_all = int(pool.size)
    if r_all == 0:
        return np.empty((0, w, b), dtype=np.int64)
    if r_all < w:
        raise ValueError(
            f"{r_all} planned entries are left in the epoch, fewer than world_size {w}: every rank needs "
            f"at least one per step; restart on at most {r_all} ranks, or start the next epoch"
        )
    # a seeded order so the planner's tie-breaks follow neither row ids nor the switch that came before
    order = np.sort(pool)[seeds.rng(seed, 1).permutation(r_all)]

    def plan(entries: NDArray[np.int64]) -> NDArray[np.int64]:
        sub = (
            PoolLimits(
                limits.caps,
                None if limits.points is None else limits.points[entries],
                None if limits.memory is None else limits.memory[entries],
            )
            if limits
            else None
        )
        ids = None if bucket_ids is None else bucket_ids[entries]
        p = plan_epoch(strategy, costs[entries], w, b, seed=seed, epoch=epoch, bucket_ids=ids, limits=sub)
        return np.where(p >= 0, entries[p], -1)

    try:
        if strategy in ANY_POOL:  # any pool size >= W: nothing left over
            return plan(order)
        step = w * b
        q, r = divmod(r_all, step)
        if r:  # the lightest r entries are left over: the extra (or fuller) step costs least time
            light = np.lexsort((order, costs[order]))[:r]
            keep = np.ones(r_all, dtype=bool)
            keep[light] = False
            order, rest = order[keep], order[np.sort(light)]
        rows = plan(order) if q else np.empty((0, w, b), dtype=np.int64)
        if r:
            rows = _place_rest(rows, rest, costs, extra_step=r >= w)
        check_caps(rows, limits, costs, epoch)
    except ValueError as e:
        raise ValueError(f"cannot re-plan the rest of epoch {epoch} on {w} x {b} ({strategy}): {e}") from None
    return rows


def _place_rest(
    rows: NDArray[np.int64], rest: NDArray[np.int64], costs: NDArray[np.float64], *, extra_step: bool
) -> NDArray[np.int64]:
    """Add ``rest`` (r,) heaviest first onto the least-loaded rank (empty ranks first): as a new last
    step (``extra_step``; needs ``r >= W``) or into the last step of ``rows`` (S, W, M). Returns (S', W, M')."""
    s, w, m = rows.shape
    rest = rest[np.lexsort((rest, -costs[rest]))]  # heaviest first, ties by row
    if extra_step:  # empty ranks first: rank k takes the k-th heaviest, then LPT on from there
        first, rest = rest[:w], rest[w:]
        loads = costs[first]
        target: list[list[int]] = [[int(i)] for i in first]
    else:
        last = rows[-1]
        loads = np.where(last >= 0, costs[np.maximum(last, 0)], 0.0).sum(axis=1)
        target = [[int(v) for v in last[k] if v >= 0] for k in range(w)]
    for i, k in zip(rest.tolist(), lpt_rounds(loads, np.zeros(w), costs[rest]).tolist(), strict=True):
        target[k].append(i)
    width = max(m, max(len(t) for t in target))
    step = np.full((1, w, width), -1, dtype=np.int64)
    for k, t in enumerate(target):
        step[0, k, : len(t)] = t
    out = np.full((s + extra_step, w, width), -1, dtype=np.int64)
    out[:s, :, :m] = rows
    out[s + extra_step - 1] = step[0]
    return out


def check_exact(
    planned: NDArray[np.int64], consumed: NDArray[np.int64], rows: NDArray[np.int64], n: int, epoch: int
) -> None:
    """Refuse a plan whose trained + remaining entries are not the epoch's plan, or that has an empty rank-step.

    Args:
        planned: the epoch's plan (any shape, ``-1`` ignored); consumed: (C,) entries trained before the
            last switch; rows: (S, W, M) the current plan; n: samples rows (ids are in ``0..n-1``).

    Raises:
        ValueError: one line saying how many entries differ (a bug or an edited manifest; never trained).
    """
    want = np.bincount(planned[planned >= 0], minlength=n)
    got = np.bincount(consumed, minlength=n) + np.bincount(rows[rows >= 0], minlength=n)
    if want.size != got.size or not np.array_equal(want, got):
        diff = int(np.abs(want - got).sum()) if want.size == got.size else -1
        raise ValueError(
            f"epoch {epoch}: the trained and remaining steps are not the epoch's plan ({diff} entries differ); "
            "refusing to train a wrong epoch (a bug, or a manifest edited since the checkpoint)"
        )
    if rows.size and not (rows >= 0).any(axis=2).all():
        raise ValueError(f"epoch {epoch}: a rank-step of the plan holds no sample; refusing to train it")


@dataclass(frozen=True, eq=False)
class ElasticPlan:
    """The rest of one epoch on the current world size, with what was trained before the last switch.

    ``rows`` index the samples' rows (the default dataset order). Invariant: the multiset
    ``consumed + rows`` equals the manifest's plan of the epoch (``loaders.replan.check_exact``).

    Attributes:
        rows: (S, W, M) int64 samples row of every slot of the steps still to run, ``-1`` = an empty slot
            where counts differ (``budget``, a re-plan's last step, merges of those); each rank-step >= 1.
        costs: (N,) float64 cost of every samples row (cost-model units).
        consumed: (C,) rows trained before the last switch, in training order (step, rank, slot).
        epoch, seed, strategy: from the manifest; they seed and shape re-plans.
        batch: B, samples per rank of a full step (the mean count under ``budget``).
        history: the switches applied so far, ``((consumed_steps, W', B'), ...)``.
        bucket_ids: (N,) int32 bucket of every row (``stratified`` re-plans by it), or None.
        limits: the manifest's caps with (N,) points per row, or None.
        heavy: (N,) the values ``--heaviest-first`` orders by (points or cost of every row), or None:
            every switch that changes the rows puts the heaviest remaining rank-step first.
    """

    rows: NDArray[np.int64]
    costs: NDArray[np.float64]
    consumed: NDArray[np.int64]
    epoch: int
    seed: int
    strategy: str
    batch: int
    history: tuple[Switch, ...] = ()
    bucket_ids: NDArray[np.int32] | None = None
    limits: PoolLimits | None = None
    heavy: NDArray | None = None

    @classmethod
    def of(
        cls,
        rows: NDArray[np.int64],
        costs: NDArray[np.float64],
        *,
        strategy: str,
        epoch: int = 0,
        seed: int = 0,
        batch: int | None = None,
    ) -> ElasticPlan:
        """A plan with nothing consumed: ``rows`` (S, W, M) over ``costs`` (N,); ``batch`` defaults to M."""
        rows = np.asarray(rows, dtype=np.int64)
        b = int(rows.shape[2]) if batch is None else int(batch)
        return cls(rows, costs, np.empty(0, np.int64), epoch=epoch, seed=seed, strategy=strategy, batch=b)

    @property
    def steps(self) -> int:
        return int(self.rows.shape[0])

    @property
    def world_size(self) -> int:
        return int(self.rows.shape[1])

    @property
    def batch_size(self) -> int:
        return int(self.batch)

    def counts(self) -> NDArray[np.int64]:
        """(S,) samples of all ranks at each remaining step."""
        return (self.rows >= 0).sum(axis=(1, 2)).astype(np.int64)

    def loss_scales(self) -> NDArray[np.float64]:
        """(S,) ``W / N_s``: multiply step s's *summed* per-sample loss by it (the global-batch mean under DDP)."""
        return self.world_size / np.maximum(self.counts(), 1).astype(np.float64)

    def balance(self) -> dict[str, float]:
        """``{"linearity", "greedy_reference"}`` of the remaining steps (``lidarshard.transforms.plan.metrics``);
        the equal-count reference over the first ``P - P % (W*B)`` entries."""
        valid = self.rows >= 0
        pool = np.full(self.rows.shape, -1, dtype=np.int64)
        pool[valid] = np.arange(int(valid.sum()))
        c = self.costs[self.rows[valid]]
        fitted = c[: c.size - c.size % (self.world_size * self.batch_size)]
        return {
            "linearity": linearity(pool, c) if c.size else 1.0,
            "greedy_reference": greedy_reference_linearity(fitted, self.world_size, self.batch_size)
            if fitted.size
            else 1.0,
        }

    def switch(self, consumed_steps: int, world_size: int, batch_size: int | None = None) -> ElasticPlan:
        """Continue after ``consumed_steps`` finished steps on ``world_size`` ranks of ``batch_size``.

        Args:
            consumed_steps: steps of this plan every rank has finished, ``0..steps``.
            world_size: W' >= 1.
            batch_size: B' >= 1; default ``ceil(W*B / W')`` (the global batch kept, or grown to split).

        Returns:
            The new plan: merged when W' divides W and B' is ``B`` or ``(W/W')*B`` (equal counts),
            re-planned otherwise (module docstring); the same rows when ``(W', B') == (W, B)``.

        Raises:
            ValueError: an argument out of range, fewer remaining entries than W', or the caps broken.
        """
        s, w, b = self.steps, self.world_size, self.batch_size
        if not 0 <= consumed_steps <= s:
            raise ValueError(f"consumed_steps {consumed_steps} is outside 0..{s}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if batch_size is None:  # the smallest batch that keeps the global batch, as ElasticBatchSampler
            batch_size = -(-w * b // world_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        done, rest = self.rows[:consumed_steps].ravel(), self.rows[consumed_steps:]
        out = replace(
            self,
            consumed=np.concatenate([self.consumed, done[done >= 0]]),
            history=(*self.history, (int(consumed_steps), int(world_size), int(batch_size))),
            batch=int(batch_size),
        )
        if (world_size, batch_size) == (w, b):
            return replace(out, rows=np.ascontiguousarray(rest))
        mergeable = w % world_size == 0 and batch_size in (b, (w // world_size) * b)
        if mergeable and self.strategy not in VARIABLE_COUNT:
            return replace(
                out, rows=self._ordered(merge_ranks(rest, world_size, keep_batch_size=batch_size == b))
            )
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"the manifest's strategy {self.strategy!r} is not one of {sorted(STRATEGIES)}: cannot re-plan"
            )
        seed = seeds.derive(self.seed, self.epoch, len(out.history), *np.ravel(out.history))
        rows = replan_pool(
            rest[rest >= 0],
            self.costs,
            self.strategy,
            world_size,
            batch_size,
            seed=seed,
            epoch=self.epoch,
            bucket_ids=self.bucket_ids,
            limits=self.limits,
        )
        return replace(out, rows=self._ordered(rows))

    def _ordered(self, rows: NDArray[np.int64]) -> NDArray[np.int64]:
        """``rows`` with the heaviest rank-step first when the manifest asks for it (``heavy``)."""
        return rows if self.heavy is None else heaviest_first(rows, self.heavy)
