"""One epoch's plan in sample space (``plan_samples``) under a ``PlanConfig`` (``transforms.core.config``). Pure.

The build plans each epoch once, from the numeric columns of the scored samples (``cost``,
``bucket_id``, ``num_points``, ``weight``): ``plan_samples`` gives the strategy's plan (its heaviest
rank-step moved to step 0 under ``heaviest_first``, ``lidarshard.transforms.plan.order``), the ``random``
baseline on the same pool (the reference of ``random_linearity``) and the epoch's stats, planning one
pool (``transforms.core.pool``) or G step groups (``transforms.core.groups``); the pair repeat rates of
epochs 0 and 1 come from those same plans (``epoch_repeat_rates``). ``lidarshard validate`` re-derives
them independently with the same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.core import groups
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.pool import plan_pool, to_samples
from lidarshard.transforms.features import buckets
from lidarshard.transforms.features.cost import CostModel, sample_costs
from lidarshard.transforms.plan import plan_epoch
from lidarshard.transforms.plan.metrics import balance_summary, equal_count_pool, plan_mates, repeat_rates

__all__ = [
    "EpochPlan",
    "as_planned",
    "bucket_costs",
    "plan_samples",
    "epoch_repeat_rates",
    "bucket_edges",
    "streamed_bucket_edges",
    "bucket_record",
]


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
    count = cfg.groups(scored.num_rows)
    if count > 1:
        keys = groups.keys_of(scored)
        plan_, reference_, stats_ = groups.plan_hierarchical(
            as_planned(scored, epoch, cfg), keys, epoch, cfg, count
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


def epoch_repeat_rates(first: EpochPlan, second: EpochPlan, strategy: str) -> dict[str, float]:
    """How often two samples sharing a step in epoch 0 share one again in epoch 1: the strategy's
    plans vs their ``random`` baselines (``EpochPlan.baseline``), from the epochs' own plans."""
    counts = {
        "plan": plan_mates(first.plan, second.plan),
        "random": plan_mates(first.baseline, second.baseline),
    }
    return repeat_rates(counts, strategy)
