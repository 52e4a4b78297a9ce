"""The step timings' file format: schema, file names and the reader (``read_timing_files``).

Written by ``lidarshard.loaders.timing.StepTimer`` (which re-exports these names); read by
``lidarshard calibrate --timings`` and the report. Pure pyarrow/numpy; imports neither Beam nor torch.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lidarshard.schemas.memory_cap import MAX_BYTES
from lidarshard.transforms.io import storage

__all__ = [
    "TIMING_FIELDS",
    "PEAK_FIELD",
    "MAX_PEAK_BYTES",
    "TIMING_SCHEMA",
    "METHODS",
    "timing_file",
    "read_timing_files",
]

#: The recorder's file schema: (name, Arrow type, meaning).
TIMING_FIELDS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("epoch", pa.int32(), "epoch of the plan the step belongs to"),
    ("step", pa.int32(), "step of the epoch (0-based)"),
    ("rank", pa.int32(), "the rank that ran the step"),
    ("world_size", pa.int32(), "ranks in the job"),
    ("compute_s", pa.float64(), "seconds the rank computed on its own, before any wait (see method)"),
    ("wall_s", pa.float64(), "seconds of the whole step, waiting at collectives included"),
    ("sample_ids", pa.list_(pa.string()), "the rank's samples at this step, in batch order"),
    ("device", pa.string(), "'cpu' (host clock) or the accelerator whose events timed it, e.g. 'cuda:0'"),
    ("method", pa.string(), "where compute_s ends: one of METHODS"),
)

#: The one nullable column, written since timings 1.1: the step's peak device memory. Files without it
#: read as all null.
PEAK_FIELD: tuple[str, pa.DataType, str] = (
    "peak_bytes",
    pa.int64(),
    "peak memory allocated on the device during the step (bytes: the device module's max_memory_allocated "
    "after reset_peak_memory_stats at the step's start); null where the device reports none (CPU, given)",
)

#: Arrow schema of a timings file (field docs in the field metadata).
TIMING_SCHEMA = pa.schema(
    [pa.field(n, t, nullable=False, metadata={"doc": d}) for n, t, d in TIMING_FIELDS]
    + [pa.field(PEAK_FIELD[0], PEAK_FIELD[1], nullable=True, metadata={"doc": PEAK_FIELD[2]})],
    metadata={"lidarshard": "timings 1.1"},
)

#: Where ``compute_s`` ends: the first DDP gradient bucket ready, ``mark_compute_done()``, the step's end,
#: or timed elsewhere and given to ``StepTimer.record``.
METHODS = ("ddp_first_bucket", "mark", "step", "given")

#: A timings file name: group 1 the rank, group 2 the part.
PART_PATTERN = re.compile(r"timings-rank-(\d+)-part-(\d+)\.parquet$")


#: The longest step a timings file may record (s; 1e6 s is 11.6 days): beyond, a fit would overflow.
MAX_STEP_S = 1e6
#: The largest peak a timings file may record (1 EiB, ``schemas.memory_cap.MAX_BYTES``; no device has more).
MAX_PEAK_BYTES = MAX_BYTES


def _check_seconds(path: str, table: pa.Table) -> None:
    """Every row's ``0 <= compute_s <= wall_s <= MAX_STEP_S`` and ``peak_bytes`` null or in
    ``0..MAX_PEAK_BYTES`` (what ``StepTimer`` writes); ValueError naming the file and the first row that is not."""
    compute, wall = (table.column(c).to_numpy() for c in ("compute_s", "wall_s"))
    bad = np.flatnonzero(~((compute >= 0) & (compute <= wall) & (wall <= MAX_STEP_S)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{path}: row {i} times compute_s {compute[i]!r}, wall_s {wall[i]!r}; a timings file holds "
            f"0 <= compute_s <= wall_s <= {MAX_STEP_S:g} (not written by lidarshard's StepTimer?)"
        )
    peak = table.column(PEAK_FIELD[0])
    outside = pc.or_(pc.less(peak, 0), pc.greater(peak, MAX_PEAK_BYTES))  # null where no peak
    bad = np.flatnonzero(pc.fill_null(outside, False).to_numpy(zero_copy_only=False))
    if bad.size:
        raise ValueError(
            f"{path}: row {int(bad[0])} records peak_bytes {peak[int(bad[0])].as_py()}; a timings file holds "
            f"0 <= peak_bytes <= {MAX_PEAK_BYTES} (1 EiB; not written by lidarshard's StepTimer?)"
        )


def _check_once_a_part(
    paths: list[str], sizes: list[int], keys: np.ndarray, part: np.ndarray, order: np.ndarray
) -> None:
    """A part records a rank-step once (a restarted run writes the steps it replays into a new part): two
    rows of one (epoch, step, rank) in one part are refused, naming the file. ``order``: rows by key, then
    part (``read_timing_files``' sort)."""
    if order.size < 2:
        return
    ordered = np.column_stack([keys[order], part[order]])
    same = np.flatnonzero((np.diff(ordered, axis=0) == 0).all(axis=1))
    if same.size:
        row = int(order[same[0]])
        path = paths[int(np.searchsorted(np.cumsum(sizes), row, side="right"))]
        e, s, r = (int(v) for v in keys[row])
        raise ValueError(
            f"{path}: epoch {e} step {s} rank {r} is recorded twice in one file (not written by lidarshard's "
            "StepTimer?): record each step once"
        )


def timing_file(directory: str, rank: int, part: int) -> str:
    """Path of rank ``rank``'s ``part``-th timings file in ``directory``."""
    return storage.join(directory, f"timings-rank-{rank:05d}-part-{part:05d}.parquet")


def read_timing_files(path: str) -> pa.Table:
    """Every row of the timings files at ``path`` (a directory of them, or one file), ``TIMING_SCHEMA``.

    A step recorded twice (a restarted run replayed it) keeps the record of the later part. Rows are
    sorted by (epoch, step, rank). A file written before ``peak_bytes`` existed reads with it all null.

    Raises:
        ValueError: no timings file there, or a file without the recorder's columns.
    """
    paths = [path] if not storage.is_dir(path) else storage.glob(storage.join(path, "timings-rank-*.parquet"))
    if not paths:
        raise ValueError(f"{path}: no timings-rank-*.parquet files (written by lidarshard.loaders.timing)")
    tables, order = [], []
    for p in paths:
        t = storage.read_parquet(p)
        missing = sorted({n for n, _, _ in TIMING_FIELDS} - set(t.column_names))
        if missing:
            raise ValueError(f"{p}: not a lidarshard timings file (no {', '.join(missing)})")
        if PEAK_FIELD[0] not in t.column_names:
            t = t.append_column(PEAK_FIELD[0], pa.nulls(t.num_rows, PEAK_FIELD[1]))
        t = t.select(TIMING_SCHEMA.names).cast(TIMING_SCHEMA)
        _check_seconds(p, t)
        tables.append(t)
        m = PART_PATTERN.search(p)
        order.append(int(m.group(2)) if m else 0)
    table = pa.concat_tables(tables)
    part = np.repeat(np.asarray(order, dtype=np.int64), [t.num_rows for t in tables])
    keys = np.stack([table.column(k).to_numpy().astype(np.int64) for k in ("epoch", "step", "rank")], axis=1)
    latest = np.lexsort((-part, keys[:, 2], keys[:, 1], keys[:, 0]))  # by key, the latest part first
    _check_once_a_part(paths, [t.num_rows for t in tables], keys, part, latest)
    first = np.r_[True, (np.diff(keys[latest], axis=0) != 0).any(axis=1)] if len(latest) else latest
    return table.take(pa.array(latest[first]))
