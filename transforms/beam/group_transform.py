"""The build's plan of step groups (``transforms.core.groups``) on the engine: no task holds an epoch.

``BuildManifest`` routes each epoch here when it has G > 1 step groups. Steps (each a thin wrapper of a
pure function of ``transforms.core.group_rows``)::

    DealShards    deal_shard       one task a shard of the samples: its rows dealt into every epoch's groups
    ByGroup       GroupByKey       key (epoch, group, G): the shard starts holding the group's members
    PlanGroups    plan_group       one group planned alone (its members sorted by row first)
    ByShard       GroupByKey       key (epoch, shard start): the groups with plan rows in that shard
    MergeShards   merge_entries    -> the build's WritePieces; each group's (steps, peak) -> each rank writer
    PairShards    pair_buckets     epochs 0 and 1 of each shard's samples: which steps they share
    PairBuckets   pair_counts      the pair repeat rate's two sums, per bucket of epoch-0 steps

No element holds more than one group or one shard of samples, and no shuffle carries the rows: a
group's members and its plan rows are parked in the build's scratch directory, one file per (epoch,
group, shard) (``transforms.io.scratch``), and the shuffles carry their names (a local runner holds
what passes through a shuffle in one process). The epoch's step order needs only the G (steps, peak)
pairs. Results do not depend on the order elements arrive in: every gathered list is sorted (by group,
by shard start) before use.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

from lidarshard.transforms.beam.scan_transform import NAMESPACE
from lidarshard.transforms.beam.tagged import SplitTags
from lidarshard.transforms.core import group_rows
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.epochs import plan_columns
from lidarshard.transforms.core.groups import plan_group
from lidarshard.transforms.io.arrow import read_rows, release_memory
from lidarshard.transforms.io.parts import open_parts
from lidarshard.transforms.io.scratch import (
    entries_path,
    group_entries_path,
    members_path,
    read_columns,
    write_columns,
)

__all__ = ["PlanGroups"]


def _deal(task: tuple, cfg: PlanConfig, work: str) -> Iterator[tuple[str, object]]:
    """Shard ``task`` = (start, stop, (parts holding it, their first row), G) dealt into every epoch's
    groups, each group's members written to a scratch file: ``("member", ((epoch, group, G), start))``
    and ``("hold", ((epoch, start), ("hold", stop, holding)))`` (so the shard's writer knows where its
    rows are)."""
    start, stop, holding, groups = task
    parts, first = holding
    columns = ["sample_id", *plan_columns(cfg)]  # every epoch's, dealt from one read
    with open_parts(parts) as file:
        chunk = read_rows(file, start - first, stop - first, columns)
    for epoch in range(cfg.epochs):
        for g, (_, rows, values) in group_rows.deal_shard(chunk, start, epoch, cfg, groups).items():
            write_columns(members_path(work, epoch, g, start), {"row": rows, **values})
            yield "member", ((epoch, g, groups), start)
        yield "hold", ((epoch, start), ("hold", stop, holding))
    release_memory()


def _members(work: str, epoch: int, group: int, starts: Iterable[int]) -> Iterator[group_rows.Members]:
    """The members of ``group`` that ``_deal`` wrote for the shards at ``starts``."""
    for start in starts:
        columns = read_columns(members_path(work, epoch, group, start))
        yield start, columns.pop("row"), columns


def _plan(
    grouped: tuple[tuple[int, int, int], Iterable], cfg: PlanConfig, pairs: tuple[int, ...], work: str
) -> Iterator[tuple[str, object]]:
    """One group planned alone (its members read from the shards' scratch files), its plan rows written
    to one scratch file per shard it has rows in: ``("entries", ((epoch, shard start), ("entries",
    group)))`` per such shard, ``("rank", ((epoch, rank), ("count", group, steps, peak, G)))`` per rank,
    ``("summary", (epoch, group, GroupSummary))`` and, for the pair-repeat epochs, ``("pair", (shard
    start, (kind, 0 | 1, group, rows, step ids)))`` of its plan (``"plan"``) and random reference."""
    (epoch, g, groups), starts = grouped
    rows, table = group_rows.group_members(_members(work, epoch, g, sorted(set(starts))))
    planned = plan_group(table, rows, epoch, g, cfg)
    Metrics.counter(NAMESPACE, "planned").inc(planned.summary.planned)
    costs = cfg.planned_with(epoch) is not None
    for start, entries in group_rows.group_entries(planned, rows, table, g, groups, costs):
        write_columns(group_entries_path(work, epoch, start, g), entries)
        yield "entries", ((epoch, start), ("entries", g))
    s = planned.summary
    for rank in range(cfg.world_size):
        yield "rank", ((epoch, rank), ("count", g, s.steps, s.peak, groups))
    yield "summary", (epoch, g, s)
    if cfg.epochs > 1 and epoch in pairs:
        for kind, plan in (("plan", planned.plan), ("random", planned.baseline)):
            for start, rows_, steps in group_rows.pair_entries(plan, g, groups):
                yield "pair", (start, (kind, pairs.index(epoch), g, rows_, steps))
    del planned, rows, table
    release_memory()


def _pair_shard(grouped: tuple[int, Iterable]) -> Iterator[tuple[tuple[str, int], object]]:
    """One shard's (kind, which epoch, group, rows, step ids) of both pair epochs -> ((kind, bucket), piece)."""
    _, values = grouped
    values = sorted(values, key=lambda v: v[:3])
    for kind in ("plan", "random"):
        first = [(v[3], v[4]) for v in values if v[0] == kind and v[1] == 0]
        second = [(v[3], v[4]) for v in values if v[0] == kind and v[1] == 1]
        for bucket, piece in group_rows.pair_buckets(first, second).items():
            yield (kind, bucket), piece


def _pair_bucket(grouped: tuple[tuple[str, int], Iterable]) -> tuple[str, int, int]:
    """One bucket's pieces -> (kind, pairs sharing an epoch-0 step, those sharing an epoch-1 step too)."""
    (kind, _), pieces = grouped
    return (kind, *group_rows.pair_counts(list(pieces)))


def _merge(grouped: tuple[tuple[int, int], Iterable], work: str) -> Iterator[tuple]:
    """One shard's rows of every group (their scratch files) merged into one scratch file ->
    ``(epoch, start, stop, its path, holding)`` (WritePieces' task), none when no group planned a row
    of it."""
    (epoch, start), values = grouped
    values = list(values)
    hold = [v for v in values if v[0] == "hold"]
    planned = sorted({v[1] for v in values if v[0] == "entries"})
    if len(hold) != 1:
        raise RuntimeError(f"epoch {epoch}: shard {start} was dealt {len(hold)} times, not once")
    if planned:
        _, stop, holding = hold[0]
        entries = [(g, read_columns(group_entries_path(work, epoch, start, g))) for g in planned]
        path = write_columns(entries_path(work, epoch, start), group_rows.merge_entries(entries))
        yield epoch, start, stop, path, holding


class PlanGroups(beam.PTransform):
    """PCollection of shard tasks (start, stop, holding, G) -> ``{"shard", "rank", "summary", "pair"}``:
    WritePieces' tasks, the rank writers' step counts, the groups' summaries and the pair repeat rate's
    sums ``(kind, pairs, shared)`` per bucket."""

    def __init__(self, cfg: PlanConfig, pairs: tuple[int, ...], work: str) -> None:
        super().__init__()
        self._cfg, self._pairs, self._work = cfg, pairs, work

    def expand(self, tasks: beam.PCollection) -> dict[str, beam.PCollection]:
        cfg, pairs, work = self._cfg, self._pairs, self._work
        dealt = (
            tasks
            | "SpreadDeal" >> beam.Reshuffle()
            | "DealShards" >> beam.FlatMap(_deal, cfg, work)
            | "SplitDealt" >> SplitTags("member", "hold")
        )
        planned = (
            dealt["member"]
            | "ByGroup" >> beam.GroupByKey()
            | "PlanGroups" >> beam.FlatMap(_plan, cfg, pairs, work)
            | "SplitGroups" >> SplitTags("entries", "rank", "summary", "pair")
        )
        shards = (
            (dealt["hold"], planned["entries"])
            | "ShardRows" >> beam.Flatten()
            | "ByShard" >> beam.GroupByKey()
            | "MergeShards" >> beam.FlatMap(_merge, work)
        )
        counted = (
            planned["pair"]
            | "PairsByShard" >> beam.GroupByKey()
            | "PairShards" >> beam.FlatMap(_pair_shard)
            | "PairsByBucket" >> beam.GroupByKey()
            | "PairBuckets" >> beam.Map(_pair_bucket)
        )
        return {"shard": shards, "rank": planned["rank"], "summary": planned["summary"], "pair": counted}
