"""The samples to score (an earlier run's, ``build --from-samples``, or the scan's parts) read a
row group at a time. Pure.

Settling and scoring need only a few numeric columns (``NUMERIC``, 32 bytes a sample); the paths,
sweep paths and sweep transforms (~1-2 KB a sample with 9 sweeps) are streamed once, from the input
row groups into the new samples parts, one task a part (``part_spans``, ``write_part``). No step
holds them all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.features.accounting import fingerprint_update, first_not_increasing, repeats
from lidarshard.transforms.io import paths
from lidarshard.transforms.io.arrow import ParquetStream, row_groups
from lidarshard.transforms.io.scratch import read_columns, write_columns

__all__ = [
    "NUMERIC",
    "PartTask",
    "repeated_ids",
    "numeric_schema",
    "numeric_groups",
    "paths_at",
    "PartSpan",
    "part_spans",
    "parked",
    "park_keep",
    "park_scores",
    "unpark",
    "reroot",
    "write_part",
    "fingerprint_kept",
]

#: The sample columns settling (fingerprint, caps) and scoring (cost models) read.
NUMERIC = ["file_bytes", "num_points", "num_in_range", "occupied_voxels"]


def repeated_ids(file: pq.ParquetFile, *, ordered: bool = False) -> NDArray[np.bool_] | None:
    """(N,) which rows repeat the sample_id of the row before them, reading only the ids a row group
    at a time; None when the ids are not sorted: they must be strictly increasing, or, when
    ``ordered`` (rows sorted by ``accounting.DEDUPE_ORDER``), non-decreasing.

    Raises:
        ValueError: a null sample_id (one line).
    """
    groups, last = [], None
    for t in row_groups(file, ["sample_id"]):
        ids = t.column("sample_id")
        if ids.null_count:
            raise ValueError(f"{ids.null_count} rows have a null sample_id")
        same = np.zeros(t.num_rows, dtype=bool)
        if t.num_rows:
            ids = ids.combine_chunks()
            if first_not_increasing(ids, last) is not None:
                if not ordered:
                    return None
                same = repeats(ids, last)
                if first_not_increasing(ids.filter(pa.array(~same)), last) is not None:
                    return None
            last = ids[-1].as_py()
        groups.append(same)
    return np.concatenate(groups) if groups else np.zeros(0, dtype=bool)


def numeric_schema(file: pq.ParquetFile, extras: Sequence[str] = ()) -> pa.Schema:
    """The schema of ``numeric_groups``' tables: ``NUMERIC`` (schema types), then ``extras`` (as stored).

    Raises:
        KeyError: an extra column the file does not have.
    """
    want = [schemas.sample_schema().field(n) for n in NUMERIC]
    extra = [n for n in dict.fromkeys(extras) if n not in NUMERIC]
    return pa.schema([*want, *(file.schema_arrow.field(n) for n in extra)])


def numeric_groups(file: pq.ParquetFile, extras: Sequence[str] = ()) -> Iterator[pa.Table]:
    """``NUMERIC`` (schema types) and the columns ``extras`` (as stored) of every row, one row group at a
    time (tables of ``numeric_schema``)."""
    schema = numeric_schema(file, extras)
    want = pa.schema(list(schema)[: len(NUMERIC)])
    for t in row_groups(file, schema.names):
        numeric = t.select(NUMERIC).cast(want)
        yield pa.Table.from_arrays(
            [(numeric if f.name in NUMERIC else t).column(f.name) for f in schema], schema=schema
        )


def paths_at(file: pq.ParquetFile, rows: NDArray[np.int64], column: str = "path") -> list:
    """``column`` (default the ``path``) of the rows ``rows`` (sorted), reading only the row groups
    that hold them."""
    out: list[str] = []
    first = 0
    for g in range(file.metadata.num_row_groups):
        n = file.metadata.row_group(g).num_rows
        inside = rows[(rows >= first) & (rows < first + n)] - first
        if inside.size:
            col = file.read_row_group(g, columns=[column], use_threads=False).column(column)
            out += col.take(pa.array(inside)).to_pylist()
        first += n
    return out


@dataclass(frozen=True)
class PartTask:
    """One samples part to write (one task each, in parallel): the ``keep`` rows of input file
    ``path``'s row groups ``[groups[0], groups[1])``, with their ``cost``, ``bucket_id`` and ``weight``
    (one per kept row). Paths are re-rooted from ``roots[0]`` (None: already absolute) onto
    ``roots[1]`` (None: kept absolute)."""

    part: int
    path: str
    groups: tuple[int, int]
    keep: NDArray[np.bool_]
    cost: NDArray[np.float64]
    bucket_id: NDArray[np.int32]
    weight: NDArray[np.float64]
    roots: tuple[str | None, str | None]


@dataclass(frozen=True)
class PartSpan:
    """The input rows one samples part may take: file ``path``'s row groups ``groups`` (numbered in
    the file), row groups ``first_group`` on across all files, rows ``[rows[0], rows[1])`` across all."""

    path: str
    groups: tuple[int, int]
    first_group: int
    rows: tuple[int, int]


def part_spans(file, paths: list[str], part_rows: int) -> Iterator[PartSpan]:
    """Cut ``file`` (a ``ParquetParts`` of the files at ``paths``) into the spans of its parts: a new
    span at every input file and after every ``part_rows`` input rows (whole row groups)."""
    row = base = 0
    for path, groups in zip(paths, file.part_groups, strict=True):
        first, taken = 0, 0
        for g in range(groups):
            taken += file.metadata.row_group(base + g).num_rows
            if taken < part_rows and g < groups - 1:
                continue
            yield PartSpan(path, (first, g + 1), base + first, (row, row + taken))
            row, first, taken = row + taken, g + 1, 0
        base += groups


def reroot(table: pa.Table, roots: tuple[str | None, str | None]) -> pa.Table:
    """``table``'s paths, stored under ``roots[0]`` (None: absolute), re-stored under ``roots[1]``."""
    return paths.relative_to(paths.absolute(table, roots[0]), roots[1])


def parked(task: PartTask) -> PartTask:
    """``task`` with its arrays left empty: they are in its scratch files (``park_keep``,
    ``park_scores``); what a shuffle carries of it is its few numbers. ``unpark`` reads them back."""
    none = np.empty(0)
    return replace(task, keep=none.astype(bool), cost=none, bucket_id=none.astype(np.int32), weight=none)


def park_keep(path: str, keep: NDArray[np.bool_]) -> None:
    """Write a part's (rows,) ``keep`` mask to the scratch file ``path`` + ``.keep``."""
    write_columns(f"{path}.keep", {"keep": keep})


def park_scores(
    path: str, cost: NDArray[np.float64], bucket_id: NDArray[np.int32], weight: NDArray[np.float64]
) -> None:
    """Write a part's (kept,) scores to the scratch file ``path`` + ``.scores``."""
    write_columns(f"{path}.scores", {"cost": cost, "bucket_id": bucket_id, "weight": weight})


def unpark(task: PartTask, path: str) -> PartTask:
    """``task`` (``parked``) with the arrays read back from its scratch files."""
    scores = read_columns(f"{path}.scores")
    keep = read_columns(f"{path}.keep")["keep"]
    return replace(
        task, keep=keep, cost=scores["cost"], bucket_id=scores["bucket_id"], weight=scores["weight"]
    )


def write_part(file: pq.ParquetFile, task: PartTask, sink) -> ParquetStream:
    """Write ``task``'s rows of ``file`` (its input file) with their scores as a samples part of
    ``scored_schema()`` to the binary stream ``sink``, a row group at a time.

    Returns:
        the closed ``ParquetStream`` (``bytes``, ``sha256``).
    """
    want, scored = schemas.sample_schema(), schemas.scored_schema()
    names = [n for n in want.names if n in file.schema_arrow.names]  # an earlier 3.x lacks later fields
    first = done = 0
    with ParquetStream(sink, scored) as out:
        for g in range(*task.groups):
            t = file.read_row_group(g, columns=names, use_threads=False)
            for f in want:  # not recorded by the earlier run: null
                if f.name not in names:
                    t = t.append_column(f, pa.nulls(t.num_rows, f.type))
            t = t.select(want.names).cast(want)
            mask = task.keep[first : first + t.num_rows]
            first += t.num_rows
            t = reroot(t if mask.all() else t.filter(pa.array(mask)), task.roots)
            n = t.num_rows
            for name, values in (("cost", task.cost), ("bucket_id", task.bucket_id), ("weight", task.weight)):
                field = scored.field(name)
                t = t.append_column(field, pa.array(values[done : done + n], field.type))
            out.write(t.cast(scored))
            done += n
    return out


def fingerprint_kept(file, keep: NDArray[np.bool_] | None = None) -> str:
    """The inputs fingerprint (``accounting.fingerprint``) of ``file``'s rows, or only of those
    ``keep`` marks; reads two columns a row group at a time."""
    h, first = hashlib.sha256(), 0
    for t in row_groups(file, ["sample_id", "file_bytes"]):
        n = t.num_rows
        if keep is not None and not keep[first : first + n].all():
            t = t.filter(pa.array(keep[first : first + n]))
        fingerprint_update(h, t)
        first += n
    return h.hexdigest()
