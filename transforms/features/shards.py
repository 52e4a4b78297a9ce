"""The scan's rows in hash shards: no step holds them all. Pure pyarrow.

Every feature row goes to shard ``shard_of(sample_id)`` (64-bit BLAKE2b of the id, so duplicates of
an id meet in one shard). A shard is sorted and deduplicated on its own (``settle_shard``) and
written as a scratch Parquet file of small row groups (``shard_bytes``); ``merge_shards`` then
streams all shard files, merged by sample_id, into one sorted table stream, holding one row group
per shard. The result does not depend on the shard count or on the order rows arrived in.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from lidarshard import schemas
from lidarshard.transforms.arrow import ParquetStream, merge_sorted, parquet_file, row_groups, rows_to_table
from lidarshard.transforms.features.accounting import dedupe, fingerprint_update

__all__ = [
    "SCAN_SHARDS",
    "SHARD_GROUP_ROWS",
    "shard_of",
    "settle_shard",
    "shard_bytes",
    "merge_shards",
    "write_merged",
]

#: Hash shards of the scan's rows: one task each (~40k samples at 10M), one open file each in the merge.
SCAN_SHARDS = 256
#: Rows per row group of a shard file. The merge buffers one to two groups per shard and emits about
#: one per shard a round (256 x 128 rows x ~2.2 KB a 9-sweep row: ~72 MB of Arrow data); measured
#: peak RSS ~1 GiB at 1M rows, flat in N (``benchmarks/merge_bench.py``).
SHARD_GROUP_ROWS = 128
#: Sort keys of a shard: the id, then columns that tell apart two inputs claiming one id, so the row
#: ``dedupe`` keeps does not depend on arrival order.
ORDER = ("sample_id", "path", "format", "file_bytes", "num_points", "num_in_range", "label_path")


def shard_of(sample_id: str) -> int:
    """Shard (0 .. SCAN_SHARDS-1) of a sample id: stable across processes (no ``hash()``)."""
    digest = hashlib.blake2b(sample_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SCAN_SHARDS


def settle_shard(rows: Sequence[dict]) -> tuple[pa.Table, list[dict]]:
    """Feature rows of one shard -> (the table sorted by ``ORDER``, first row per sample_id kept;
    reject rows (``duplicate_id``) for the others)."""
    table = rows_to_table(rows, schemas.sample_schema())
    return dedupe(table.sort_by([(k, "ascending") for k in ORDER]).combine_chunks())


def shard_bytes(table: pa.Table) -> bytes:
    """A shard's scratch Parquet file: ``SHARD_GROUP_ROWS``-row groups, no compression (read once)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=SHARD_GROUP_ROWS, compression="none")
    return sink.getvalue().to_pybytes()


def merge_shards(files: Sequence[pq.ParquetFile]) -> Iterator[pa.Table]:
    """Shard files (each sorted, ids unique across all) -> their rows sorted by sample_id, as a
    stream of tables of ``sample_schema()``."""
    schema = schemas.sample_schema()
    yield from (t.cast(schema) for t in merge_sorted([row_groups(f) for f in files], "sample_id"))


def write_merged(paths: Sequence[str], open_read: Callable, sink) -> tuple[int, str, ParquetStream]:
    """Merge the shard files at ``paths`` (opened with ``open_read``, a context manager giving a
    binary stream) into the Parquet stream ``sink`` (``sample_schema()``, sorted by sample_id).

    Returns:
        (rows written, inputs fingerprint of them, the closed ``ParquetStream``).
    """
    h, rows = hashlib.sha256(), 0
    with contextlib.ExitStack() as stack:
        files = [parquet_file(stack.enter_context(open_read(p))) for p in paths]
        with ParquetStream(sink, schemas.sample_schema()) as out:
            for table in merge_shards(files):
                fingerprint_update(h, table)
                out.write(table)
                rows += table.num_rows
    return rows, h.hexdigest(), out
