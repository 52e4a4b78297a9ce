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
from lidarshard.transforms.core import previous
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.epochs import bucket_costs, bucket_info
from lidarshard.transforms.core.groups import pool_copies, sample_keys
from lidarshard.transforms.core.record import Write, write_file
from lidarshard.transforms.core.recorded import check_schema, previous_rejects, previous_root
from lidarshard.transforms.features import repeat
from lidarshard.transforms.features.accounting import DEDUPE_ORDER, counts_or_stop, duplicate_rejects
from lidarshard.transforms.features.buckets import resolve_weights
from lidarshard.transforms.features.cost import CostModel, sample_costs
from lidarshard.transforms.features.repeat import Weights, repeat_counts
from lidarshard.transforms.io import paths, storage
from lidarshard.transforms.io.arrow import parquet_bytes, row_groups
from lidarshard.transforms.io.parts import open_parts, read_parts, samples_files
from lidarshard.transforms.plan.caps import over_cap

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
    source: Source, model: CostModel, cfg: PlanConfig, settings: ScoreSettings, write: Write
) -> tuple[dict, list[previous.PartTask]]:
    """Settle and score a prepared ``source``; write ``rejects.parquet`` with ``write``.

    Returns:
        (metadata: ``files`` (rejects.parquet's entry), ``counts``, ``model``, ``buckets``,
        ``fingerprint``, ``repeat``; one ``previous.PartTask`` per samples part to write).

    Raises:
        TooManyRejects: more than the reject fraction was rejected (all rejects in ``rejects_out``).
        ValueError: no sample was accepted, bad given costs or weights (one line).
    """
    files = list(source.files)
    with open_parts(files) as file:
        repeated = previous.repeated_ids(file, ordered=source.ordered)
        if repeated is None:
            raise ValueError("the samples are not sorted by sample_id: prepare() the source first")
        numeric = previous.numeric_columns(file, _extras(model, cfg))
        rejects = source.rejects.cast(schemas.reject_schema())
        scanned = numeric.num_rows + rejects.num_rows if source.scanned is None else source.scanned
        cost = _costs(numeric, model)
        stored = _StoredPaths(file, source)
        keep, rejects = _settle(numeric, repeated, cost, cfg, rejects, stored)
        counts = counts_or_stop(
            scanned, int(keep.sum()), rejects, settings.max_reject_fraction, settings.rejects_out, plan=True
        )
        if not keep.any():
            raise ValueError(f"no sample was accepted ({counts}); nothing to plan")
        cost = cost[keep]
        weights = _weights(file, numeric, keep, cfg, source.roots[0], settings.label_maps)
        weight = np.ones(cost.size) if weights is None else weights.values
        ids, edges = bucket_costs(cost, cfg)
        tasks = previous.part_tasks(file, files, keep, cost, ids, weight, source.roots, settings.part_rows)
        digest = previous.fingerprint_kept(file, keep)
        keys = None
        if weights is not None and cfg.groups(cost.size) > 1:
            keys = sample_keys(stored.ids(np.flatnonzero(keep)))
    scored = pa.table(
        {
            "cost": cost,
            "bucket_id": pa.array(ids, pa.int32()),
            "num_points": numeric.column("num_points").to_numpy()[keep],
            "weight": weight,
        }
    )
    meta = {
        "files": [write_file(write, schemas.REJECTS_FILE, parquet_bytes(rejects))],
        "counts": counts,
        "model": model.to_json(),
        "buckets": bucket_info(scored, edges, cfg),
        "fingerprint": digest,
        "repeat": repeat_info(scored, weights, cfg, keys),
    }
    return meta, tasks


class _StoredPaths:
    """Columns of chosen rows of the source, for reject lines: paths stored the way new rejects are."""

    def __init__(self, file, source: Source) -> None:
        self.file, self.roots, self.reroot = file, source.roots, source.reroot_rejects

    def paths(self, rows: NDArray[np.int64]) -> list[str]:
        found = previous.paths_at(self.file, rows)
        if not self.reroot:
            return found
        return previous.reroot(pa.table({"path": found}), self.roots).column("path").to_pylist()

    def ids(self, rows: NDArray[np.int64]) -> list[str]:
        return previous.paths_at(self.file, rows, "sample_id")


def _costs(numeric: pa.Table, model: CostModel) -> NDArray[np.float64]:
    """(N,) costs: the model's, or the given ``cost`` column (finite, >= 0)."""
    if model != GIVEN:
        return sample_costs(numeric, model)
    col = numeric.column("cost")
    cost = col.to_numpy(zero_copy_only=False).astype(np.float64) if not col.null_count else None
    if cost is None or not (np.isfinite(cost).all() and (cost >= 0).all()):
        raise ValueError("cost must hold one finite value >= 0 per sample")
    return cost


def _settle(
    numeric: pa.Table,
    repeated: NDArray[np.bool_],
    cost: NDArray[np.float64],
    cfg: PlanConfig,
    rejects: pa.Table,
    stored: _StoredPaths,
) -> tuple[NDArray[np.bool_], pa.Table]:
    """(keep mask (N,), rejects plus one row per repeated id and per sample over a cap, sorted)."""
    keep = ~repeated
    added = []
    if repeated.any():
        rows = np.flatnonzero(repeated)
        added.append(
            pa.Table.from_pylist(duplicate_rejects(stored.paths(rows), stored.ids(rows)), rejects.schema)
        )
    if cfg.caps.active:
        candidates = np.flatnonzero(keep)
        points = numeric.column("num_points").to_numpy(zero_copy_only=False)[candidates]
        memory = None if cfg.caps.memory is None else cfg.caps.memory.model.sample_bytes(numeric)[candidates]
        details = over_cap(cost[candidates], points, cfg.caps, memory)
        bad = candidates[[bool(d) for d in details]] if len(details) else candidates[:0]
        if bad.size:
            keep[bad] = False
            text = [d for d in details if d]
            over = {"path": stored.paths(bad), "reason": ["over_cap"] * bad.size, "detail": text}
            added.append(pa.Table.from_pydict(over, schema=rejects.schema))
    if added:
        rejects = pa.concat_tables([rejects, *added])
        rejects = rejects.sort_by([(c, "ascending") for c in ("path", "reason", "detail")])
    return keep, rejects


def _weights(
    file,
    numeric: pa.Table,
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
        weights = Weights(repeat.column_weights(numeric, cfg.repeat.column)[keep])
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
    scored: pa.Table, weights: Weights | None, cfg: PlanConfig, keys: NDArray[np.uint64] | None = None
) -> dict | None:
    """The manifest's ``repeat`` object (None without sample weights): expected copies per epoch of
    the samples holding each lidarseg class (bucket weight x sample weight), and the copies each
    epoch's pool holds (``groups.pool_copies``; ``keys``: the samples' ``groups.sample_keys``, needed
    with step groups); a column's weights count all samples under ``'all'``."""
    if weights is None:
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
