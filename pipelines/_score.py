"""The build's CheckAndScore step: the scan's samples parts or an earlier run's samples
(``--from-samples``) -> accounting and caps -> cost -> exact quantile buckets -> rejects.parquet and
the tasks that write the new samples parts, one each, in parallel (``write_part``); the metadata the
manifest needs once they are written (``samples_written``). Inputs are streamed a row group at a
time; ``--repeat-factors`` (which reads every label file) and an earlier table not sorted by
sample_id take the in-memory path, which writes its parts itself.

CheckAndScore yields ``("scored", metadata)`` and one ``("part", previous.PartTask)`` per part."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from lidarshard import schemas
from lidarshard.pipelines import launch, options
from lidarshard.transforms import paths, storage
from lidarshard.transforms.arrow import parquet_file
from lidarshard.transforms.beam.scan import NAMESPACE, scan_results
from lidarshard.transforms.features import previous, repeat
from lidarshard.transforms.features.cost import CostModel, sample_costs
from lidarshard.transforms.parts import listed_parts, open_parts, read_parts, samples_files
from lidarshard.transforms.plan import manifest
from lidarshard.transforms.plan.epochs import PlanConfig, bucket_costs

__all__ = [
    "writer",
    "check_and_score",
    "settle_previous",
    "settle_scan",
    "write_part",
    "written_parts",
    "samples_written",
    "SCANNED_DIR",
]

#: Table -> table with its paths stored the new run's way.
Reroot = Callable[[pa.Table], pa.Table]
#: The scan's samples parts of a build, under the staging directory's scratch directory.
SCANNED_DIR = "scanned"


def writer(staging: str):
    """``write(rel, data)``: a file into the staging directory, counted in the run's metrics."""

    def write(rel: str, data: bytes) -> None:
        storage.write_bytes(storage.join(staging, rel), data)
        Metrics.counter(NAMESPACE, "files_written").inc()
        Metrics.counter(NAMESPACE, "bytes_written").inc(len(data))

    return write


def check_and_score(
    scanned: int, samples: pa.Table, rejects: pa.Table, model: CostModel, cfg: PlanConfig, args: dict
) -> Iterator[tuple[str, object]]:
    """The in-memory path: settle (duplicates, caps, counts), repeat weights, re-root, score and
    write the parts here; yields ``("scored", metadata)`` only."""
    samples, rejects, counts = launch.settle_or_stop(
        scanned, samples, rejects, args["max_reject"], args["rejects_out"],
        lambda s, r: manifest.reject_over_cap(s, r, model, cfg),
    )  # fmt: skip
    label_root = args["root"] if args["from_samples"] else None  # a scan's paths are still absolute
    samples, weights = repeat.sample_weights(samples, cfg.repeat, lambda p: _read_label(p, label_root))
    if samples.num_rows and args["root"] is not None and not args["from_samples"]:  # re-rooted when read
        samples = paths.relative_to(samples, args["root"])
    write = writer(args["staging"])
    meta = manifest.score_samples(
        samples, rejects, counts, model, cfg, write, weights=weights, part_rows=args["part_rows"]
    )
    yield "scored", meta | {"parts": 0}


def _read_label(path: str, root: str | None) -> bytes:
    """A lidarseg label file; a relative ``path`` resolves under ``root``."""
    return storage.read_bytes(paths.join_root(root, path) if root and paths.is_relative(path) else path)


def _previous_rejects(path: str) -> pa.Table:
    try:
        return storage.read_parquet(storage.join(options.previous_dir(path), schemas.REJECTS_FILE)).cast(
            schemas.reject_schema()
        )
    except OSError:
        return schemas.reject_schema().empty_table()


def _previous(path: str, new_root: str | None, weight_column: str | None) -> tuple[int, pa.Table, pa.Table]:
    """(scanned, samples, rejects) of an earlier scan/build whose samples are at ``path`` (a 3.x directory or a 2.x file), with its
    sample paths re-rooted from the earlier run's ``path_root`` onto ``new_root``; ``weight_column``
    (``--sample-weights``) rides along as ``repeat.WEIGHT_COLUMN``, matched by sample_id. Holds the
    table: for inputs ``_settle_previous`` does not stream."""
    samples = options.read_previous_samples(path)
    samples = paths.relative_to(paths.absolute(samples, options.previous_root(path)), new_root)
    rejects = _previous_rejects(path)
    if weight_column is not None:  # the raw table's row order differs from the sorted samples
        raw = read_parts(samples_files(path), columns=["sample_id", weight_column])
        at = pc.index_in(samples.column("sample_id"), value_set=raw.column("sample_id")).to_numpy()
        values = repeat.column_weights(raw, weight_column)[at.astype(np.int64)]
        samples = samples.append_column(repeat.WEIGHT_COLUMN, pa.array(values, pa.float64()))
    return samples.num_rows + rejects.num_rows, samples, rejects


def settle_previous(path: str, model: CostModel, cfg: PlanConfig, args: dict) -> Iterator[tuple[str, object]]:
    """``--from-samples``: settle and score like ``check_and_score``, streaming the earlier samples
    (``_score_stream``). Inputs not sorted by sample_id, and ``--repeat-factors`` (which reads every
    label file), take the in-memory path."""
    files = samples_files(path)
    roots = (options.previous_root(path), args["root"])
    with open_parts(files) as file:
        column = cfg.repeat.column
        numeric = None if cfg.repeat.threshold is not None else previous.numeric_columns(file, column)
        if numeric is None:
            yield from check_and_score(*_previous(path, args["root"], column), model, cfg, args)
            return
        rejects = _previous_rejects(path)
        scanned = numeric.num_rows + rejects.num_rows
        reroot_rejects = lambda t: previous.reroot(t, roots)  # noqa: E731
        yield from _score_stream(
            file, files, numeric, scanned, rejects, roots, reroot_rejects, model, cfg, args
        )


def settle_scan(
    gathered: dict[str, list], model: CostModel, cfg: PlanConfig, args: dict
) -> Iterator[tuple[str, object]]:
    """The scan's samples parts (scratch, sorted by sample_id across parts), settled and scored like
    ``--from-samples`` (``_score_stream``); with ``--repeat-factors`` in memory."""
    scanned, parts, rejects = scan_results(gathered)
    work = storage.join(args["staging"], launch.WORK_DIR, SCANNED_DIR)
    files = [storage.join(work, schemas.part_name(k)) for k, _, _ in parts]
    with open_parts(files) as file:
        numeric = None if cfg.repeat.threshold is not None else previous.numeric_columns(file)
        if numeric is None:  # no sample, or repeat factors: the in-memory path says what is wrong
            yield from check_and_score(scanned, read_parts(files), rejects, model, cfg, args)
            return
        # a scan's rejects keep full paths, as in the in-memory path
        roots = (None, args["root"])
        yield from _score_stream(file, files, numeric, scanned, rejects, roots, lambda t: t, model, cfg, args)


def _score_stream(
    file, files: list[str], numeric: pa.Table, scanned: int, rejects: pa.Table,
    roots: tuple[str | None, str | None], reroot_rejects: Reroot, model: CostModel, cfg: PlanConfig, args: dict,
) -> Iterator[tuple[str, object]]:  # fmt: skip
    """Settle and score from ``numeric`` (``previous.NUMERIC`` of the rows of ``file``, a
    ``ParquetParts`` of ``files``, sorted unique ids); write rejects.parquet, then yield
    ``("scored", metadata)`` and the tasks that write the samples parts. ``roots``: where the rows'
    paths are stored (None: absolute) and where the new run stores them; ``reroot_rejects``: table
    -> table with over-cap reject paths stored the new run's way."""
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
    tasks = previous.part_tasks(file, files, keep, cost, ids, weight, roots, args["part_rows"])
    digest = previous.fingerprint_kept(file, keep)
    scored = pa.table(
        {"cost": cost, "bucket_id": pa.array(ids, pa.int32()), "num_points": points[keep], "weight": weight}
    )
    write = writer(args["staging"])
    meta = manifest.checked_meta([], rejects, counts, model, cfg, write, scored, edges, digest, weights)
    yield "scored", meta | {"parts": len(tasks)}
    for task in tasks:
        yield "part", task


def written_parts(checked: dict, staging: str) -> list[str]:
    """The samples parts the metadata's ``files`` lists (``parts.listed_parts``), in order, as paths
    in the staging directory."""
    return [storage.join(staging, rel) for rel in listed_parts(f["path"] for f in checked["files"])]


def write_part(task: previous.PartTask, staging: str) -> tuple[int, int, dict]:
    """Write samples part ``task.part`` into the staging directory: ``(k, rows, files entry)``."""
    rel = schemas.samples_part(task.part)
    with storage.open_read(task.path) as f, storage.open_write(storage.join(staging, rel)) as sink:
        out = previous.write_part(parquet_file(f), task, sink)
    Metrics.counter(NAMESPACE, "files_written").inc()
    Metrics.counter(NAMESPACE, "bytes_written").inc(out.bytes)
    return task.part, int(task.keep.sum()), {"path": rel, "bytes": out.bytes, "sha256": out.sha256}


def samples_written(gathered: dict[str, list]) -> dict:
    """``{"scored": [CheckAndScore's metadata], "written": [write_part's results]}`` -> the metadata
    with every part in its ``files`` (and their rows, ``part_rows``), after checking that each part was written once and that they
    hold the accepted samples."""
    (meta,) = gathered["scored"]
    written = sorted(gathered.get("written", []), key=lambda w: w[0])
    want = meta.pop("parts")
    if [k for k, _, _ in written] != list(range(want)):
        raise RuntimeError(f"{len(written)} samples parts were written, not the {want} planned")
    rows = sum(n for _, n, _ in written)
    if want and rows != meta["counts"]["accepted"]:
        raise RuntimeError(
            f"the samples parts hold {rows} samples, not the {meta['counts']['accepted']} accepted"
        )
    meta["files"] = [*(entry for _, _, entry in written), *meta["files"]]
    if want:  # else the in-memory path wrote the parts and their rows
        meta["part_rows"] = [n for _, n, _ in written]  # where each part's rows start, for the plan tasks
    return meta
