"""Arrow table helpers shared by the pipeline and the loaders: rows -> tables, deterministic bytes."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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
    "release_memory",
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
    Arrow sorts). Memory: up to two tables per stream.

    Works a round at a time: every row up to the smallest last buffered key of the streams not yet
    read to their end is final, so a round takes those rows from every stream (a binary search
    each), sorts them together and emits them; then each stream holding less than a table reads its
    next one. With keys spread evenly over the streams (hash shards), a round emits about a table's
    worth of rows per stream; once every stream is read to its end, one round takes the rest.
    """
    heads = [h for h in (_Head(it, key) for it in sources) if h.table.num_rows]
    while heads:
        bound = min((h.keys[-1] for h in heads if not h.done), default=None)
        ready = [h for h in heads if bound is None or h.keys[0] <= bound]  # the others give nothing
        taken = [t for t in (h.take_through(bound) for h in ready) if t.num_rows]
        heads = [h for h in heads if h.table.num_rows]
        table = pa.concat_tables(taken).combine_chunks()  # one take over whole arrays is faster
        yield table.take(pc.sort_indices(table.column(key)))


class _Head:
    """The rows of a stream read but not yet merged, their keys (Python str: they compare as UTF-8
    bytes do) and the stream; keeps at least a table's worth buffered while the stream lasts."""

    def __init__(self, it: Iterator[pa.Table], key: str) -> None:
        self._it, self._key, self._want, self.done = it, key, 1, False
        self.keys = np.empty(0, dtype=object)
        self.table: pa.Table = self._refill(None)

    def _refill(self, table: pa.Table | None) -> pa.Table:
        """``table`` (None: nothing buffered yet) topped up from the stream; ``keys`` follows."""
        while table is None or table.num_rows < self._want:
            more = next(self._it, None)
            if more is None:
                self.done = True
                break
            if not more.num_rows:
                continue
            self._want = max(self._want, more.num_rows)
            keys = more.column(self._key).to_numpy(zero_copy_only=False)
            table = more if table is None else pa.concat_tables([table, more])
            self.keys = np.concatenate([self.keys, keys])
        return pa.table({self._key: pa.array([], pa.string())}) if table is None else table

    def take_through(self, bound: str | None) -> pa.Table:
        """The buffered rows with keys <= ``bound`` (None: all), removed from the buffer (then refilled)."""
        stop = len(self.keys) if bound is None else int(np.searchsorted(self.keys, bound, side="right"))
        rows, rest, self.keys = self.table.slice(0, stop), self.table.slice(stop), self.keys[stop:]
        self.table = self._refill(rest)
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
    # read on the calling thread: Arrow's I/O pool must not hold the Python bytes (tests/test_exit.py)
    return parquet_file(pa.BufferReader(data)).read(columns=cols, use_threads=False)


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


def release_memory(heap: bool = True) -> None:
    """Hand memory freed by a step back to the OS: Arrow's pool and (``heap``) glibc's heap keep freed
    pages otherwise, so a long-lived process (a Beam worker, the validator) keeps the peak of every step
    it ran (at 3M samples ~0.3 GB of the validator's RSS after reading the samples). Arrow's pool takes
    ~10 us; glibc's ``malloc_trim`` walks the heap (~2-4 ms with validate's heap)."""
    pa.default_memory_pool().release_unused()
    if heap and _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()
