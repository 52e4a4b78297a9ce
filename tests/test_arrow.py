"""``transforms.arrow``: ParquetStream writes parquet_bytes' bytes whatever the pieces; read_rows."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard.transforms.arrow import ROW_GROUP_ROWS, ParquetStream, parquet_bytes, read_rows, sha256_hex


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
