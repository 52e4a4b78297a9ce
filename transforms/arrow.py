"""Arrow table helpers shared by the pipeline and the loaders: rows -> tables, deterministic bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["rows_to_table", "concat_sorted", "parquet_bytes", "parquet_table", "sha256_hex"]

#: Fixed writer settings: the same table always gives the same bytes.
_PARQUET_OPTIONS = {"compression": "zstd", "row_group_size": 1 << 16, "use_dictionary": True}


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


def parquet_bytes(table: pa.Table) -> bytes:
    """Serialize ``table`` to Parquet with fixed settings (byte-identical for equal tables)."""
    sink = pa.BufferOutputStream()
    step = _PARQUET_OPTIONS["row_group_size"]
    options = {k: v for k, v in _PARQUET_OPTIONS.items() if k != "row_group_size"}
    with pq.ParquetWriter(sink, table.schema, **options) as writer:
        # One row group at a time: the same bytes as write_table(combine_chunks()) without a
        # second copy of the whole table in memory.
        for start in range(0, max(table.num_rows, 1), step):
            writer.write_table(table.slice(start, step).combine_chunks(), row_group_size=step)
    return sink.getvalue().to_pybytes()


def parquet_table(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """The table in Parquet file bytes (``columns``: a subset, in that order); the inverse of ``parquet_bytes``."""
    return pq.read_table(pa.BufferReader(data), columns=list(columns) if columns is not None else None)


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()
