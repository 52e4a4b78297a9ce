"""Arrow table helpers shared by the pipeline and the loaders: rows -> tables, deterministic bytes."""

from __future__ import annotations

import contextlib
import hashlib
import heapq
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "ROW_GROUP_ROWS",
    "rows_to_table",
    "concat_sorted",
    "merge_sorted",
    "row_groups",
    "parquet_bytes",
    "ParquetStream",
    "parquet_table",
    "read_rows",
    "parquet_file",
    "sha256_hex",
]

#: Rows per Parquet row group (the last one of a file may be shorter).
ROW_GROUP_ROWS = 1 << 14
#: Fixed writer settings: the same table always gives the same bytes.
_PARQUET_OPTIONS = {"compression": "zstd", "use_dictionary": True}


def rows_to_table(rows: Sequence[dict], schema: pa.Schema) -> pa.Table:
    """Rows (dicts keyed by field name; missing keys become null) to a table of ``schema``."""
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.Table.from_pydict(cols, schema=schema)


def concat_sorted(tables: Iterable[pa.Table], schema: pa.Schema, keys: Sequence[str]) -> pa.Table:
    """Concatenate ``tables`` and sort by ``keys`` (ascending): the result is independent of the
    order and chunking of the inputs as long as ``keys`` identify rows."""
    parts = [t for t in tables if t.num_rows]
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    table = table.sort_by([(k, "ascending") for k in keys])
    return table.combine_chunks()


def merge_sorted(sources: Sequence[Iterator[pa.Table]], key: str) -> Iterator[pa.Table]:
    """Merge streams of tables, each sorted by the string column ``key`` over the whole stream and
    holding keys no other stream holds, into one stream sorted by ``key`` (UTF-8 byte order, as
    Arrow sorts). Memory: one table per stream.

    Works a round at a time: every row up to the smallest of the streams' current last keys is
    final; a round takes those rows (binary search per stream that holds any), sorts them together
    and emits them, and at least one stream moves on to its next table. Two heaps (current first and
    last key per stream) keep a round's cost to the streams it takes rows from.
    """
    heads = [_Head(it, key) for it in sources]
    lasts = [(h.keys[-1], i, h.loads) for i, h in enumerate(heads) if h.table is not None]
    firsts = [(h.keys[0], i) for i, h in enumerate(heads) if h.table is not None]
    heapq.heapify(lasts)
    heapq.heapify(firsts)
    while lasts:
        bound, i, loads = lasts[0]
        if heads[i].table is None or loads != heads[i].loads:  # stale: that stream has moved on
            heapq.heappop(lasts)
            continue
        taken = []
        while firsts and firsts[0][0] <= bound:
            _, j = heapq.heappop(firsts)
            head = heads[j]
            taken.append(head.take_through(bound))
            if head.table is None:
                continue
            heapq.heappush(firsts, (head.keys[head.pos], j))
            if head.pos == 0:  # a new table: its last key joins the heap
                heapq.heappush(lasts, (head.keys[-1], j, head.loads))
        yield pa.concat_tables(taken).sort_by([(key, "ascending")])


class _Head:
    """A stream's current table, its keys (Python str: compares as UTF-8 bytes do) and read position."""

    def __init__(self, it: Iterator[pa.Table], key: str) -> None:
        self._it, self._key, self.loads = it, key, 0
        self.table: pa.Table | None = None
        self._load()

    def _load(self) -> None:
        self.table, self.pos = None, 0
        for table in self._it:
            if table.num_rows:
                self.table, self.loads = table, self.loads + 1
                self.keys = table.column(self._key).to_numpy(zero_copy_only=False)
                return

    def take_through(self, bound: str) -> pa.Table:
        """The rows from the position on with keys <= ``bound`` (at least one); loads the next table
        when this one is used up."""
        stop = int(np.searchsorted(self.keys, bound, side="right"))
        rows = self.table.slice(self.pos, stop - self.pos)
        self.pos = stop
        if stop == len(self.keys):
            self._load()
        return rows


def row_groups(file: pq.ParquetFile, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """``file``'s row groups, one table at a time (read on the calling thread)."""
    cols = list(columns) if columns is not None else None
    for g in range(file.metadata.num_row_groups):
        yield file.read_row_group(g, columns=cols, use_threads=False)


def parquet_bytes(table: pa.Table) -> bytes:
    """Serialize ``table`` to Parquet with fixed settings (byte-identical for equal tables)."""
    sink = pa.BufferOutputStream()
    with ParquetStream(sink, table.schema) as out:
        out.write(table)
    return sink.getvalue().to_pybytes()


class _Hashing:
    """A write-only binary stream that hashes and counts what passes through to ``sink``."""

    def __init__(self, sink) -> None:
        self._sink, self.sha, self.bytes = sink, hashlib.sha256(), 0
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.bytes += view.nbytes
        self._sink.write(view)
        return view.nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class ParquetStream:
    """Tables appended one after another become the Parquet file ``parquet_bytes`` would write for
    their concatenation (same bytes), written to the binary stream ``sink`` one row group at a time:
    memory is one row group, whatever the file's size. ``bytes`` and ``sha256`` (hex) are set on close.
    """

    def __init__(self, sink, schema: pa.Schema) -> None:
        self._out = _Hashing(sink)
        self._writer = pq.ParquetWriter(self._out, schema, **_PARQUET_OPTIONS)
        self._pending: list[pa.Table] = []
        self._rows = self._written = 0
        self.bytes, self.sha256 = 0, ""

    def write(self, table: pa.Table) -> None:
        """Append ``table``'s rows."""
        if table.num_rows:
            self._pending.append(table)
            self._rows += table.num_rows
        while self._rows >= ROW_GROUP_ROWS:
            self._flush(ROW_GROUP_ROWS)

    def _flush(self, rows: int) -> None:
        table = pa.concat_tables(self._pending) if self._pending else self._writer.schema.empty_table()
        self._writer.write_table(table.slice(0, rows).combine_chunks(), row_group_size=ROW_GROUP_ROWS)
        rest = table.slice(rows)
        self._pending, self._rows = ([rest] if rest.num_rows else []), self._rows - rows
        self._written += rows

    def close(self) -> None:
        if self._rows or not self._written:  # an empty file still holds one (empty) row group
            self._flush(self._rows)
        self._writer.close()
        self.bytes, self.sha256 = self._out.bytes, self._out.sha.hexdigest()

    def __enter__(self) -> ParquetStream:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.close()
        else:  # the sink is abandoned: close the writer now, not when collected (its sink may be closed)
            with contextlib.suppress(Exception):
                self._writer.close()


def parquet_table(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """The table in Parquet file bytes (``columns``: a subset, in that order); the inverse of ``parquet_bytes``."""
    cols = list(columns) if columns is not None else None
    return pq.read_table(pa.BufferReader(data), columns=cols, use_threads=False, pre_buffer=False)


def parquet_file(source) -> pq.ParquetFile:
    """``source`` (a path or binary stream) as a ParquetFile read on the calling thread only: no
    pre-buffering, and every read here passes ``use_threads=False``. Arrow's reader threads still
    alive at interpreter exit abort the process ("terminate called without an active exception",
    apache/arrow#34314), which hit ``validate`` subprocesses under load."""
    return pq.ParquetFile(source, pre_buffer=False)


def read_rows(file: pq.ParquetFile, start: int, stop: int, columns: Sequence[str] | None = None) -> pa.Table:
    """Rows [start, stop) of a Parquet file, reading only the row groups that hold them."""
    meta, first, groups = file.metadata, 0, []
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if first < stop and first + n > start:
            groups.append((g, first))
        first += n
    if not groups:
        return file.schema_arrow.empty_table().select(
            list(columns) if columns is not None else file.schema_arrow.names
        )
    table = file.read_row_groups(
        use_threads=False,
        row_groups=[g for g, _ in groups],
        columns=list(columns) if columns is not None else None,
    )
    return table.slice(start - groups[0][1], stop - start)


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()
