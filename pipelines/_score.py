"""The build's CheckAndScore step: the scan's rows (merged from their hash shards) or an earlier
run's samples.parquet (``--from-samples``) -> accounting and caps -> cost -> exact quantile buckets
-> samples.parquet and rejects.parquet in the staging directory; returns the metadata the manifest
needs. Both inputs are streamed a row group at a time; ``--repeat-factors`` (which reads every
label file) and an earlier table not sorted by sample_id take the in-memory path."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from lidarshard import schemas
from lidarshard.pipelines import launch, options
from lidarshard.transforms import paths, storage
from lidarshard.transforms.arrow import parquet_file
from lidarshard.transforms.beam.scan import NAMESPACE, scan_results, shard_path
from lidarshard.transforms.features import previous, repeat, shards
from lidarshard.transforms.features.cost import CostModel, sample_costs
from lidarshard.transforms.plan import manifest
from lidarshard.transforms.plan.epochs import PlanConfig, bucket_costs

__all__ = ["writer", "check_and_score", "settle_previous", "settle_scan"]

#: Table -> table with its paths stored the new run's way.
Reroot = Callable[[pa.Table], pa.Table]


def writer(staging: str):
    """``write(rel, data)``: a file into the staging directory, counted in the run's metrics."""

    def write(rel: str, data: bytes) -> None:
        storage.write_bytes(storage.join(staging, rel), data)
        Metrics.counter(NAMESPACE, "files_written").inc()
        Metrics.counter(NAMESPACE, "bytes_written").inc(len(data))

    return write


def check_and_score(
    scanned: int, samples: pa.Table, rejects: pa.Table, model: CostModel, cfg: PlanConfig, args: dict
) -> dict:
    """The in-memory path: settle (duplicates, caps, counts), repeat weights, re-root, score and write."""
    samples, rejects, counts = launch.settle_or_stop(
        scanned, samples, rejects, args["max_reject"], args["rejects_out"],
        lambda s, r: manifest.reject_over_cap(s, r, model, cfg),
    )  # fmt: skip
    label_root = args["root"] if args["from_samples"] else None  # a scan's paths are still absolute
    samples, weights = repeat.sample_weights(samples, cfg.repeat, lambda p: _read_label(p, label_root))
    if samples.num_rows and args["root"] is not None and not args["from_samples"]:  # re-rooted when read
        samples = paths.relative_to(samples, args["root"])
    return manifest.score_samples(
        samples, rejects, counts, model, cfg, writer(args["staging"]), weights=weights
    )


def _read_label(path: str, root: str | None) -> bytes:
    """A lidarseg label file; a relative ``path`` resolves under ``root``."""
    return storage.read_bytes(paths.join_root(root, path) if root and paths.is_relative(path) else path)


def _previous_rejects(path: str) -> pa.Table:
    root = path.rsplit("/", 1)[0] if "/" in path else "."
    try:
        return storage.read_parquet(storage.join(root, schemas.REJECTS_FILE))
    except OSError:
        return schemas.reject_schema().empty_table()


def _previous(path: str, new_root: str | None, weight_column: str | None) -> tuple[int, pa.Table, pa.Table]:
    """(scanned, samples, rejects) of an earlier scan/build whose samples.parquet is ``path``, with its
    sample paths re-rooted from the earlier run's ``path_root`` onto ``new_root``; ``weight_column``
    (``--sample-weights``) rides along as ``repeat.WEIGHT_COLUMN``, matched by sample_id. Holds the
    table: for inputs ``_settle_previous`` does not stream."""
    samples = options.read_previous_samples(path)
    samples = paths.relative_to(paths.absolute(samples, options.previous_root(path)), new_root)
    rejects = _previous_rejects(path)
    if weight_column is not None:  # the raw table's row order differs from the sorted samples
        raw = storage.read_parquet(path, columns=["sample_id", weight_column])
        at = pc.index_in(samples.column("sample_id"), value_set=raw.column("sample_id")).to_numpy()
        values = repeat.column_weights(raw, weight_column)[at.astype(np.int64)]
        samples = samples.append_column(repeat.WEIGHT_COLUMN, pa.array(values, pa.float64()))
    return samples.num_rows + rejects.num_rows, samples, rejects


def settle_previous(path: str, model: CostModel, cfg: PlanConfig, args: dict) -> dict:
    """``--from-samples``: settle, score and write samples.parquet/rejects.parquet like
    ``check_and_score``, streaming the earlier table (``_score_stream``). Inputs not sorted by
    sample_id, and ``--repeat-factors`` (which reads every label file), take the in-memory path."""
    old_root, new_root = options.previous_root(path), args["root"]

    def reroot(t: pa.Table) -> pa.Table:
        return paths.relative_to(paths.absolute(t, old_root), new_root)

    with storage.open_read(path) as f:
        file = parquet_file(f)
        column = cfg.repeat.column
        numeric = None if cfg.repeat.threshold is not None else previous.numeric_columns(file, column)
        if numeric is None:
            return check_and_score(*_previous(path, new_root, column), model, cfg, args)
        rejects = _previous_rejects(path)
        scanned = numeric.num_rows + rejects.num_rows
        return _score_stream(file, numeric, scanned, rejects, reroot, reroot, model, cfg, args)


def settle_scan(gathered: dict[str, list], model: CostModel, cfg: PlanConfig, args: dict) -> dict:
    """The scan's shard files merged into one sorted scratch table (streamed), then settled and
    scored like ``--from-samples`` (``_score_stream``); with ``--repeat-factors`` in memory."""
    scanned, written, rejects = scan_results(gathered)
    work = storage.join(args["staging"], launch.WORK_DIR)
    merged = storage.join(work, "scanned.parquet")
    with storage.open_write(merged) as sink:
        shards.write_merged([shard_path(work, s) for s, _ in written], storage.open_read, sink)
    with storage.open_read(merged) as f:
        file = parquet_file(f)
        numeric = None if cfg.repeat.threshold is not None else previous.numeric_columns(file)
        if numeric is None:  # no sample, or repeat factors: the in-memory path says what is wrong
            samples = storage.read_parquet(merged)
            return check_and_score(scanned, samples, rejects, model, cfg, args)

        def reroot(t: pa.Table) -> pa.Table:
            return paths.relative_to(t, args["root"])

        # a scan's rejects keep full paths, as in the in-memory path
        return _score_stream(file, numeric, scanned, rejects, reroot, lambda t: t, model, cfg, args)


def _score_stream(
    file, numeric: pa.Table, scanned: int, rejects: pa.Table, reroot: Reroot, reroot_rejects: Reroot,
    model: CostModel, cfg: PlanConfig, args: dict,
) -> dict:  # fmt: skip
    """Settle and score from ``numeric`` (``previous.NUMERIC`` of ``file``'s rows, sorted unique
    ids), then stream ``file`` into samples.parquet. ``reroot`` (the rows) and ``reroot_rejects``
    (over-cap reject paths): table -> table with paths stored the new run's way. CheckAndScore's
    metadata."""
    column = cfg.repeat.column
    cost = sample_costs(numeric, model)
    points = numeric.column("num_points").to_numpy()

    def paths_at(rows: np.ndarray) -> list[str]:
        return reroot_rejects(pa.table({"path": previous.paths_at(file, rows)})).column("path").to_pylist()

    keep, rejects = manifest.over_cap_rejects(cost, points, cfg, rejects, paths_at)
    counts = launch.counts_or_stop(scanned, int(keep.sum()), rejects, args["max_reject"], args["rejects_out"])
    if not keep.any():
        raise ValueError(f"no sample was accepted ({counts}); nothing to plan")
    cost = cost[keep]
    weights = None if column is None else repeat.Weights(repeat.column_weights(numeric, column)[keep], None)
    weight = np.ones(cost.size) if weights is None else weights.values
    ids, edges = bucket_costs(cost, cfg)
    with storage.open_write(storage.join(args["staging"], schemas.SAMPLES_FILE)) as sink:
        digest, out = previous.rewrite_scored(file, keep, cost, ids, weight, reroot, sink)
    Metrics.counter(NAMESPACE, "files_written").inc()
    Metrics.counter(NAMESPACE, "bytes_written").inc(out.bytes)
    scored = pa.table(
        {"cost": cost, "bucket_id": pa.array(ids, pa.int32()), "num_points": points[keep], "weight": weight}
    )
    samples_file = {"path": schemas.SAMPLES_FILE, "bytes": out.bytes, "sha256": out.sha256}
    write = writer(args["staging"])
    return manifest.checked_meta(
        samples_file, rejects, counts, model, cfg, write, scored, edges, digest, weights
    )
