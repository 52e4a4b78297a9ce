"""The rows of a plan of step groups on the engine: no task holds more than one group or one shard. Pure.

The build's group path (``transforms.beam.group_transform``) wires these::

    deal_shard(rows [start, stop) of the samples, epoch)  -> {group: its members there}   one task a shard
    group_members(members of one group, any order)         -> (rows, table)                one task a group
    plan_group(...) (``transforms.core.groups``)            -> GroupPlan
    group_entries(plan, ...)                                -> its plan rows per shard, steps encoded
    merge_entries(one shard's rows of every group)          -> ``plan_writer.rank_pieces`` input
    global_steps(encoded steps, the groups' step counts)    -> the epoch's steps, in the rank writer

A group cannot know the epoch's step numbers (they depend on every group's count), so its rows carry
``local_step * G + group`` until the rank writer, which gets the G (steps, peak) pairs, maps them with
``groups.interleave``: the same plan ``groups.plan_hierarchical`` makes in one process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.transforms.core import plan_writer
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.groups import GroupPlan, deal, interleave, too_few
from lidarshard.transforms.core.planner import as_planned
from lidarshard.transforms.core.pool import plan_columns
from lidarshard.transforms.plan import seeds

__all__ = [
    "deal_shard",
    "group_members",
    "group_entries",
    "merge_entries",
    "global_steps",
    "PAIR_BUCKETS",
    "pair_entries",
    "pair_buckets",
]

#: One group's members in one shard: (first sample row of the shard, (n,) their rows, {column: (n,)}).
Members = tuple[int, NDArray[np.int64], dict[str, NDArray]]


def deal_shard(chunk: pa.Table, start: int, epoch: int, cfg: PlanConfig, groups: int) -> dict[int, Members]:
    """Samples [start, start + chunk.num_rows) dealt into the epoch's groups: {group: its members}.

    ``chunk`` holds ``sample_id`` and the plan columns (``pool.plan_columns``: with the size features for
    an epoch planned before a re-plan, whose costs ``as_planned`` recomputes here, or a memory model).
    """
    planned = as_planned(chunk, epoch, cfg)
    dealt = deal(seeds.sample_keys(chunk.column("sample_id")), cfg.seed, epoch, groups)
    names = [c for c in plan_columns(cfg) if c in chunk.column_names]
    columns = {c: np.asarray(planned.column(c).to_numpy()) for c in names}
    out: dict[int, Members] = {}
    for g in np.unique(dealt).tolist():
        at = np.flatnonzero(dealt == g)
        out[int(g)] = (start, at.astype(np.int64) + start, {c: v[at] for c, v in columns.items()})
    return out


def group_members(members: Iterable[Members]) -> tuple[NDArray[np.int64], pa.Table]:
    """One group's members from every shard (any order) -> ((n,) its rows ascending, its plan table)."""
    parts = sorted(members, key=lambda m: m[0])
    rows = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int64)
    names = list(parts[0][2]) if parts else ["cost", "bucket_id"]
    table = pa.table({c: np.concatenate([p[2][c] for p in parts]) if parts else np.empty(0) for c in names})
    return rows, table


def group_entries(
    planned: GroupPlan, rows: NDArray[np.int64], table: pa.Table, group: int, groups: int, costs: bool
) -> list[tuple[int, dict[str, NDArray]]]:
    """One group's plan rows (``plan_writer.assignment``), steps encoded ``local * G + group``, cut into the
    shards of the samples (``plan_writer.shard_bounds``): [(shard start, entries)]. ``costs``: the rows
    carry the group's ``cost`` and ``bucket_id`` (an epoch planned with an earlier cost model)."""
    part = plan_writer.assignment(planned.plan)
    part["step"] = (part["step"].astype(np.int64) * groups + group).astype(np.int32)
    if costs:
        at = np.searchsorted(rows, part["row"])
        part |= {c: table.column(c).to_numpy()[at] for c in ("cost", "bucket_id")}
    shard = part["row"] // plan_writer.ROWS_PER_SHARD
    cuts = np.flatnonzero(np.diff(shard)) + 1
    starts, stops = np.r_[0, cuts], np.r_[cuts, shard.size]
    return [
        (int(shard[a]) * plan_writer.ROWS_PER_SHARD, {k: v[a:b] for k, v in part.items()})
        for a, b in zip(starts, stops, strict=True)
        if b > a
    ]


def merge_entries(pieces: Sequence[tuple[int, dict[str, NDArray]]]) -> dict[str, NDArray]:
    """One shard's entries of every group ([(group, entries)], any order) as one ``assignment`` slice,
    sorted by sample row (a sample is in one group of an epoch)."""
    pieces = sorted(pieces, key=lambda p: p[0])
    keys = list(pieces[0][1])
    joined = {k: np.concatenate([p[1][k] for p in pieces]) for k in keys}
    order = np.argsort(joined["row"], kind="stable")
    return {k: v[order] for k, v in joined.items()}


def global_steps(
    encoded: NDArray[np.integer], counts: Sequence[tuple[int, int, float, int]], epoch: int, cfg: PlanConfig
) -> NDArray[np.int32]:
    """The epoch's step of each encoded step ``local * G + group``; ``counts``: (group, steps, peak, G) of
    every group that planned (any order), from which ``groups.interleave`` orders the epoch's steps.

    Raises:
        ValueError: a group of the G never planned (the deal gave it no sample): ``groups.too_few``.
    """
    counts = sorted(counts)
    g = counts[0][3] if counts else 0
    missing = sorted(set(range(g)) - {c[0] for c in counts})
    if missing:  # more groups than the samples allow
        raise too_few(epoch, missing[0], 0, cfg)
    peaks = [c[2] for c in counts] if cfg.heaviest_first != "off" else None
    labels = interleave([c[1] for c in counts], peaks, cfg.seed, epoch)
    positions = np.argsort(labels, kind="stable")  # group g's steps, in order, one group after another
    first = np.r_[0, np.cumsum([c[1] for c in counts])]
    enc = np.asarray(encoded, dtype=np.int64)
    return positions[first[enc % g] + enc // g].astype(np.int32)


#: Buckets of epoch-0 step ids the pair-repeat counts meet in (``pair_buckets``): tasks of ~N/64 entries.
PAIR_BUCKETS = 64


def pair_entries(plan: NDArray[np.int64], group: int, groups: int) -> list[tuple[int, NDArray, NDArray]]:
    """One group's plan (S_g, W, M) sample rows as (shard start, rows, step ids ``local * G + group``) per
    shard of the samples: what the pair repeat rate needs of an epoch (which samples share a step)."""
    steps = np.broadcast_to(np.arange(plan.shape[0], dtype=np.int64)[:, None, None], plan.shape)
    valid = plan >= 0
    rows, ids = plan[valid], steps[valid] * groups + group
    order = np.argsort(rows, kind="stable")
    rows, ids = rows[order], ids[order]
    shard = rows // plan_writer.ROWS_PER_SHARD
    cuts = np.flatnonzero(np.diff(shard)) + 1
    return [
        (int(shard[a]) * plan_writer.ROWS_PER_SHARD, rows[a:b], ids[a:b])
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, rows.size], strict=True)
        if b > a
    ]


def pair_buckets(
    first: Sequence[tuple[NDArray, NDArray]], second: Sequence[tuple[NDArray, NDArray]]
) -> dict[int, NDArray[np.int64]]:
    """One shard's (rows, step ids) of epoch 0 (``first``) and epoch 1 (``second``), from every group ->
    {bucket: (n, 2) [epoch-0 step, epoch-1 step of the same sample or -1]}, bucketed by the epoch-0 step.
    A sample's epoch-1 step is its last one (``metrics.pair_repeat_rate``: a sample is in one group of an
    epoch, so its latest step there is its largest step id). A bucket's rows from every shard are what
    ``metrics.mate_counts`` counts."""
    a_rows = np.concatenate([r for r, _ in first]) if first else np.empty(0, np.int64)
    a_steps = np.concatenate([s for _, s in first]) if first else np.empty(0, np.int64)
    b_rows = np.concatenate([r for r, _ in second]) if second else np.empty(0, np.int64)
    b_steps = np.concatenate([s for _, s in second]) if second else np.empty(0, np.int64)
    if b_rows.size:
        order = np.lexsort((b_steps, b_rows))  # by row, then step: the last of a row is its largest step
        rows, steps = b_rows[order], b_steps[order]
        ends = np.r_[np.flatnonzero(np.diff(rows)), rows.size - 1]
        found = np.searchsorted(rows[ends], a_rows)
        found = np.minimum(found, ends.size - 1)
        hit = rows[ends][found] == a_rows
        partner = np.where(hit, steps[ends][found], -1)
    else:
        partner = np.full(a_rows.size, -1, np.int64)
    both = np.stack([a_steps, partner], axis=1).astype(np.int64)
    bucket = a_steps % PAIR_BUCKETS
    return {int(k): both[bucket == k] for k in np.unique(bucket).tolist()}
