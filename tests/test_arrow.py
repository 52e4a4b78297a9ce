"""``transforms.arrow``: ParquetStream writes parquet_bytes' bytes whatever the pieces; read_rows;
merge_sorted; release_memory."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard.transforms.io.arrow import (
    ROW_GROUP_ROWS,
    ParquetStream,
    merge_sorted,
    parquet_bytes,
    read_rows,
    release_memory,
    sha256_hex,
)


def _table(n: int) -> pa.Table:
    return pa.table(
        {"i": np.arange(n), "s": [f"v{i % 977}" for i in range(n)], "l": [[i] * (i % 3) for i in range(n)]}
    )


@pytest.mark.parametrize(
    "n, cuts",
    [
        (0, [0]),
        (5, [5]),
        (ROW_GROUP_ROWS, [ROW_GROUP_ROWS]),
        (140_000, [1, 70_000, 69_999]),
        (40_000, [16_383, 2, 23_615]),
        (140_000, [140_000]),
    ],
)
def test_stream_equals_parquet_bytes(n: int, cuts: list[int]) -> None:
    table = _table(n)
    sink, start = io.BytesIO(), 0
    with ParquetStream(sink, table.schema) as out:
        for c in cuts:
            out.write(table.slice(start, c))
            start += c
    want = parquet_bytes(table)
    assert sink.getvalue() == want
    assert (out.bytes, out.sha256) == (len(want), sha256_hex(want))


def test_an_error_inside_leaves_the_stream_unclosed() -> None:
    sink = io.BytesIO()
    with pytest.raises(RuntimeError), ParquetStream(sink, _table(1).schema) as out:
        out.write(_table(3))
        raise RuntimeError("boom")
    assert out.sha256 == ""  # never finished: no footer written, nothing claimed


def test_read_rows_reads_a_range_across_row_groups() -> None:
    table = _table(150_000)
    file = pq.ParquetFile(pa.BufferReader(parquet_bytes(table)))
    assert file.metadata.num_row_groups == -(-150_000 // ROW_GROUP_ROWS)
    for start, stop in [(0, 1), (65_530, 65_540), (1000, 150_000), (149_999, 150_000), (10, 10)]:
        assert read_rows(file, start, stop, ["i", "s"]).equals(
            table.select(["i", "s"]).slice(start, stop - start)
        )


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.text(min_size=0, max_size=6), unique=True, max_size=80),
    streams=st.integers(1, 6),
    data=st.data(),
)
def test_merge_sorted_is_the_sorted_union_whatever_the_split(keys: list[str], streams: int, data) -> None:
    """Keys dealt to streams at random, each stream cut into tables of random sizes (empty ones too):
    the merged stream is every key once, in Arrow's (UTF-8 byte) order."""
    owner = data.draw(st.lists(st.integers(0, streams - 1), min_size=len(keys), max_size=len(keys)))
    sources = []
    for s in range(streams):
        mine = pa.table({"k": pa.array(sorted(k for k, o in zip(keys, owner, strict=True) if o == s))})
        cuts = sorted(data.draw(st.lists(st.integers(0, mine.num_rows), max_size=4)))
        bounds = [0, *cuts, mine.num_rows]
        sources.append(iter([mine.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]))
    merged = list(merge_sorted(sources, "k"))
    got = [k for t in merged for k in t.column("k").to_pylist()]
    assert got == pa.array(keys, pa.string()).sort().to_pylist()
    assert all(t.num_rows for t in merged)


def _rss_mib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the RSS from /proc")
def test_release_memory_hands_freed_arrow_pages_back() -> None:
    """A Beam worker keeps the peak of every step it ran unless the step hands its freed pages back."""
    big = pa.compute.add(pa.array(np.arange(1 << 25, dtype=np.int64)), 1)  # 256 MiB from Arrow's pool
    held = _rss_mib()
    del big
    release_memory()
    assert _rss_mib() < held - 128
