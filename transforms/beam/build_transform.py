"""The build core as one Beam transform: a ``Source`` of samples -> a complete manifest directory.

``BuildManifest`` is the only way lidarshard builds a manifest: ``lidarshard build`` from INPUT (the
scan's parts), ``build --from-samples`` (an earlier run's samples), ``lidarshard.build()`` and
``lidarshard.write_manifest()`` (a user's table written as one part) all apply it to their source; the
launcher then validates and publishes the staging directory (``lidarshard.pipelines.publish``).

Steps (each a thin wrapper of a pure function)::

    Prepare        score.prepare              sort a source that is not sorted by sample_id
    SettleAndScore score.settle_and_score     rejects, counts, cost, buckets, weights; one task a part
    WriteSamples   previous.write_part        the new samples parts, in parallel
    SamplesWritten                            every part written once, together the accepted samples
    PlanEpoch      planner.plan_samples        each epoch planned once, from the numeric columns
    PlanInGroups   group_transform            or, with G > 1 step groups, each (epoch, group) alone
    WritePieces    sharded.rank_pieces        each rank's rows of a range of samples (scratch files)
    WriteRanks     rank_stream.stream_rank    each (epoch, rank) plan file, a row group at a time
    WriteManifest  manifest.build_manifest    ``_manifest.json``; the scratch directory goes

No step holds the samples' paths. What a step needs from several others arrives as its main input
(``GatherTagged``), never as a side input, so every runner computes each step once. Plan rows never
pass through a shuffle: a shard task names the scratch file of its entries (``transforms.io.scratch``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from lidarshard import schemas
from lidarshard.transforms.beam.group_transform import PlanGroups
from lidarshard.transforms.beam.scan_transform import NAMESPACE
from lidarshard.transforms.beam.tagged import GatherTagged, SplitTags, tag
from lidarshard.transforms.core import group_rows, groups, previous
from lidarshard.transforms.core import manifest_writer as manifest
from lidarshard.transforms.core import plan_writer as sharded
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import EpochPlan, as_planned, epoch_repeat_rates, plan_samples
from lidarshard.transforms.core.pool import plan_columns
from lidarshard.transforms.core.rank_stream import stream_rank
from lidarshard.transforms.core.score import ScoreSettings, Source, prepare, settle_and_score
from lidarshard.transforms.features.cost import CostModel
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import (
    ParquetStream,
    parquet_bytes,
    parquet_file,
    read_rows,
    release_memory,
)
from lidarshard.transforms.io.parts import listed_parts, open_parts, parts_holding, read_parts
from lidarshard.transforms.io.scratch import entries_path, read_columns, scores_path, write_columns
from lidarshard.transforms.plan.metrics import repeat_rates

__all__ = ["BuildJob", "BuildManifest", "writer", "PLANNED_PAIRS"]

#: The epochs whose plans give the pair repeat rates (``planner.epoch_repeat_rates``).
PLANNED_PAIRS = (0, 1)


@dataclass(frozen=True)
class BuildJob:
    """What the build core needs, checked before Beam starts: where it writes (``staging``, whose
    ``_work`` scratch directory it removes), the provenance it records (``meta``), the plan, the cost
    model and how it settles."""

    staging: str
    meta: dict
    cfg: PlanConfig
    model: CostModel
    settle: ScoreSettings
    kept: manifest.Kept | None = None  # a re-plan: what it keeps of the manifest it continues

    @property
    def work(self) -> str:
        return storage.join(self.staging, schemas.WORK_DIR)


def writer(staging: str) -> manifest.Write:
    """``write(rel, data)``: a file into the staging directory, counted in the run's metrics."""

    def write(rel: str, data: bytes) -> None:
        storage.write_bytes(storage.join(staging, rel), data)
        Metrics.counter(NAMESPACE, "files_written").inc()
        Metrics.counter(NAMESPACE, "bytes_written").inc(len(data))

    return write


def _settle_and_score(source: Source, job: BuildJob) -> Iterator[tuple[str, object]]:
    """``("scored", metadata)`` (with the number of parts) and one ``("part", PartTask)`` per part, its
    arrays parked in the scratch directory by ``settle_and_score`` (the shuffle carries no row's scores)."""
    meta, tasks = settle_and_score(source, job.model, job.cfg, job.settle, writer(job.staging), job.work)
    release_memory()
    yield "scored", meta | {"parts": len(tasks)}
    yield from (("part", task) for task in tasks)


def _streamed(rel: str, out: ParquetStream) -> dict:
    """The ``files`` entry of ``rel``, written through the closed ``out``, counted in the run's metrics."""
    Metrics.counter(NAMESPACE, "files_written").inc()
    Metrics.counter(NAMESPACE, "bytes_written").inc(out.bytes)
    release_memory()
    return {"path": rel, "bytes": out.bytes, "sha256": out.sha256}


def _write_part(task: previous.PartTask, job: BuildJob) -> tuple[int, int, dict]:
    """Write samples part ``task.part`` (parked: ``previous.unpark``) into the staging directory: ``(k,
    rows, files entry)``."""
    task = previous.unpark(task, scores_path(job.work, task.part))
    rel, staging = schemas.samples_part(task.part), job.staging
    with storage.open_read(task.path) as f, storage.open_write(storage.join(staging, rel)) as sink:
        out = previous.write_part(parquet_file(f), task, sink)
    return task.part, int(task.keep.sum()), _streamed(rel, out)


def _samples_written(gathered: dict[str, list]) -> dict:
    """``{"scored": [metadata], "written": [_write_part's results]}`` -> the metadata with every part in
    its ``files`` and their rows (``part_rows``), after checking that each part was written once and
    that together they hold the accepted samples."""
    (meta,) = gathered["scored"]
    written = sorted(gathered.get("written", []), key=lambda w: w[0])
    want = meta.pop("parts")
    if [k for k, _, _ in written] != list(range(want)):
        raise RuntimeError(f"{len(written)} samples parts were written, not the {want} planned")
    rows = sum(n for _, n, _ in written)
    if rows != meta["counts"]["accepted"]:
        raise RuntimeError(
            f"the samples parts hold {rows} samples, not the {meta['counts']['accepted']} accepted"
        )
    meta["files"] = [*(entry for _, _, entry in written), *meta["files"]]
    meta["part_rows"] = [n for _, n, _ in written]  # where each part's rows start, for the plan tasks
    return meta


def _parts(scored: dict, staging: str) -> list[str]:
    """The samples parts the metadata's ``files`` lists, in order, as paths in the staging directory."""
    return [storage.join(staging, rel) for rel in listed_parts(f["path"] for f in scored["files"])]


def _epoch_tasks(scored: dict, job: BuildJob) -> Iterator[tuple[str, object]]:
    """The plan's tasks: ``("epoch", (epoch, scored))`` per epoch of one pool, or with G > 1 step groups
    (``PlanConfig.groups``) ``("deal", (start, stop, holding, G))`` per shard of the samples
    (``group_transform.PlanGroups``: no task plans an epoch)."""
    n = scored["counts"]["accepted"]
    groups = job.cfg.groups(n)
    if groups == 1:
        for epoch in range(job.cfg.epochs):
            yield "epoch", (epoch, scored)
        return
    parts = _parts(scored, job.staging)
    for start, stop in sharded.shard_bounds(n, sharded.ROWS_PER_SHARD):
        yield "deal", (start, stop, parts_holding(parts, scored["part_rows"], start, stop), groups)


def _plan_epoch(task: tuple[int, dict], job: BuildJob) -> Iterator[tuple[str, object]]:
    """Plan epoch ``task[0]`` once from the numeric columns of the written samples (``task[1]``: their
    metadata): ``("stats", stats)``, ``("pair", (epoch, plan, baseline))`` for ``PLANNED_PAIRS``, one
    ``("shard", (epoch, start, stop, entries' scratch file, (parts holding it, their first row)))`` per
    range of samples holding planned entries and one ``("rank", ((epoch, rank), -1))`` per rank (so every rank's
    file is written)."""
    epoch, scored = task
    parts = _parts(scored, job.staging)
    earlier = job.cfg.planned_with(epoch) is not None
    numeric = as_planned(read_parts(parts, columns=plan_columns(job.cfg, epoch)), epoch, job.cfg)
    planned = plan_samples(numeric, epoch, job.cfg)
    Metrics.counter(NAMESPACE, "planned").inc(planned.stats["planned"])
    yield "stats", planned.stats
    if job.cfg.epochs > 1 and epoch in PLANNED_PAIRS:
        yield "pair", (epoch, planned.plan, planned.baseline)
    part = sharded.assignment(planned.plan)
    del planned
    if earlier:  # the plan rows carry the costs that planned them
        part |= {c: numeric.column(c).to_numpy()[part["row"]] for c in ("cost", "bucket_id")}
    for start, stop in sharded.shard_bounds(numeric.num_rows):
        entries = sharded.slice_rows(part, start, stop)
        if entries["row"].size:
            holding = parts_holding(parts, scored["part_rows"], start, stop)
            path = write_columns(entries_path(job.work, epoch, start), entries)
            yield "shard", (epoch, start, stop, path, holding)
    del part, numeric
    release_memory()
    for rank in range(job.cfg.world_size):
        yield "rank", ((epoch, rank), -1)


def _piece_path(work: str, epoch: int, rank: int, start: int) -> str:
    e, r = schemas.PLAN_DIR_NAMES
    return storage.join(work, f"{e}{epoch}", f"{r}{rank}", f"{start:012d}.parquet")


def _write_pieces(shard: tuple, work: str) -> Iterator[tuple[tuple[int, int], int]]:
    """Rows [start, stop) of the samples -> each rank's plan rows from them, in a scratch file:
    ``((epoch, rank), start)`` per file written."""
    epoch, start, stop, path, (parts, first) = shard
    entries = read_columns(path)
    with open_parts(parts) as file:
        rows = read_rows(file, start - first, stop - first, sharded.COPIED)
    for rank, piece in sharded.rank_pieces(rows, start, entries).items():
        storage.write_bytes(_piece_path(work, epoch, rank, start), parquet_bytes(piece))
        yield (epoch, rank), start
    release_memory()


def _global_steps(piece: pa.Table, counts: list, epoch: int, cfg: PlanConfig) -> pa.Table:
    """``piece`` with its encoded steps (``group_rows.group_entries``) as the epoch's steps."""
    steps = group_rows.global_steps(piece.column("step").to_numpy(), counts, epoch, cfg)
    return piece.set_column(piece.schema.get_field_index("step"), piece.schema.field("step"), pa.array(steps))


def _write_rank(grouped: tuple[tuple[int, int], list], job: BuildJob) -> dict:
    """Rank ``rank``'s plan file of epoch ``epoch`` from its pieces (``grouped``: ((epoch, rank), piece
    starts, and with step groups each group's ``("count", group, steps, peak, G)``), streamed a row group
    at a time through a local spill (``rank_stream.stream_rank``: never all its rows at once); its
    ``files`` entry."""
    (epoch, rank), values = grouped
    values = list(values)
    starts = sorted({v for v in values if isinstance(v, int)} - {-1})
    counts = [tuple(v[1:]) for v in values if isinstance(v, tuple)]  # ("count", group, steps, peak, G)

    def read(i: int, columns: Sequence[str] | None) -> pa.Table:
        piece = storage.read_parquet(_piece_path(job.work, epoch, rank, starts[i]), columns)
        # a plan of step groups: its pieces' steps are local * G + group
        return _global_steps(piece, counts, epoch, job.cfg) if counts else piece

    spill = storage.local_path(storage.join(job.work, "ranks")) if storage.is_local(job.work) else None
    rel = schemas.plan_file(epoch, rank)
    with storage.open_write(storage.join(job.staging, rel)) as sink:
        with ParquetStream(sink, schemas.plan_schema()) as out:
            for batch in stream_rank(read, len(starts), epoch, rank, spill):
                out.write(batch)
    return _streamed(rel, out)


def _write_manifest(gathered: dict[str, list], job: BuildJob) -> dict:
    """``{"samples": [metadata], "files": [...], "stats": [...], "pair": [...]}`` -> ``_manifest.json``
    (returned as written); then the scratch directory goes."""
    (scored,) = gathered["samples"]
    pairs = sorted(gathered.get("pair", []), key=lambda p: p[0])
    stats = gathered.get("stats", [])
    rates = None
    if gathered.get("summary"):  # a plan of step groups: its epochs from their groups (groups.assemble)
        stats = _grouped(gathered["summary"], job.cfg)
        rates = _pair_rates(gathered.get("gpair", []), job.cfg) if job.cfg.epochs > 1 else None
    elif len(pairs) == len(PLANNED_PAIRS):
        first, second = (EpochPlan(plan, baseline, {}) for _, plan, baseline in pairs)
        rates = epoch_repeat_rates(first, second, job.cfg.strategy)
    meta = job.meta | {"part_rows": job.settle.part_rows}
    files = [*scored["files"], *gathered.get("files", [])]
    built = manifest.build_manifest(meta, job.cfg, scored, files, stats, rates)
    problem = job.kept.problem(built) if job.kept is not None else None
    if problem:
        raise ValueError(problem)
    written = built.to_json()
    storage.write_json(storage.join(job.staging, schemas.MANIFEST_FILE), written)
    storage.remove_tree(job.work)
    return written


def _grouped(summaries: list, cfg: PlanConfig) -> list[dict]:
    """Each epoch's stats from its groups' summaries ``(epoch, group, GroupSummary)``, any order."""
    by_epoch: dict[int, list] = {}
    for epoch, g, summary in sorted(summaries, key=lambda s: s[:2]):
        if g != len(by_epoch.setdefault(epoch, [])):
            raise RuntimeError(
                f"epoch {epoch}: step group {g} was planned out of turn (twice, or one is missing)"
            )
        by_epoch[epoch].append(summary)
    return [groups.epoch_stats(found, epoch, cfg) for epoch, found in sorted(by_epoch.items())]


def _pair_rates(counted: list[tuple[str, int, int]], cfg: PlanConfig) -> dict[str, float]:
    """``metrics.repeat_rates`` from the buckets' ``(kind, pairs, shared)`` counts (``group_transform``)."""
    kinds = ("plan", "random")
    counts = {kind: (sum(p for k, p, _ in counted if k == kind), sum(s for k, _, s in counted if k == kind))
              for kind in kinds}  # fmt: skip
    return repeat_rates(counts, cfg.strategy)


class BuildManifest(beam.PTransform):
    """PCollection of one ``Source`` -> the manifest written into ``job.staging`` (all but ``_SUCCESS``,
    which the publisher writes after validating it); the output holds the ``_manifest.json`` object."""

    def __init__(self, job: BuildJob) -> None:
        super().__init__()
        self._job = job

    def expand(self, sources: beam.PCollection) -> beam.PCollection:
        job = self._job
        scored = (
            sources
            | "Prepare" >> beam.Map(prepare, job.work)
            | "SettleAndScore" >> beam.FlatMap(_settle_and_score, job)
            | "SplitScored" >> SplitTags("scored", "part")
        )
        written = (
            scored["part"] | "SpreadParts" >> beam.Reshuffle() | "WriteSamples" >> beam.Map(_write_part, job)
        )
        samples = (
            (tag(scored["scored"], "scored"), tag(written, "written"))
            | "GatherSamples" >> GatherTagged()
            | "SamplesWritten" >> beam.Map(_samples_written)
        )
        tasks = (
            samples | "Epochs" >> beam.FlatMap(_epoch_tasks, job) | "SplitTasks" >> SplitTags("epoch", "deal")
        )
        planned = (
            tasks["epoch"]
            | "SpreadEpochs" >> beam.Reshuffle()
            | "PlanEpoch" >> beam.FlatMap(_plan_epoch, job)
            | "SplitPlan" >> SplitTags("stats", "pair", "shard", "rank")
        )
        grouped = tasks["deal"] | "PlanInGroups" >> PlanGroups(job.cfg, PLANNED_PAIRS, job.work)
        pieces = (
            (planned["shard"], grouped["shard"])
            | "AllShards" >> beam.Flatten()
            | "SpreadShards" >> beam.Reshuffle()
            | "WritePieces" >> beam.FlatMap(_write_pieces, job.work)
        )
        files = (
            (planned["rank"], pieces, grouped["rank"])
            | "AllPieces" >> beam.Flatten()
            | "ByRank" >> beam.GroupByKey()
            | "WriteRanks" >> beam.Map(_write_rank, job)
        )
        gathered = (
            tag(samples, "samples"),
            tag(files, "files"),
            tag(planned["stats"], "stats"),
            tag(planned["pair"], "pair"),
            tag(grouped["summary"], "summary"),
            tag(grouped["pair"], "gpair"),
        )
        return gathered | "GatherAll" >> GatherTagged() | "WriteManifest" >> beam.Map(_write_manifest, job)
