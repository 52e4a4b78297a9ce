"""Settle and score the samples of a build: the one path every build takes. Pure.

A build plans a ``Source``: Parquet files of samples sorted by sample_id (the scan's parts, an earlier
run's samples, or a table a user handed to ``lidarshard.write_manifest`` written as one part), with the
inputs rejected so far. ``prepare`` sorts a source that is not (one scratch part); then
``settle_and_score`` streams the few numeric columns it needs a row group at a time:

* **settle**: repeated sample ids (all but the first by ``accounting.DEDUPE_ORDER``) and samples that alone exceed a cap become
  rejects; the counts must add up (scanned = accepted + rejected) and stay under the reject fraction
  (``accounting.counts_or_stop``);
* **score**: cost (the cost model, or the ``cost`` column a user gave), per-sample weights (a column, or
  lidarseg repeat factors read from the label files), exact quantile buckets;

and returns the small metadata the manifest records plus one ``PartTask`` per new samples part, which
the caller writes in parallel (``previous.write_part``). No step holds the paths of all samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.core import previous, settle
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.earlier_run import check_schema, previous_rejects, previous_root
from lidarshard.transforms.core.groups import pool_copies
from lidarshard.transforms.core.manifest_writer import Write, write_file
from lidarshard.transforms.core.planner import bucket_record, streamed_bucket_edges
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.accounting import DEDUPE_ORDER, counts_or_stop
from lidarshard.transforms.features.buckets import assign_buckets, bucket_counts, resolve_weights
from lidarshard.transforms.features.cost import CostModel
from lidarshard.transforms.features.repeat import Weights, repeat_counts
from lidarshard.transforms.io import paths, storage
from lidarshard.transforms.io.arrow import parquet_bytes, row_groups
from lidarshard.transforms.io.parts import open_parts, read_parts, samples_files
from lidarshard.transforms.io.scratch import scores_path
from lidarshard.transforms.plan import seeds

__all__ = [
    "Source",
    "ScoreSettings",
    "GIVEN",
    "previous_source",
    "prepare",
    "settle_and_score",
    "repeat_info",
]

#: The cost model of costs a user gave in a ``cost`` column (``lidarshard.write_manifest``).
GIVEN = CostModel("given")
#: Where ``prepare`` writes a sorted copy of a source, under the build's scratch directory.
PREPARED = "source"


@dataclass(frozen=True)
class Source:
    """The samples a build settles and scores.

    Attributes:
        files: Parquet files (local or URI) read as one table, rows sorted by sample_id across them
            (else ``prepare`` sorts them); at least the samples columns, plus ``cost`` for given costs
            and the ``--sample-weights`` column.
        rejects: inputs rejected before (``schemas.reject_schema()``).
        scanned: inputs scanned; None: the files' rows plus ``rejects``' rows.
        roots: (root the files' paths are stored under, None: full paths; root the new samples store
            their paths under, None: full paths).
        reroot_rejects: new rejects' paths are stored the new run's way (an earlier run's samples);
            else as the files hold them (the scan's full paths).
        ordered: rows are sorted by (sample_id, path) and may repeat an id (``prepare`` wrote them).
    """

    files: tuple[str, ...]
    rejects: pa.Table = field(default_factory=lambda: schemas.reject_schema().empty_table())
    scanned: int | None = None
    roots: tuple[str | None, str | None] = (None, None)
    reroot_rejects: bool = False
    ordered: bool = False


@dataclass(frozen=True)
class ScoreSettings:
    """How a build settles: the largest reject fraction, where the rejects go when it is exceeded
    (beside OUT, never published), and the rows of each new samples part."""

    max_reject_fraction: float
    rejects_out: str
    part_rows: int
    #: {dataset name: {raw label id: class id}}: how each dataset's label files map to classes.
    label_maps: Mapping[str, Mapping[int, int]] = field(default_factory=dict)


def previous_source(path: str, new_root: str | None) -> Source:
    """An earlier run's samples (``OUT/samples`` or a 2.x ``samples.parquet``) with its rejects: paths
    re-stored from the root it recorded onto ``new_root``, new rejects likewise."""
    return Source(
        tuple(samples_files(path)), previous_rejects(path), None, (previous_root(path), new_root), True
    )


def _extras(model: CostModel, cfg: PlanConfig) -> list[str]:
    """Columns besides ``previous.NUMERIC`` that scoring reads: given costs, a weight column."""
    return [c for c in ("cost" if model == GIVEN else None, cfg.repeat.column) if c]


def prepare(source: Source, work: str) -> Source:
    """``source`` when its ids are strictly increasing; else its rows sorted by the duplicate rule's
    ``accounting.DEDUPE_ORDER`` and
    written to one scratch part under ``work`` (the only step that holds a whole table: inputs
    lidarshard did not write sorted, e.g. a 2.x samples.parquet edited by hand).

    Raises:
        ValueError: columns missing or of the wrong types, a null sample_id (one line).
    """
    if source.ordered or not source.files:
        return source
    with open_parts(list(source.files)) as file:
        if previous.repeated_ids(file) is not None:
            return source
    table = read_parts(list(source.files))
    check_schema("the samples", table)
    table = table.sort_by([(k, "ascending") for k in DEDUPE_ORDER if k in table.column_names])
    sorted_part = storage.join(work, PREPARED, schemas.part_name(0))
    storage.write_bytes(sorted_part, parquet_bytes(table))
    return Source((sorted_part,), source.rejects, source.scanned, source.roots, source.reroot_rejects, True)


def settle_and_score(
    source: Source, model: CostModel, cfg: PlanConfig, settings: ScoreSettings, write: Write, work: str
) -> tuple[dict, list[previous.PartTask]]:
    """Settle and score a prepared ``source``; write ``rejects.parquet`` with ``write``.

    Streams the input a row group at a time (``settle.settle_parts``), then the parts' parked costs
    (``settle.costs_by_part``: 8 passes for the exact bucket edges), then scores each part.

    Returns:
        (metadata: ``files`` (rejects.parquet's entry), ``counts``, ``model``, ``buckets``,
        ``fingerprint``, ``repeat``; one ``previous.PartTask`` per samples part to write, parked under
        ``work`` (``previous.unpark`` with ``scratch.scores_path(work, part)`` reads its arrays)).

    Raises:
        TooManyRejects: more than the reject fraction was rejected (all rejects in ``rejects_out``).
        ValueError: no sample was accepted, bad given costs or weights (one line).
    """
    files = list(source.files)
    with open_parts(files) as file:
        repeated = previous.repeated_ids(file, ordered=source.ordered)
        if repeated is None:
            raise ValueError("the samples are not sorted by sample_id: prepare() the source first")
        rejects = source.rejects.cast(schemas.reject_schema())
        n = file.metadata.num_rows
        scanned = n + rejects.num_rows if source.scanned is None else source.scanned
        stored = settle.StoredPaths(file, source.roots, source.reroot_rejects)
        costs_of = settle.model_costs(model, model == GIVEN)
        extras = _extras(model, cfg)
        settled = settle.settle_parts(
            file,
            files,
            repeated,
            costs_of,
            cfg.caps,
            stored,
            extras,
            settings.part_rows,
            work,
            rejects.schema,
        )
        keep = settled.keep
        if settled.added:
            rejects = pa.concat_tables([rejects, *settled.added])
            rejects = rejects.sort_by([(c, "ascending") for c in ("path", "reason", "detail")])
        accepted = sum(settled.kept)
        counts = counts_or_stop(
            scanned, accepted, rejects, settings.max_reject_fraction, settings.rejects_out, plan=True
        )
        if not accepted:
            raise ValueError(f"no sample was accepted ({counts}); nothing to plan")
        weights = _weights(file, keep, cfg, source.roots[0], settings.label_maps)
        edges = streamed_bucket_edges(settle.costs_by_part(settled, work), accepted, cfg)
        counted, ids = _score_parts(settled, edges, weights, work)
        digest = previous.fingerprint_kept(file, keep)
        keys = None
        if weights is not None and cfg.groups(accepted) > 1:
            keys = seeds.sample_keys(stored.ids(np.flatnonzero(keep)))
    scored = None if ids is None else pa.table({"bucket_id": pa.array(ids, pa.int32())})
    meta = {
        "files": [write_file(write, schemas.REJECTS_FILE, parquet_bytes(rejects))],
        "counts": counts,
        "model": model.to_json(),
        "buckets": bucket_record(edges, counted, cfg),
        "fingerprint": digest,
        "repeat": repeat_info(scored, weights, cfg, keys),
    }
    return meta, settled.tasks


def _score_parts(
    settled: settle.Settled, edges: NDArray[np.float64], weights: Weights | None, work: str
) -> tuple[NDArray[np.int64], NDArray[np.int32] | None]:
    """Bucket each part's parked costs by ``edges`` and park its scores (``previous.park_scores``):
    ((K,) samples per bucket, (kept,) every kept sample's bucket id in order, only with ``weights``)."""
    k = len(edges) + 1
    counts = np.zeros(k, np.int64)
    ids = None if weights is None else np.empty(sum(settled.kept), np.int32)
    at = 0
    for task, n in zip(settled.tasks, settled.kept, strict=True):
        path = scores_path(work, task.part)
        cost = settle.parked_costs(path)
        part = assign_buckets(cost, edges)
        counts += bucket_counts(part, k)
        weight = np.ones(n) if weights is None else weights.values[at : at + n]
        previous.park_scores(path, cost, part, weight)
        if ids is not None:
            ids[at : at + n] = part
        at += n
    return counts, ids


def _weights(
    file,
    keep: NDArray[np.bool_],
    cfg: PlanConfig,
    root: str | None,
    label_maps: Mapping[str, Mapping[int, int]],
) -> Weights | None:
    """The kept samples' weights: a column's, or repeat factors from the label files (read one at a
    time, their paths resolved under ``root``), times the ``--dataset-weights`` of each sample's
    dataset; None when all are 1."""
    weights = None
    if cfg.repeat.column is not None:
        column = pa.concat_tables(row_groups(file, [cfg.repeat.column]))
        weights = Weights(repeat.column_weights(column, cfg.repeat.column)[keep])
    elif cfg.repeat.threshold is not None:
        presence, has = repeat.label_presence(_labels(file, keep, root, label_maps))
        weights = Weights(repeat.lvis_factors(presence, has, cfg.repeat.threshold), presence)
    if not cfg.repeat.datasets:
        return weights
    scale = _dataset_scale(file, keep, dict(cfg.repeat.datasets))
    return Weights(scale) if weights is None else Weights(weights.values * scale, weights.presence)


def _kept(file, keep: NDArray[np.bool_], column: str) -> list:
    """Column ``column`` of the kept rows (None each when the samples have no such column: 4.0)."""
    if column not in file.schema_arrow.names:
        return [None] * int(keep.sum())
    values = [v for t in row_groups(file, [column]) for v in t.column(column).to_pylist()]
    return [v for v, k in zip(values, keep, strict=True) if k]


def _dataset_scale(file, keep: NDArray[np.bool_], scale: Mapping[str, float]) -> NDArray[np.float64]:
    """(kept,) the ``--dataset-weights`` of each kept row's ``dataset``."""
    return repeat.dataset_scale(_kept(file, keep, "dataset"), scale)


def _labels(file, keep: NDArray[np.bool_], root: str | None, label_maps: Mapping[str, Mapping[int, int]]):
    """The class ids of the kept rows' label files, in order (None: no label file)."""
    full = paths.resolved(_kept(file, keep, "label_path"), root)
    return repeat.decoded_labels(full, _kept(file, keep, "dataset"), label_maps, storage.read_bytes)


def repeat_info(
    scored: pa.Table | None, weights: Weights | None, cfg: PlanConfig, keys: NDArray[np.uint64] | None = None
) -> dict | None:
    """The manifest's ``repeat`` object (None without sample weights): expected copies per epoch of
    the samples holding each lidarseg class (bucket weight x sample weight), and the copies each
    epoch's pool holds (``groups.pool_copies``; ``keys``: the samples' ``seeds.sample_keys``, needed
    with step groups); a column's weights count all samples under ``'all'``."""
    if weights is None or scored is None:
        return None
    ids = scored.column("bucket_id").to_numpy()
    n = scored.num_rows
    k = int(ids.max()) + 1 if n else 1
    expected = repeat_counts(weights.presence, weights.values * resolve_weights(cfg.weights, k)[ids])
    realized = [
        repeat_counts(weights.presence, pool_copies(ids, weights.values, keys, e, cfg))
        for e in range(cfg.epochs)
    ]
    info = {"mode": cfg.repeat.mode, "expected": expected, "realized": realized}
    return info | ({"datasets": dict(cfg.repeat.datasets)} if cfg.repeat.datasets else {})
