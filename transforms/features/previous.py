"""An earlier run's samples.parquet (``build --from-samples``) read a row group at a time. Pure.

Settling and scoring need only a few numeric columns (``NUMERIC``, 32 bytes a sample); the paths,
sweep paths and sweep transforms (~1-2 KB a sample with 9 sweeps) are streamed once, from the input
row groups into the new samples.parquet (``rewrite_scored``). No step holds them all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.arrow import ParquetStream, row_groups
from lidarshard.transforms.features.accounting import fingerprint_update, first_not_increasing

__all__ = ["NUMERIC", "numeric_columns", "paths_at", "rewrite_scored"]

#: The sample columns settling (fingerprint, caps) and scoring (cost models) read.
NUMERIC = ["file_bytes", "num_points", "num_in_range", "occupied_voxels"]


def numeric_columns(file: pq.ParquetFile, extra: str | None = None) -> pa.Table | None:
    """``NUMERIC`` (schema types) and the column ``extra`` (as stored) of every row, or None when the
    sample ids are not strictly increasing (then the caller sorts and dedupes the whole table).
    Reads one row group at a time.

    Raises:
        ValueError: a null sample_id (one line).
    """
    want = schemas.sample_schema()
    parts, last = [], None
    names = list(dict.fromkeys(["sample_id", *NUMERIC, *([extra] if extra else [])]))
    for t in row_groups(file, names):
        ids = t.column("sample_id")
        if ids.null_count:
            raise ValueError(f"{ids.null_count} rows have a null sample_id")
        if t.num_rows:
            ids = ids.combine_chunks()
            if first_not_increasing(ids, last) is not None:
                return None
            last = ids[-1].as_py()
        numeric = t.select(NUMERIC).cast(pa.schema([want.field(n) for n in NUMERIC]))
        if extra and extra not in NUMERIC:
            numeric = numeric.append_column(extra, t.column(extra))
        parts.append(numeric)
    if not parts:  # no rows: the caller's in-memory path says so
        return None
    return pa.concat_tables(parts).combine_chunks()


def paths_at(file: pq.ParquetFile, rows: NDArray[np.int64]) -> list[str]:
    """The ``path`` of the rows ``rows`` (sorted), reading only the row groups that hold them."""
    out: list[str] = []
    first = 0
    for g in range(file.metadata.num_row_groups):
        n = file.metadata.row_group(g).num_rows
        inside = rows[(rows >= first) & (rows < first + n)] - first
        if inside.size:
            col = file.read_row_group(g, columns=["path"], use_threads=False).column("path")
            out += col.take(pa.array(inside)).to_pylist()
        first += n
    return out


def rewrite_scored(
    file: pq.ParquetFile,
    keep: NDArray[np.bool_],
    cost: NDArray[np.float64],
    bucket_id: NDArray[np.int32],
    weight: NDArray[np.float64],
    reroot: Callable[[pa.Table], pa.Table],
    sink,
) -> tuple[str, ParquetStream]:
    """Write the kept rows of ``file`` with their ``cost``, ``bucket_id`` and ``weight`` (one per kept row) as a
    samples.parquet of ``scored_schema()`` to the binary stream ``sink``, a row group at a time.

    Args:
        reroot: table -> table with its paths stored the new run's way (``paths.absolute`` then
            ``paths.relative_to``).

    Returns:
        (the inputs fingerprint of the kept rows, the closed ``ParquetStream``: ``bytes``, ``sha256``).
    """
    names = schemas.sample_schema().names
    scored = schemas.scored_schema()
    h, first, done = hashlib.sha256(), 0, 0
    with ParquetStream(sink, scored) as out:
        for t in row_groups(file, names):  # (iter_batches reads ahead: more memory)
            t = t.select(names).cast(schemas.sample_schema())
            mask = keep[first : first + t.num_rows]
            first += t.num_rows
            t = reroot(t if mask.all() else t.filter(pa.array(mask)))
            fingerprint_update(h, t)
            n = t.num_rows
            t = t.append_column(scored.field("cost"), pa.array(cost[done : done + n], pa.float64()))
            t = t.append_column(scored.field("bucket_id"), pa.array(bucket_id[done : done + n], pa.int32()))
            t = t.append_column(scored.field("weight"), pa.array(weight[done : done + n], pa.float64()))
            out.write(t.cast(scored))
            done += n
    return h.hexdigest(), out
