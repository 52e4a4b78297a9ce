"""Beam wiring of the scan: discover -> read+featurize (dead letters to rejects) -> hash shards of
the feature rows, each sorted, deduplicated and written as a scratch file (``features.shards``) ->
samples parts, one task per sample_id range merging it from every shard file. Only the shard list
(with a sample of its ids), the part list, the scanned count and the rejects are gathered; no step
holds every row.

DoFns with two outputs yield ``(tag, value)`` records split by ``SplitTags`` (correct on the
DaskRunner too, whose multi-output ParDo is broken).

Thin DoFns around ``lidarshard.transforms.features.sample`` and ``lidarshard.transforms.layouts.nuscenes_tasks``;
every file access goes through ``lidarshard.transforms.io.storage`` (Beam FileSystems for URIs), so
local paths, gs:// and s3:// work alike.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.io import fileio
from apache_beam.metrics import Metrics

from lidarshard import schemas
from lidarshard.transforms import layouts, progress
from lidarshard.transforms.beam.tagged import GatherTagged, SplitTags, tag
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features import shards
from lidarshard.transforms.features.sample import ScanConfig, featurize, file_task
from lidarshard.transforms.formats.discover import walk_local
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import concat_sorted, rows_to_table
from lidarshard.transforms.layouts import Dataset
from lidarshard.transforms.layouts.task import LayoutOptions, ScanTask
from lidarshard.transforms.plan.seeds import scan_shard

__all__ = [
    "ScanSamples",
    "ScanResult",
    "scan_results",
    "shard_path",
    "ConcatRows",
    "input_root",
    "NAMESPACE",
]

NAMESPACE = "lidarshard"


def _reject_row(path: str, reason: str, detail: str) -> dict:
    return {"path": path, "reason": reason, "detail": detail}


class _Featurize(beam.DoFn):
    """Task -> ``("samples", feature row)`` or ``("rejects", reject row)``. Counts every outcome: Beam
    counters, and the progress tally (``lidarshard.transforms.progress``)."""

    def __init__(self, cfg: ScanConfig, label_maps: Mapping[str, Mapping[int, int]] | None = None) -> None:
        self._cfg, self._maps = cfg, dict(label_maps or {})
        self._accepted = Metrics.counter(NAMESPACE, "accepted")

    def setup(self) -> None:
        self._tally = progress.Tally("inputs read")

    def process(self, task: ScanTask) -> Iterator:
        try:
            label_map = self._maps.get(task.dataset) if task.dataset is not None else None
            row = featurize(task, storage.read_bytes, storage.size, self._cfg, storage.open_read, label_map)
        except RejectError as e:
            self._tally.add(rejected=1)
            yield from _rejected(task.path, e.reason, e.detail)
        except (ValueError, TypeError, IndexError, MemoryError) as e:  # a reader bug: keep the run going
            self._tally.add(rejected=1)
            yield from _rejected(task.path, "reader_error", f"{type(e).__name__}: {e}")
        else:
            self._tally.add()
            self._accepted.inc()
            yield "samples", row

    def finish_bundle(self) -> None:
        self._tally.flush()

    def teardown(self) -> None:
        self._tally.flush()


class _FeaturizeOfTotal(_Featurize):
    """``_Featurize`` told how many inputs there are to read in all (``total``, a side input), which
    the progress line shows with a rate and an ETA."""

    def process(self, task: ScanTask, total: int | None = None) -> Iterator:
        self._tally.total = total
        yield from super().process(task)


def _rejected(path: str, reason: str, detail: str) -> Iterator:
    Metrics.counter(NAMESPACE, f"rejected_{reason}").inc()
    yield "rejects", _reject_row(path, reason, detail)


def _relative(path: str, root: str) -> str:
    rel = path[len(root) :].lstrip("/") if storage.has_scheme(path) else posixpath.relpath(path, root)
    return rel.replace(os.sep, "/") if os.sep != "/" else rel  # a backslash is part of a POSIX name


def _glob_root(pattern: str) -> str:
    """The directory part of ``pattern`` before its first glob character."""
    cut = min((pattern.find(c) for c in "*?[" if c in pattern), default=len(pattern))
    return pattern[:cut].rsplit("/", 1)[0] if cut < len(pattern) else pattern.rstrip("/")


def _file_pattern(input_path: str) -> tuple[str, str]:
    if any(c in input_path for c in "*?["):
        return input_path, _glob_root(input_path)
    root = input_path.rstrip("/")
    return root + "/**", root


def input_root(input_path: str) -> str:
    """The directory an INPUT's file sample_ids are relative to: INPUT itself, or a glob's part before
    its first wildcard."""
    return _file_pattern(input_path)[1]


def _is_local_dir(path: str) -> bool:
    """An existing local directory is INPUT as named, even with ``*?[`` in its name (``in[1]``)."""
    return not storage.has_scheme(path) and os.path.isdir(path)


class _WalkLocal(beam.DoFn):
    """Local directory -> ``("tasks", file task)``; entries that cannot be stat'ed ->
    ``("rejects", row)`` (``unreadable``)."""

    def process(self, root: str) -> Iterator:
        for path, why in walk_local(root):
            if why is None:
                yield "tasks", file_task(_relative(path, root), path)
            else:
                yield from _rejected(file_task(path, path).path, "unreadable", why)


class _LoadLayout(beam.DoFn):
    """A dataset root -> ``("tasks", task)`` per sample of its layout, ``("rejects", row)`` per bad record."""

    def __init__(self, layout: str, opts: LayoutOptions) -> None:
        self._layout, self._opts = layout, opts

    def process(self, root: str) -> Iterator:
        found = layouts.load(self._layout, root, self._opts, layouts.STORAGE_IO)
        for task in found.tasks:
            yield "tasks", task
        for path, reason, detail in found.rejects:
            yield from _rejected(path, reason, detail)


def _owned(task: ScanTask, dataset: str, prefix: str) -> ScanTask:
    """``task`` of INPUT ``dataset``; its sample_id prefixed (``prefix``: ``"NAME/"`` when a run has
    several INPUTs, else empty)."""
    return dataclasses.replace(task, dataset=dataset, sample_id=prefix + task.sample_id)


#: Rows an accumulator holds as Python dicts before it converts them to an Arrow table.
ROWS_PER_CHUNK = 4096

#: A ``ConcatRows`` accumulator: converted tables, then rows not yet converted.
_Acc = tuple[list[pa.Table], list[dict]]


class ConcatRows(beam.CombineFn):
    """Gathers rows (dicts) into one Arrow table sorted by ``keys``: exact and independent of
    bundling. Rows become tables ``ROWS_PER_CHUNK`` at a time inside the accumulator, so nothing
    is emitted from a ``finish_bundle`` (the DaskRunner drops what a DoFn emits there, which
    ruled out ``BatchElements``)."""

    def __init__(self, schema: pa.Schema, keys: tuple[str, ...]) -> None:
        self._schema, self._keys = schema, keys

    def create_accumulator(self) -> _Acc:
        return [], []

    def add_input(self, acc: _Acc, row: dict) -> _Acc:
        tables, rows = acc
        rows.append(row)
        if len(rows) >= ROWS_PER_CHUNK:
            return [*tables, rows_to_table(rows, self._schema)], []
        return acc

    def _table(self, accs: Iterable[_Acc]) -> pa.Table:
        tables, rows = [], []
        for t, r in accs:
            tables += t
            rows += r
        return concat_sorted([*tables, rows_to_table(rows, self._schema)], self._schema, self._keys)

    def merge_accumulators(self, accs: Iterable[_Acc]) -> _Acc:
        return [self._table(accs)], []

    def extract_output(self, acc: _Acc) -> pa.Table:
        return self._table([acc])


def scan_results(gathered: dict[str, list]) -> tuple[int, list[tuple[int, int, dict]], pa.Table]:
    """``GatherTagged`` of a ``ScanResult`` (``{"scanned": [n], "parts": [(k, rows, file entry), ...],
    "rejects": [table]}``) -> (scanned, parts sorted by k, rejects); an absent key (nothing was
    gathered) is 0, no part or an empty table."""
    (scanned,) = gathered.get("scanned", [0])
    (rejects,) = gathered.get("rejects", [schemas.reject_schema().empty_table()])
    return scanned, sorted(gathered.get("parts", []), key=lambda p: p[0]), rejects


def shard_path(work_dir: str, shard: int) -> str:
    """The scratch file of hash shard ``shard`` of the scan's rows."""
    return storage.join(work_dir, "scan", f"shard={shard:04d}.parquet")


def _part_ranges(gathered: dict[str, list], work_dir: str, part_rows: int) -> Iterator[tuple]:
    """The written shards (``{"shards": [(shard, rows, sampled ids), ...]}``) -> one ``(k, lo, hi,
    shard paths)`` task per samples part (at least one, empty when no row was accepted)."""
    written = sorted(s for s in gathered.get("shards", []) if s[1])
    splits = shards.split_keys(
        [k for _, _, keys in written for k in keys], part_rows, shards.key_stride(part_rows)
    )
    paths = [shard_path(work_dir, shard) for shard, _, _ in written]
    for k, (lo, hi) in enumerate(shards.key_ranges(splits)):
        yield k, lo, hi, paths


def _merge_part(task: tuple, parts_dir: str) -> tuple[int, int, dict]:
    """Write samples part ``k`` (its id range merged from the shard files): ``(k, rows, files entry)``."""
    k, lo, hi, paths = task
    with storage.open_write(storage.join(parts_dir, schemas.part_name(k))) as sink:
        rows, out = shards.write_range(paths, lo, hi, storage.open_read, sink)
    return k, rows, {"path": schemas.samples_part(k), "bytes": out.bytes, "sha256": out.sha256}


class _WriteShard(beam.DoFn):
    """``(shard, feature rows)`` -> its scratch file, sorted and deduplicated; yields ``("shards",
    (shard, rows kept, sampled ids))`` and ``("rejects", row)`` per duplicate id."""

    def __init__(self, work_dir: str, stride: int) -> None:
        self._work, self._stride = work_dir, stride

    def process(self, grouped: tuple[int, Iterable[dict]]) -> Iterator:
        shard, rows = grouped
        table, dups = shards.settle_shard(rows)  # streamed, CHUNK_ROWS dicts at a time
        storage.write_bytes(shard_path(self._work, shard), shards.shard_bytes(table))
        yield "shards", (shard, table.num_rows, shards.sampled_keys(table, self._stride, shard))
        for row in dups:
            yield from _rejected(row["path"], row["reason"], row["detail"])


class ScanResult:
    """PCollections produced by ``ScanSamples``: ``parts`` ((k, rows, files entry) per samples part
    written), ``rejects`` (one table) and ``scanned`` (one count); ``rejects`` and ``scanned`` are EMPTY
    (no element) when there is nothing to gather: ``scan_results`` fills in 0 and an empty table. (Without defaults: a
    default is injected through a side input, which the DaskRunner recomputes, see
    ``transforms.beam.tagged``.)"""

    def __init__(self, parts: beam.PCollection, rejects: beam.PCollection, scanned: beam.PCollection):
        self.parts, self.rejects, self.scanned = parts, rejects, scanned

    def gathered(self) -> beam.PCollection:
        """ONE element ``{"scanned", "parts", "rejects"}`` (see ``scan_results``), as a main input."""
        tagged = (tag(self.scanned, "scanned"), tag(self.parts, "parts"), tag(self.rejects, "rejects"))
        return tagged | "GatherScan" >> GatherTagged()


def _to_table(schema: pa.Schema, keys: tuple[str, ...], label: str, pcoll: beam.PCollection):
    return pcoll | f"Gather{label}" >> beam.CombineGlobally(ConcatRows(schema, keys)).without_defaults()


class ScanSamples(beam.PTransform):
    """INPUTs (``Dataset``: files/glob, or a dataset root of a layout) -> ``ScanResult``: the accepted
    rows sorted by sample_id as samples parts ``parts_dir/part-NNNNN.parquet`` of about ``part_rows``
    rows, written in parallel from hash-shard scratch files under ``work_dir`` (``shard_path``; the
    caller removes them); the rejects table. With several INPUTs each sample_id is prefixed with its
    dataset's name. ``opts`` shapes every layout INPUT's tasks, or is {INPUT name: options}."""

    def __init__(
        self, datasets: Sequence[Dataset], opts: LayoutOptions | Mapping[str, LayoutOptions], cfg: ScanConfig,
        work_dir: str, parts_dir: str,
        part_rows: int, label_maps: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self._datasets, self._opts, self._cfg = tuple(datasets), opts, cfg  # local roots: absolute
        self._work, self._parts_dir, self._part_rows = work_dir, parts_dir, part_rows
        self._maps = dict(label_maps or {})

    def _found(self, pbegin: beam.pvalue.PBegin, d: Dataset, step: str) -> tuple:
        """(tasks, rejects) of one INPUT."""
        if d.layout != layouts.FILES:
            opts = self._opts[d.name] if isinstance(self._opts, Mapping) else self._opts  # one per INPUT
            found = (
                pbegin
                | f"{step}Root" >> beam.Create([d.root.rstrip("/")])
                | f"{step}Load" >> beam.ParDo(_LoadLayout(d.layout, opts))
                | f"{step}SplitFound" >> SplitTags("tasks", "rejects")
            )
            return found["tasks"], found["rejects"]
        if _is_local_dir(d.root):
            root = d.root.rstrip("/") or "/"
            found = (
                pbegin
                | f"{step}Root" >> beam.Create([root])
                | f"{step}Walk" >> beam.ParDo(_WalkLocal())
                | f"{step}SplitFound" >> SplitTags("tasks", "rejects")
            )
            return found["tasks"], found["rejects"]
        pattern, root = _file_pattern(d.root)
        tasks = (
            pbegin
            | f"{step}Match"
            >> fileio.MatchFiles(pattern, fileio.EmptyMatchTreatment.DISALLOW)  # gone since the check
            | f"{step}NoMarkers" >> beam.Filter(lambda m: not m.path.endswith("/"))  # "folder/" objects
            | f"{step}ToTask" >> beam.Map(lambda m, r: file_task(_relative(m.path, r), m.path), root)
        )
        return tasks, pbegin | f"{step}NoTableRejects" >> beam.Create([])

    def expand(self, pbegin: beam.pvalue.PBegin) -> ScanResult:
        several = len(self._datasets) > 1
        all_tasks, all_rejects = [], []
        for i, d in enumerate(self._datasets):
            step = f"Input{i}" if several else ""
            tasks, rejects = self._found(pbegin, d, step)
            prefix = f"{d.name}/" if several else ""
            all_tasks.append(tasks | f"{step}Own" >> beam.Map(_owned, d.name, prefix))
            all_rejects.append(rejects)
        tasks = tuple(all_tasks) | "AllTasks" >> beam.Flatten()
        table_rejects = tuple(all_rejects) | "AllTableRejects" >> beam.Flatten()
        scanned = (
            (tasks, table_rejects)
            | "AllInputs" >> beam.Flatten()
            | "CountScanned" >> beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults()
        )
        to_read = (
            tasks | "CountTasks" >> beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults()
        )
        read = (
            tasks
            | "Spread" >> beam.Reshuffle()
            | "Featurize"
            >> beam.ParDo(
                _FeaturizeOfTotal(self._cfg, self._maps),
                total=beam.pvalue.AsSingleton(to_read, default_value=None),
            )
            | "SplitRead" >> SplitTags("samples", "rejects")
        )
        written = (
            read["samples"]
            | "ByShard" >> beam.Map(lambda row: (scan_shard(row["sample_id"], shards.SCAN_SHARDS), row))
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShard(self._work, shards.key_stride(self._part_rows)))
            | "SplitShards" >> SplitTags("shards", "rejects")
        )
        parts = (
            (tag(written["shards"], "shards"),)
            | "GatherShards" >> GatherTagged()
            | "CutParts" >> beam.FlatMap(_part_ranges, self._work, self._part_rows)
            | "SpreadParts" >> beam.Reshuffle()
            | "MergeParts" >> beam.Map(_merge_part, self._parts_dir)
        )
        rejects = (table_rejects, read["rejects"], written["rejects"]) | "AllRejects" >> beam.Flatten()
        reject_table = _to_table(schemas.reject_schema(), ("path", "reason", "detail"), "Rejects", rejects)
        return ScanResult(parts, reject_table, scanned)
