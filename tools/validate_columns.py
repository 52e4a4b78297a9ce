"""The samples' numeric columns for ``lidarshard validate``, parked on local disk instead of held: what is
resident is one chunk (``CHUNK_ROWS`` samples) or one step group's rows, never N.

    while the samples stream:  each row group's columns appended in row order (``add``), one raw file
                               a column
    whole-sample checks:       ``chunks`` reads them back ``CHUNK_ROWS`` rows at a time
    an epoch of G groups:      ``deal`` splits them, a chunk at a time, by the step group of each row
                               (the caller's labels: the build's ``groups.deal``) into one set of files
                               a group, with each row's index (``row``)
    a group's checks:          ``group`` reads its rows back (ascending ``row``)

A column that holds a null (``num_points`` of costs given through ``write_manifest``) gets a validity
file beside its values from its first null on: it reads back with the same nulls. Files live in a
directory the caller gives (validate's temporary one, never inside the output checked), which the caller
removes. Pure numpy/pyarrow.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard.tools.validate_keys import append_raw, append_split, load_raw

__all__ = ["CHUNK_ROWS", "ParkedColumns"]

#: Rows read back at a time by ``chunks`` and dealt at a time by ``deal``.
CHUNK_ROWS = 1 << 20


class ParkedColumns:
    """The columns of ``schema`` (numeric) of the samples, in row order on disk in the new directory
    ``dir``."""

    def __init__(self, schema: pa.Schema, dir: str) -> None:
        self.schema = schema
        self.column_names: list[str] = list(schema.names)
        self._dtypes = {f.name: pa.array([], f.type).to_numpy(zero_copy_only=False).dtype for f in schema}
        self.dir = dir
        os.makedirs(dir)
        self.num_rows = 0
        self._masked: set[str] = set()  # the columns with a validity file
        self.dealt: object = None  # the tag of the deal the group files hold

    def _path(self, name: str, group: int | None = None) -> str:
        if group is None:
            return os.path.join(self.dir, f"{name}.bin")
        return os.path.join(self.dir, "dealt", f"group-{group:05d}-{name}.bin")

    def add(self, t: pa.Table) -> None:
        """Park the next ``t.num_rows`` samples' columns (one row group, in row order; ``t`` holds every
        column of the schema)."""
        for name, dtype in self._dtypes.items():
            col = t.column(name)
            if col.null_count and name not in self._masked:
                self._masked.add(name)
                append_raw(self._path(f"{name}.valid"), np.ones(self.num_rows, np.bool_))
            if name in self._masked:
                append_raw(self._path(f"{name}.valid"), np.asarray(col.is_valid(), np.bool_))
            if col.null_count:
                col = pc.fill_null(col, np.nan if dtype.kind == "f" else 0)
            append_raw(self._path(name), np.asarray(col.to_numpy(), dtype))
        self.num_rows += t.num_rows

    def _files(self, names: Sequence[str]) -> dict[str, np.dtype]:
        """{file: dtype} of the columns ``names``: their values and, for those with nulls, validity."""
        out = {n: self._dtypes[n] for n in names}
        return out | {f"{n}.valid": np.dtype(np.bool_) for n in names if n in self._masked}

    def _table(self, raw: dict[str, NDArray], names: Sequence[str]) -> pa.Table:
        """The columns ``names`` of ``raw`` ({file: values}, ``_files``) as Arrow, with their nulls."""
        fields = [self.schema.field(n) for n in names]
        valid = [raw.get(f"{n}.valid") for n in names]
        cols = [
            pa.array(raw[f.name], f.type, mask=None if v is None else ~v)
            for f, v in zip(fields, valid, strict=True)
        ]
        return pa.table(cols, schema=pa.schema(fields))

    def _raw(self, names: Sequence[str], start: int, count: int) -> dict[str, NDArray]:
        return {k: load_raw(self._path(k), dtype, start, count) for k, dtype in self._files(names).items()}

    def chunks(
        self, names: Sequence[str] | None = None, rows: int | None = None
    ) -> Iterator[tuple[int, pa.Table]]:
        """(first row, the columns ``names`` (None: all) of ``rows`` samples from it (None: ``CHUNK_ROWS``,
        the module's, read now: tests set it)), in row order."""
        names = self.column_names if names is None else list(names)
        rows = CHUNK_ROWS if rows is None else rows
        for a in range(0, self.num_rows, rows):
            yield a, self._table(self._raw(names, a, min(rows, self.num_rows - a)), names)

    def table(self, names: Sequence[str] | None = None) -> pa.Table:
        """Every sample's columns ``names`` (None: all), held whole: one step group of every sample."""
        names = self.column_names if names is None else list(names)
        return self._table(self._raw(names, 0, self.num_rows), names)

    def deal(self, labels: Callable[[int, int], NDArray[np.integer]], groups: int, tag: object) -> None:
        """Split the columns into ``groups`` sets of files, ``labels(start, count)`` (count,) being the group
        of each of those rows (``CHUNK_ROWS`` at a time); ``tag`` names the deal: dealing again with the
        same tag does nothing, another replaces the files."""
        if self.dealt == tag:
            return
        shutil.rmtree(os.path.join(self.dir, "dealt"), ignore_errors=True)
        os.makedirs(os.path.join(self.dir, "dealt"))
        self.dealt = None
        for a in range(0, self.num_rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, self.num_rows - a)
            raw = self._raw(self.column_names, a, n) | {"row": np.arange(a, a + n, dtype=np.int64)}
            append_split(np.asarray(labels(a, n)), groups, raw, lambda g, name: self._path(name, g))
            del raw
        self.dealt = tag

    def group(self, g: int) -> pa.Table:
        """Group ``g`` of the last ``deal``: its samples' columns and ``row`` (n_g,), ascending."""
        if self.dealt is None:
            raise RuntimeError("no deal: ParkedColumns.group needs deal first")
        files = self._files(self.column_names)
        raw = {k: load_raw(self._path(k, g), dtype) for k, dtype in files.items()}
        rows = pa.array(load_raw(self._path("row", g), np.dtype(np.int64)))
        return self._table(raw, self.column_names).append_column(pa.field("row", pa.int64()), rows)
