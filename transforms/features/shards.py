"""The scan's rows in hash shards: no step holds them all. Pure pyarrow.

Every feature row goes to shard ``seeds.scan_shard(sample_id, SCAN_SHARDS)`` (so duplicates of
an id meet in one shard). A shard is sorted and deduplicated on its own (``settle_shard``) and
written as a scratch Parquet file of small row groups (``shard_bytes``), and every
``key_stride``-th of its ids is sampled. The sampled ids cut the sorted id space into the samples
parts' ranges (``split_keys``); one task per part then streams the rows of its range from every
shard file, merged by sample_id (``write_range``), holding one row group per shard. The result does
not depend on the shard count or on the order rows arrived in.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lidarshard import schemas
from lidarshard.transforms.features.accounting import DEDUPE_ORDER, dedupe
from lidarshard.transforms.io.arrow import (
    ParquetStream,
    concat_sorted,
    merge_sorted,
    parquet_file,
    rows_to_table,
)

__all__ = [
    "SCAN_SHARDS",
    "SHARD_GROUP_ROWS",
    "settle_shard",
    "shard_bytes",
    "key_stride",
    "sampled_keys",
    "split_keys",
    "key_ranges",
    "merge_shards",
    "write_range",
]

#: Hash shards of the scan's rows: one task each (~40k samples at 10M), one open file each in the merge.
SCAN_SHARDS = 256
#: Rows per row group of a shard file. The merge buffers one to two groups per shard and emits about
#: one per shard a round (256 x 128 rows x ~2.2 KB a 9-sweep row: ~72 MB of Arrow data); measured
#: peak RSS ~1 GiB at 1M rows, flat in N (``benchmarks/merge_bench.py``).
SHARD_GROUP_ROWS = 128
#: Feature rows (dicts) turned into Arrow at a time when a shard is settled (~2 KB each as Arrow with
#: 9 sweeps, several times that as Python objects).
CHUNK_ROWS = 4096
#: Sort keys of a shard: the duplicate rule's, so the row ``dedupe`` keeps does not depend on arrival order.
ORDER = DEDUPE_ORDER


def settle_shard(rows: Iterable[dict]) -> tuple[pa.Table, list[dict]]:
    """Feature rows of one shard -> (the table sorted by ``ORDER``, first row per sample_id kept;
    reject rows (``duplicate_id``) for the others). Rows become Arrow ``CHUNK_ROWS`` at a time, so a
    streamed ``rows`` (a runner's grouped values) never has more than that many dicts alive."""
    schema, it, chunks = schemas.sample_schema(), iter(rows), []
    while chunk := list(itertools.islice(it, CHUNK_ROWS)):
        chunks.append(rows_to_table(chunk, schema))
    return dedupe(concat_sorted(chunks, schema, ORDER))


def shard_bytes(table: pa.Table) -> bytes:
    """A shard's scratch Parquet file: ``SHARD_GROUP_ROWS``-row groups, no compression (read once)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=SHARD_GROUP_ROWS, compression="none")
    return sink.getvalue().to_pybytes()


def key_stride(part_rows: int) -> int:
    """Every ``key_stride``-th sample_id of a shard is sampled to cut the parts: ~64 keys a part."""
    return max(1, part_rows // 64)


def sampled_keys(table: pa.Table, stride: int, shard: int) -> list[str]:
    """Every ``stride``-th sample_id of settled shard ``shard`` (``table``, sorted): each stands for
    ``stride`` rows. Shards start at staggered offsets (``shard * stride / SCAN_SHARDS``): each hash
    shard is an even sample of the whole id range, so a common offset would put the k-th key of every
    shard near the same place, and the parts ``split_keys`` cuts would swing from a few rows to
    several times ``part_rows``."""
    start = shard % SCAN_SHARDS * stride // SCAN_SHARDS
    return table.column("sample_id").slice(start)[::stride].to_pylist() if table.num_rows > start else []


def split_keys(keys: Sequence[str], part_rows: int, stride: int) -> list[str]:
    """The first sample_id of every part but the first: every ``part_rows // stride``-th of the sorted
    sampled ``keys``. Exact (part k = rows [k*part_rows, (k+1)*part_rows)) when ``stride`` is 1;
    otherwise parts of about ``part_rows`` rows. Depends only on the key set, not on its order."""
    every = max(1, part_rows // stride)
    return sorted(keys)[every::every]


def key_ranges(splits: Sequence[str]) -> list[tuple[str | None, str | None]]:
    """``[lo, hi)`` sample_id range of each part (None: unbounded) from ``split_keys``."""
    bounds: list[str | None] = [None, *splits, None]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _in_range(file: pq.ParquetFile, lo: str | None, hi: str | None) -> Iterator[pa.Table]:
    """The rows of a sorted shard file with ``lo <= sample_id < hi``, a row group at a time; groups
    whose statistics lie outside the range are not read."""
    column = file.schema_arrow.get_field_index("sample_id")
    for g in range(file.metadata.num_row_groups):
        stats = file.metadata.row_group(g).column(column).statistics
        if stats is not None and stats.has_min_max:
            if (hi is not None and stats.min >= hi) or (lo is not None and stats.max < lo):
                continue
        t = file.read_row_group(g, use_threads=False)
        ids = t.column("sample_id")
        mask = None if lo is None else pc.greater_equal(ids, lo)
        if hi is not None:
            below = pc.less(ids, hi)
            mask = below if mask is None else pc.and_(mask, below)
        yield t if mask is None else t.filter(mask)


def merge_shards(
    files: Sequence[pq.ParquetFile], lo: str | None = None, hi: str | None = None
) -> Iterator[pa.Table]:
    """Shard files (each sorted, ids unique across all) -> their rows with ``lo <= sample_id < hi``
    (None: unbounded) sorted by sample_id, as a stream of tables of ``sample_schema()``."""
    schema = schemas.sample_schema()
    streams = [_in_range(f, lo, hi) for f in files]
    yield from (t.cast(schema) for t in merge_sorted(streams, "sample_id"))


def write_range(
    paths: Sequence[str], lo: str | None, hi: str | None, open_read: Callable, sink
) -> tuple[int, ParquetStream]:
    """Merge the rows with ``lo <= sample_id < hi`` of the shard files at ``paths`` (opened with
    ``open_read``, a context manager giving a binary stream) into the Parquet stream ``sink``
    (``sample_schema()``, sorted by sample_id): one samples part.

    Returns:
        (rows written, the closed ``ParquetStream``: ``bytes``, ``sha256``).
    """
    rows = 0
    with contextlib.ExitStack() as stack:
        files = [parquet_file(stack.enter_context(open_read(p))) for p in paths]
        with ParquetStream(sink, schemas.sample_schema()) as out:
            for table in merge_shards(files, lo, hi):
                out.write(table)
                rows += table.num_rows
    return rows, out
