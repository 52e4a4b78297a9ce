"""One epoch's plan in sample space (``plan_samples``) under a ``PlanConfig`` (``transforms.core.config``). Pure.

The build plans each epoch once, from the numeric columns of the scored samples (``cost``,
``bucket_id``, ``num_points``, ``weight``): ``plan_samples`` gives the strategy's plan (its heaviest
rank-step moved to step 0 under ``heaviest_first``, ``lidarshard.transforms.plan.order``), the ``random``
baseline on the same pool (the reference of ``random_linearity``) and the epoch's stats; the pair
repeat rates of epochs 0 and 1 come from those same plans (``repeat_rates``). ``lidarshard validate``
re-derives them independently with the same functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.features import buckets
from lidarshard.transforms.features.cost import CostModel, sample_costs
from lidarshard.transforms.plan import ANY_POOL, order, plan_epoch, seeds
from lidarshard.transforms.plan.caps import PoolLimits
from lidarshard.transforms.plan.metrics import balance_summary, equal_count_pool, pair_repeat_rate
from lidarshard.transforms.plan.speeds import normalized

__all__ = [
    "PLAN_ENTRY_BYTES",
    "memory_bytes",
    "EpochPlan",
    "COST_FEATURES",
    "as_planned",
    "bucket_costs",
    "plan_samples",
    "plan_pool",
    "to_samples",
    "epoch_pool",
    "repeat_rates",
    "bucket_edges",
    "streamed_bucket_edges",
    "bucket_record",
]

#: Memory one plan entry (a sample's place in one epoch) takes while its epoch is planned, written and
#: re-planned by the publish's validation, in bytes: the strategies alone measured 75-155 (2M entries),
#: the plan rows and their table add more. ``check_plan_size`` refuses a plan that cannot fit with it.
PLAN_ENTRY_BYTES = 256


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """One epoch planned once: the strategy's plan, the ``random`` reference on the same pool, stats.

    Attributes:
        plan: (S, W, M) int64 sample row indices, ``-1`` = empty slot (variable counts).
        baseline: (S', W, B) int64 sample row indices of the ``random`` strategy on the pool's first
            ``P - P % (W*B)`` entries (the plan behind ``random_linearity``).
        stats: the manifest's ``balance`` entry of the epoch plus ``planned``, ``dropped``, ``padded``.
    """

    plan: NDArray[np.int64]
    baseline: NDArray[np.int64] = field(repr=False)
    stats: dict


def bucket_costs(
    costs: NDArray[np.float64], cfg: PlanConfig
) -> tuple[NDArray[np.int32], NDArray[np.float64]]:
    """(bucket id per cost (N,), bucket edges (K-1,)): exact quantile buckets of ``costs``."""
    edges = bucket_edges(costs, cfg)
    return buckets.assign_buckets(costs, edges), edges


def bucket_edges(costs: NDArray[np.float64], cfg: PlanConfig) -> NDArray[np.float64]:
    """(K-1,) the exact quantile bucket edges of (N,) ``costs``.

    Raises:
        ValueError: ``--bucket-weights`` of neither 1 nor K weights (one line).
    """
    k = cfg.num_buckets or buckets.default_num_buckets(max(len(costs), 1))
    return _weighed(buckets.quantile_edges(costs, k) if len(costs) else np.empty(0), cfg)


def streamed_bucket_edges(
    chunks: Callable[[], Iterable[NDArray[np.float64]]], n: int, cfg: PlanConfig
) -> NDArray[np.float64]:
    """``bucket_edges`` of the ``n`` costs each call of ``chunks()`` yields in pieces, never held whole
    (``buckets.streamed_quantile_edges``)."""
    k = cfg.num_buckets or buckets.default_num_buckets(max(n, 1))
    return _weighed(buckets.streamed_quantile_edges(chunks, n, k) if n else np.empty(0), cfg)


def _weighed(edges: NDArray[np.float64], cfg: PlanConfig) -> NDArray[np.float64]:
    """``edges``, when ``--bucket-weights`` gives 1 weight or one per bucket (else a one-line ValueError)."""
    if cfg.weights is not None and len(cfg.weights) > 1 and len(cfg.weights) != len(edges) + 1:
        raise ValueError(
            f"--bucket-weights gives {len(cfg.weights)} weights but the costs make only {len(edges) + 1} "
            f"distinct buckets (tied costs); give 1 or {len(edges) + 1} weights"
        )
    return edges


def bucket_record(edges: NDArray[np.float64], counts: NDArray[np.int64], cfg: PlanConfig) -> dict:
    """The manifest's ``buckets`` object of ``edges`` (K-1,) and the samples in each bucket (K,)."""
    return {
        "edges": [float(e) for e in edges],
        "weights": buckets.resolve_weights(cfg.weights, len(edges) + 1).tolist(),
        "counts": counts.tolist(),
    }


#: The size features a cost model reads (``sample_costs``): what ``as_planned`` needs of an earlier epoch.
COST_FEATURES = ("num_in_range", "num_points", "occupied_voxels")


class _Recosted:
    """A scored table with ``cost`` and ``bucket_id`` replaced: those of ``model`` (a cost model and its
    bucket edges)."""

    def __init__(
        self,
        base: Any,
        model: tuple[CostModel, tuple[float, ...]],
        cost: NDArray[np.float64],
        bucket_id: NDArray[np.int32],
    ) -> None:
        self.base, self.model, self.num_rows, self.column_names = (
            base,
            model,
            base.num_rows,
            base.column_names,
        )
        self._own = {"cost": pa.array(cost, pa.float64()), "bucket_id": pa.array(bucket_id, pa.int32())}

    def column(self, name: str) -> Any:
        return self._own[name] if name in self._own else self.base.column(name)


def as_planned(scored: Any, epoch: int, cfg: PlanConfig) -> Any:
    """``scored`` as epoch ``epoch`` was planned: itself, or for an epoch before a re-plan
    (``cfg.planned_with``) with ``cost`` from the model that planned it and ``bucket_id`` from the
    buckets it had then; the table then needs ``COST_FEATURES``. The build, validate and report plan and
    check every epoch through this one function."""
    then = cfg.planned_with(epoch)
    if isinstance(scored, _Recosted):
        if then is not None and scored.model == then:
            return scored
        scored = scored.base
    if then is None:
        return scored
    model, edges = then
    costs = sample_costs(scored, model)
    return _Recosted(scored, then, costs, buckets.assign_buckets(costs, np.asarray(edges, np.float64)))


def plan_samples(scored: pa.Table, epoch: int, cfg: PlanConfig, *, baseline: bool = True) -> EpochPlan:
    """Plan one epoch in sample space, once (with the costs that plan it: ``as_planned``).

    Equal-count strategies plan a pool fitted to whole steps (``cfg.policy``); variable-count ones
    (``budget``) plan the whole pool, nothing dropped or padded. With caps the table needs
    ``num_points``. With G > 1 step groups (``cfg.groups``) the epoch is planned group by group
    (``transforms.core.groups``; the table then needs ``sample_id``). ``baseline=False`` skips the ``random`` reference and the stats (an empty
    baseline and ``{}``): what a check that only compares plans needs.
    """
    groups = cfg.groups(scored.num_rows)
    if groups > 1:
        from lidarshard.transforms.core import groups as grouped  # it builds on this module

        keys = grouped.keys_of(scored)
        plan_, reference_, stats_ = grouped.plan_hierarchical(
            as_planned(scored, epoch, cfg), keys, epoch, cfg, groups
        )
        return EpochPlan(plan_, reference_ if baseline else reference_[:0], stats_ if baseline else {})
    plan, pool, costs, dropped, padded = plan_pool(as_planned(scored, epoch, cfg), epoch, cfg)
    if not baseline:
        return EpochPlan(to_samples(plan, pool), np.empty((0, cfg.world_size, cfg.batch_size), np.int64), {})
    w, b = cfg.world_size, cfg.batch_size
    reference = plan_epoch("random", equal_count_pool(costs, w, b), w, b, seed=cfg.seed, epoch=epoch)
    stats = balance_summary(
        plan,
        costs,
        w,
        b,
        baseline=reference,
        epoch=epoch,
        speeds=cfg.rank_speed,
        step_cost=cfg.step_cost(epoch),
    )
    stats |= {"planned": int(pool.size), "dropped": int(dropped), "padded": int(padded)}
    del costs
    return EpochPlan(to_samples(plan, pool), to_samples(reference, pool), stats)


def to_samples(plan: NDArray[np.int64], pool: NDArray[np.int64]) -> NDArray[np.int64]:
    """(S, W, M) pool indices -> sample indices (``-1`` stays), one plan-sized array."""
    out = pool[plan]  # -1 reads the last entry; reset below
    out[plan < 0] = -1
    return out


def plan_pool(
    scored: pa.Table, epoch: int, cfg: PlanConfig
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64], int, int]:
    """(plan (S, W, M) in pool space, pool (P,) sample indices, pool costs (P,), dropped, padded)."""
    costs = scored.column("cost").to_numpy()
    ids = scored.column("bucket_id").to_numpy()
    sample_weights = scored.column("weight").to_numpy() if "weight" in scored.column_names else None
    pool, dropped, padded = epoch_pool(ids, sample_weights, epoch, cfg)[:3]
    del sample_weights
    w, b = cfg.world_size, cfg.batch_size
    if pool.size == 0 or pool.size < w:
        raise ValueError(
            f"epoch {epoch}: {len(costs)} samples do not fill one step of W*B = "
            f"{w * b}; use --pad or a smaller --world-size/--batch-size"
        )
    points = None
    if cfg.caps.active or cfg.heaviest_first == "points":
        points = scored.column("num_points").to_numpy()[pool] if "num_points" in scored.column_names else None
    memory = None  # (P,) bytes each entry adds to its rank-step's predicted peak
    if cfg.caps.memory is not None:
        memory = cfg.caps.memory.model.sample_bytes(scored)[pool]
    limits = PoolLimits(cfg.caps, points, memory) if cfg.caps.active else None
    pooled = costs[pool]
    speeds = None if cfg.rank_speed is None else normalized(cfg.rank_speed)
    plan = plan_epoch(
        cfg.strategy,
        pooled,
        w,
        b,
        seed=cfg.seed,
        epoch=epoch,
        bucket_ids=ids[pool],
        limits=limits,
        speeds=speeds,
    )
    if cfg.heaviest_first == "points":
        if points is None:
            raise ValueError("--heaviest-first points needs the samples' num_points")
        plan = order.heaviest_first(plan, points)
    elif cfg.heaviest_first == "cost":
        plan = order.heaviest_first(plan, pooled)
    elif cfg.heaviest_first == "memory":
        if memory is None:
            raise ValueError("--heaviest-first memory needs a memory model: give --max-step-memory")
        plan = order.heaviest_first(plan, memory)
    return plan, pool, pooled, dropped, padded


def memory_bytes() -> int | None:
    """This machine's physical memory, or its cgroup's limit when lower (bytes; None when unknown)."""
    found = []
    try:
        found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            found.append(int(text))
    return min((n for n in found if n > 0), default=None)


def epoch_pool(
    ids: NDArray[np.int32], sample_weights: NDArray[np.float64] | None, epoch: int, cfg: PlanConfig
) -> tuple[NDArray[np.int64], int, int, np.random.Generator]:
    """The pool epoch ``epoch`` plans: bucket weight x sample weight per sample, realized by seeded
    stochastic rounding (``buckets.weighted_pool``), then fitted to whole steps for equal-count
    strategies (``cfg.policy``).

    Args:
        ids: (N,) bucket ids; sample_weights: (N,) per-sample weights, or None (all 1).

    Returns:
        (pool (M,) sorted sample indices, dropped, padded, the epoch's generator after its draws).
    """
    weights = buckets.resolve_weights(cfg.weights, int(ids.max()) + 1 if len(ids) else 1)
    per_sample = weights[ids] if sample_weights is None else weights[ids] * sample_weights
    expected = float(per_sample.sum()) if len(ids) else 0.0
    del per_sample
    if expected > cfg.max_plan_factor * len(ids):
        raise ValueError(
            f"the bucket and sample weights would plan ~{expected:.6g} entries from {len(ids)} samples per "
            f"epoch, more than --max-plan-factor {cfg.max_plan_factor:g} x the input; lower the weights or raise it"
        )
    memory = memory_bytes()
    if memory is not None and expected * PLAN_ENTRY_BYTES > memory:
        raise ValueError(
            f"epoch {epoch} would plan ~{expected:.3g} entries from {len(ids):,} samples, ~"
            f"{expected * PLAN_ENTRY_BYTES / 2**30:.3g} GiB at ~{PLAN_ENTRY_BYTES} bytes an entry, more than this "
            f"machine's {memory / 2**30:.3g} GiB: lower --bucket-weights/--sample-weights"
        )
    rng = seeds.rng(cfg.seed, epoch, "pool")
    pool = buckets.weighted_pool(ids, weights, rng, sample_weights)
    dropped = padded = 0
    if cfg.strategy not in ANY_POOL:
        pool, dropped, padded = buckets.fit_pool(pool, cfg.world_size * cfg.batch_size, cfg.policy, rng)
    return pool, dropped, padded, rng


def repeat_rates(first: EpochPlan, second: EpochPlan, strategy: str) -> dict[str, float]:
    """How often two samples sharing a step in epoch 0 share one again in epoch 1: the strategy's
    plans vs their ``random`` baselines (``EpochPlan.baseline``), from the epochs' own plans."""
    rates = {strategy: round(pair_repeat_rate(first.plan, second.plan), 6)}
    rates["random"] = round(pair_repeat_rate(first.baseline, second.baseline), 6)
    return rates
