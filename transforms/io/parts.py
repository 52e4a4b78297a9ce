"""The samples as consecutive Parquet parts (``OUT/samples/part-NNNNN.parquet``), read as one file.

Part k holds the k-th run of the rows sorted by sample_id; parts are written in parallel, one task
each. ``ParquetParts`` presents a list of part files as one ``pq.ParquetFile`` (global row-group
numbers), so every reader that streams row groups or reads row ranges works on either shape.
``samples_files`` accepts the 3.x directory or a 2.x single ``samples.parquet``. Pure (storage + pyarrow).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lidarshard import schemas
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import parquet_file

__all__ = [
    "PART_ROWS",
    "ParquetParts",
    "open_parts",
    "part_files",
    "listed_parts",
    "samples_files",
    "read_parts",
    "parts_holding",
]

#: Rows a samples part aims at (``--part-rows``): 16 row groups of ``arrow.ROW_GROUP_ROWS``, ~24 MB
#: with 9 sweeps a sample; one write task each.
PART_ROWS = 1 << 18


@dataclass(frozen=True)
class _Group:
    num_rows: int


class _Metadata:
    """The part of ``pq.FileMetaData`` the readers use, over every part's row groups in order."""

    def __init__(self, groups: list[tuple[int, int, int]]) -> None:
        self._groups = groups  # (part, group in part, rows)
        self.num_row_groups = len(groups)
        self.num_rows = sum(n for _, _, n in groups)

    def row_group(self, g: int) -> _Group:
        return _Group(self._groups[g][2])


class ParquetParts:
    """Parquet files read as one: ``metadata`` (row groups numbered across the files, in order),
    ``schema_arrow``, ``read_row_group``, ``read_row_groups``; ``part_rows`` and ``part_groups``
    give each file's rows and row groups.

    Raises:
        ValueError: the files' schemas differ (one line naming the first that does).
    """

    def __init__(self, files: Sequence[pq.ParquetFile], names: Sequence[str] | None = None) -> None:
        if not files:
            raise ValueError("no samples part to read")
        self._files = list(files)
        self.schema_arrow = self._files[0].schema_arrow
        for i, f in enumerate(self._files[1:], 1):
            if not f.schema_arrow.equals(self.schema_arrow):
                where = names[i] if names else f"part {i}"
                raise ValueError(f"{where}: its columns differ from the first part's")
        groups = [
            (i, g, f.metadata.row_group(g).num_rows)
            for i, f in enumerate(self._files)
            for g in range(f.metadata.num_row_groups)
        ]
        self.metadata = _Metadata(groups)
        self.part_rows = [f.metadata.num_rows for f in self._files]
        self.part_groups = [f.metadata.num_row_groups for f in self._files]
        self._groups = groups

    def read_row_group(
        self, g: int, columns: Sequence[str] | None = None, use_threads: bool = False
    ) -> pa.Table:
        """Row group ``g`` (numbered across the files); always read on the calling thread."""
        part, local, _ = self._groups[g]
        return self._files[part].read_row_group(local, columns=columns, use_threads=False)

    def read_row_groups(
        self, row_groups: Sequence[int], columns: Sequence[str] | None = None, use_threads: bool = False
    ) -> pa.Table:
        """Row groups ``row_groups`` (ascending) as one table."""
        tables = [self.read_row_group(g, columns) for g in row_groups]
        if not tables:
            return self.schema_arrow.empty_table().select(
                list(columns) if columns else self.schema_arrow.names
            )
        return pa.concat_tables(tables)


@contextlib.contextmanager
def open_parts(paths: Sequence[str]) -> Iterator[ParquetParts]:
    """The Parquet files at ``paths`` (in order) opened as one ``ParquetParts``; closed on exit."""
    with contextlib.ExitStack() as stack:
        files = [parquet_file(stack.enter_context(storage.open_read(p))) for p in paths]
        yield ParquetParts(files, paths)


def part_files(samples_dir: str) -> list[str]:
    """The part files of a samples directory, in order.

    Raises:
        ValueError: a file that is not ``part-NNNNN.parquet``, a gap in the numbering, or no part
            (one line naming it: the directory is the contract, nothing else may live there).
    """
    listed = storage.list_files(samples_dir)
    found: dict[int, str] = {}
    for rel in sorted(listed):
        k = schemas.part_index(rel)
        if k is None:
            raise ValueError(f"{storage.join(samples_dir, rel)} is not a samples part (part-NNNNN.parquet)")
        found[k] = storage.join(samples_dir, rel)
    if not found:
        raise ValueError(f"{samples_dir} holds no samples part")
    return _consecutive(
        found, lambda k: f"{samples_dir} lacks {schemas.part_name(k)} (parts must be numbered from 0)"
    )


def listed_parts(rels: Iterable[str]) -> list[str]:
    """The samples parts among the relative paths ``rels`` (a manifest's ``files``), in order.

    Raises:
        ValueError: a misnamed file under ``samples/``, no part, or a gap in the numbering (one line).
    """
    found: dict[int, str] = {}
    for rel in rels:
        if rel.startswith(schemas.SAMPLES_DIR + "/"):
            k = schemas.part_index(rel.removeprefix(schemas.SAMPLES_DIR + "/"))
            if k is None or schemas.samples_part(k) != rel:
                raise ValueError(f"{rel} is not a samples part (samples/part-NNNNN.parquet)")
            found[k] = rel
    return _consecutive(
        found, lambda k: f"{schemas.samples_part(k)} is missing: samples parts are numbered from 0"
    )


def _consecutive(found: dict[int, str], missing: Callable[[int], str]) -> list[str]:
    """The values of ``found`` in key order when its keys are 0..n-1 (n >= 1).

    Raises:
        ValueError: ``missing(k)`` for the first absent key ``k``.
    """
    k = next(k for k in range(len(found) + 1) if k not in found)
    if k < len(found) or not found:
        raise ValueError(missing(k))
    return [found[i] for i in range(len(found))]


def samples_files(path: str) -> list[str]:
    """The files of the samples at ``path``: a samples directory (schema 3) -> its parts in order; a
    single samples.parquet (schema 2) -> ``[path]``.

    Raises:
        ValueError: ``path`` is a whole output directory (naming its samples directory), or as ``part_files``.
    """
    if not storage.is_dir(path):
        return [path]
    inner = storage.join(path, schemas.SAMPLES_DIR)
    if storage.is_dir(inner):
        raise ValueError(f"{path} is an output directory: pass its samples, {inner}")
    return part_files(path)


def read_parts(paths: Sequence[str], columns: Sequence[str] | None = None) -> pa.Table:
    """The rows of the files at ``paths``, concatenated in order (``columns``: a subset)."""
    tables = [storage.read_parquet(p, columns) for p in paths]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def parts_holding(paths: Sequence[str], rows: Sequence[int], start: int, stop: int) -> tuple[list[str], int]:
    """The parts among ``paths`` (``rows`` rows each) that hold rows [start, stop) of their
    concatenation, and the row of the concatenation their first row is: a task reading a row range
    opens only those (not every part: that would be O(parts) per task on an object store)."""
    bounds = np.cumsum([0, *rows])
    lo = int(np.searchsorted(bounds, start, side="right")) - 1
    hi = max(lo + 1, int(np.searchsorted(bounds, stop, side="left")))
    return list(paths[lo:hi]), int(bounds[lo])
