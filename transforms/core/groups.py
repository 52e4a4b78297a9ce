"""Hierarchical planning: an epoch planned in G step groups, so no step needs the whole pool. Pure.

``plan_samples`` (``transforms.core.planner``) plans an epoch in one pool when G = 1 (today's plan, byte
for byte) and here when G > 1 (``PlanConfig.groups``: forced by ``--plan-groups`` or the auto rule)::

    group = spread(crc32(sample_id), seed, epoch, "groups") % G     # deal: a stable hash per sample
    for g in range(G):                                               # each group alone (a worker each)
        plan_g = the one-pool planner on group g's samples            # pool, weights, caps, strategy,
                                                                      # heaviest-first, rank speeds
    labels = interleave([steps_g], [peak_g], seed, epoch)             # only G numbers: the step order

Each group draws from its own seeds (``group_seed``), fits its own pool to whole steps (so up to
W*B-1 samples a group are dropped or padded) and puts its heaviest rank-step at its step 0; the
interleave is a seeded permutation of the groups' step labels, each group's steps kept in their order,
and under ``--heaviest-first`` the group holding the epoch's heaviest rank-step starts the epoch. The
epoch's balance entry combines the groups' sums (``metrics.balance_entry``), the same numbers
whichever process plans which group. ``lidarshard validate`` re-derives the plan through this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.pool import epoch_pool, plan_columns, plan_pool, to_samples
from lidarshard.transforms.plan import ANY_POOL, order, plan_epoch, seeds
from lidarshard.transforms.plan.metrics import BalanceSums, balance_entry, equal_count_pool, plan_sums

__all__ = [
    "GroupSummary",
    "GroupPlan",
    "step_labels",
    "epoch_stats",
    "interleaved",
    "keys_of",
    "deal",
    "group_table",
    "group_seed",
    "one_step",
    "too_few",
    "group_config",
    "interleave",
    "plan_group",
    "assemble",
    "plan_hierarchical",
    "pool_copies",
]


@dataclasses.dataclass(frozen=True)
class GroupSummary:
    """What the epoch needs of one planned group besides its rows (a few numbers: what a group's worker
    sends on): its steps, the heaviest rank-step of its step 0 by the ``--heaviest-first`` values (0.0
    when off), its balance sums and its pool accounting."""

    steps: int
    peak: float
    sums: BalanceSums
    planned: int
    dropped: int
    padded: int


@dataclasses.dataclass(frozen=True, eq=False)
class GroupPlan:
    """One group of one epoch planned alone.

    Attributes:
        plan: (S_g, W, M_g) int64 sample row indices (of the whole table), ``-1`` = empty slot; its
            heaviest rank-step at step 0 under ``--heaviest-first``.
        baseline: (S'_g, W, B) int64 sample row indices of the ``random`` reference on the group's pool.
        summary: its ``GroupSummary``.
    """

    plan: NDArray[np.int64]
    baseline: NDArray[np.int64]
    summary: GroupSummary


def keys_of(scored: Any) -> NDArray[np.uint64]:
    """(N,) ``seeds.sample_keys`` of a scored table's samples (its ``sample_id``)."""
    if "sample_id" not in scored.column_names:
        raise ValueError("a plan of several step groups deals samples by sample_id: the table has none")
    return seeds.sample_keys(scored.column("sample_id"))


def deal(keys: NDArray[np.uint64], seed: int, epoch: int, groups: int) -> NDArray[np.int32]:
    """(N,) the group in [0, groups) of each sample key (``seeds.sample_keys``) in epoch ``epoch``."""
    if groups == 1:
        return np.zeros(len(keys), np.int32)
    return (seeds.spread(keys, seed, epoch, "groups") % np.uint64(groups)).astype(np.int32)


def group_seed(seed: int, epoch: int, group: int) -> int:
    """The seed group ``group`` of epoch ``epoch`` plans with (every draw of its pool and strategy)."""
    return seeds.derive(seed, epoch, "group", group)


def group_config(cfg: PlanConfig, epoch: int, group: int) -> PlanConfig:
    """``cfg`` as group ``group`` of epoch ``epoch`` plans: its own seed, one group, no re-costing (the
    caller hands it the costs that plan the epoch, ``planner.as_planned``)."""
    return dataclasses.replace(cfg, seed=group_seed(cfg.seed, epoch, group), plan_groups=1, earlier=())


def interleave(
    steps: Sequence[int], peaks: Sequence[float] | None, seed: int, epoch: int
) -> NDArray[np.int32]:
    """The epoch's step sequence from its groups' step counts: (S,) the group of each step, S = sum(steps).

    A seeded permutation of the labels ``repeat(arange(G), steps)``; a group's k-th label is its step k.
    With ``peaks`` (G,) (``--heaviest-first``) the group with the highest peak (the lowest such group on
    ties) holds step 0: its first label is swapped with label 0.
    """
    labels = np.repeat(np.arange(len(steps), dtype=np.int32), np.asarray(steps, dtype=np.int64))
    labels = labels[seeds.rng(seed, epoch, "interleave").permutation(labels.size)]
    if peaks is not None and labels.size:
        first = int(np.argmax(np.asarray(peaks, dtype=np.float64)))
        at = int(np.argmax(labels == first))
        labels[[0, at]] = labels[[at, 0]]
    return labels


def group_table(scored: Any, rows: NDArray[np.int64], cfg: PlanConfig) -> pa.Table:
    """The plan columns (``pool.plan_columns``: the memory model's size features too) of ``scored`` (a
    table or ``as_planned`` view) at ``rows`` (n,): what ``plan_group`` plans a group from."""
    names = [c for c in plan_columns(cfg) if c in scored.column_names]
    return pa.table({c: np.asarray(scored.column(c).to_numpy())[rows] for c in names})


def plan_group(table: Any, rows: NDArray[np.int64], epoch: int, group: int, cfg: PlanConfig) -> GroupPlan:
    """Plan group ``group`` of epoch ``epoch`` alone.

    Args:
        table: the group's plan columns (``group_table``), one row per sample of the group, in
            sample order; costs as the epoch is planned (``planner.as_planned``).
        rows: (n,) the group's sample row indices in the whole table, ascending.
    """
    gcfg = group_config(cfg, epoch, group)
    w, b = cfg.world_size, cfg.batch_size
    try:
        plan, pool, costs, dropped, padded = plan_pool(table, epoch, gcfg)
    except ValueError as e:
        if table.num_rows >= one_step(cfg):
            raise
        raise too_few(epoch, group, table.num_rows, cfg) from e
    reference = plan_epoch("random", equal_count_pool(costs, w, b), w, b, seed=gcfg.seed, epoch=epoch)
    sums = plan_sums(plan, costs, b, reference, cfg.rank_speed, cfg.step_cost(epoch))
    peak = 0.0
    if cfg.heaviest_first != "off" and plan.shape[0]:
        values = costs if cfg.heaviest_first == "cost" else table.column("num_points").to_numpy()[pool]
        peak = float(order.step_peaks(plan[:1], values)[0])
    global_pool = rows[pool]
    summary = GroupSummary(int(plan.shape[0]), peak, sums, int(pool.size), dropped, padded)
    return GroupPlan(to_samples(plan, global_pool), to_samples(reference, global_pool), summary)


def one_step(cfg: PlanConfig) -> int:
    """The fewest samples a step group needs: one step, W*B (W for a strategy that plans any pool: ``budget``)."""
    return cfg.world_size * (1 if cfg.strategy in ANY_POOL else cfg.batch_size)


def too_few(epoch: int, group: int, held: int, cfg: PlanConfig) -> ValueError:
    """The one line refusing a plan whose step group ``group`` of epoch ``epoch`` holds ``held`` samples,
    fewer than ``one_step`` (the deal left it short: more groups than the samples allow)."""
    need = one_step(cfg)
    what = f"W = {need}" if cfg.strategy in ANY_POOL else f"W*B = {need}"
    forced = cfg.plan_groups is not None
    return ValueError(
        f"epoch {epoch}: step group {group} holds {held} sample{'' if held == 1 else 's'}, fewer than one step "
        f"of {what}: "
        + (f"lower --plan-groups ({cfg.plan_groups}), or leave it auto" if forced else "lower --plan-groups")
    )


def step_labels(summaries: Sequence[GroupSummary], epoch: int, cfg: PlanConfig) -> NDArray[np.int32]:
    """(S,) the group of each step of the epoch (``interleave`` of the groups' summaries, in group order)."""
    peaks = [p.peak for p in summaries] if cfg.heaviest_first != "off" else None
    return interleave([p.steps for p in summaries], peaks, cfg.seed, epoch)


def epoch_stats(summaries: Sequence[GroupSummary], epoch: int, cfg: PlanConfig) -> dict:
    """The epoch's stats (``EpochPlan.stats``) from its groups' summaries, in group order."""
    stats = balance_entry([p.sums for p in summaries], epoch)
    return stats | {k: int(sum(getattr(p, k) for p in summaries)) for k in ("planned", "dropped", "padded")}


def interleaved(
    plans: Sequence[NDArray[np.int64]], labels: NDArray[np.int32], world_size: int
) -> NDArray[np.int64]:
    """The epoch's (S, W, M) plan from its groups' plans (in group order) and ``step_labels``: group g's
    k-th step at its k-th label; M the widest group's (``-1`` pads the others)."""
    m = max((p.shape[2] for p in plans), default=0)
    plan = np.full((labels.size, world_size, m), -1, dtype=np.int64)
    for g, part in enumerate(plans):
        plan[labels == g, :, : part.shape[2]] = part
    return plan


def assemble(
    parts: Sequence[GroupPlan], epoch: int, cfg: PlanConfig
) -> tuple[NDArray[np.int64], NDArray[np.int64], dict]:
    """The epoch from its groups (in group order): (plan (S, W, M) sample rows in the interleaved step
    order, baseline (S', W, B) the groups' references one after another, the epoch's stats)."""
    summaries = [p.summary for p in parts]
    plan = interleaved([p.plan for p in parts], step_labels(summaries, epoch, cfg), cfg.world_size)
    baseline = np.concatenate([p.baseline for p in parts], axis=0)
    return plan, baseline, epoch_stats(summaries, epoch, cfg)


def plan_hierarchical(
    scored: Any, keys: NDArray[np.uint64], epoch: int, cfg: PlanConfig, groups: int
) -> tuple:
    """Epoch ``epoch`` of ``scored`` (as planned) in ``groups`` step groups, in this process: ``assemble``
    of every ``plan_group``. ``keys``: (N,) ``seeds.sample_keys`` of the samples."""
    dealt = deal(keys, cfg.seed, epoch, groups)
    order_ = np.argsort(dealt, kind="stable")
    cuts = np.searchsorted(dealt[order_], np.arange(groups + 1))
    parts = []
    for g in range(groups):
        rows = order_[cuts[g] : cuts[g + 1]].astype(np.int64)
        parts.append(plan_group(group_table(scored, rows, cfg), rows, epoch, g, cfg))
    return assemble(parts, epoch, cfg)


def pool_copies(
    ids: NDArray[np.int32],
    sample_weights: NDArray[np.float64] | None,
    keys: NDArray[np.uint64] | None,
    epoch: int,
    cfg: PlanConfig,
) -> NDArray[np.float64]:
    """(N,) the copies of each sample epoch ``epoch``'s pools hold (the manifest's ``repeat.realized``):
    one pool (``pool.epoch_pool``), or with G > 1 groups each group's (``keys``: ``seeds.sample_keys``)."""
    n = len(ids)
    groups = cfg.groups(n)
    if groups == 1:
        return np.bincount(epoch_pool(ids, sample_weights, epoch, cfg)[0], minlength=n).astype(np.float64)
    if keys is None:
        raise ValueError(f"a plan of {groups} step groups deals samples by sample_id: none was given")
    dealt = deal(keys, cfg.seed, epoch, groups)
    out = np.zeros(n, np.float64)
    for g in range(groups):
        rows = np.flatnonzero(dealt == g)
        weights = None if sample_weights is None else sample_weights[rows]
        pool = epoch_pool(ids[rows], weights, epoch, group_config(cfg, epoch, g))[0]
        out += np.bincount(rows[pool], minlength=n)
    return out
