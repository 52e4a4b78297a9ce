"""``transforms.features.shards``: the scan's rows in hash shards, settled per shard, cut into
sample_id ranges by sampled ids and merged back one range a part: the parts are the whole sorted
table, byte for byte, cut where the key set says."""

from __future__ import annotations

import bisect
import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.transforms.features import shards
from lidarshard.transforms.io.arrow import parquet_bytes, rows_to_table
from lidarshard.transforms.plan import seeds
from tests.helpers import REPO, slow_after


def _rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "sample_id": f"scene-{int(i) % 97:03d}/tok{int(i):07d}",
            "path": f"/data/samples/{int(i):07d}.bin",
            "sweep_paths": [f"/data/sweeps/{int(i)}-{k}.bin" for k in range(int(i) % 4)],
            "format": "nuscenes_bin",
            "file_bytes": int(rng.integers(1, 10**7)),
            "num_points": int(rng.integers(1, 10**5)),
        }
        for i in rng.permutation(n)
    ]


def _shard_files(rows: list[dict], tmp: Path, count: int) -> tuple[list[str], list[dict]]:
    """Rows dealt to ``count`` shards by ``seeds.scan_shard`` (as the scan does), each settled and written."""
    by_shard: dict[int, list[dict]] = {}
    for row in rows:
        by_shard.setdefault(seeds.scan_shard(row["sample_id"], shards.SCAN_SHARDS) % count, []).append(row)
    paths, rejects = [], []
    for s, part in sorted(by_shard.items()):
        table, dups = shards.settle_shard(part)
        path = tmp / f"count{count}-shard{s}.parquet"
        path.write_bytes(shards.shard_bytes(table))
        paths.append(str(path))
        rejects += dups
    return paths, rejects


def _sampled(paths: list[str], stride: int) -> list[list[str]]:
    """Every shard file's sampled keys (``sampled_keys``; its shard number from its name), in shard order."""
    return [
        shards.sampled_keys(pq.read_table(p), stride, int(p.rsplit("shard", 1)[1].split(".")[0]))
        for p in paths
    ]


def _write_parts(paths: list[str], part_rows: int, stride: int) -> list[tuple[int, bytes]]:
    """The samples parts of the shard files at ``paths``: ``(rows, bytes)`` of each, in order."""
    keys = [k for shard in _sampled(paths, stride) for k in shard]
    parts = []
    for lo, hi in shards.key_ranges(shards.split_keys(keys, part_rows, stride)):
        sink = io.BytesIO()
        rows, out = shards.write_range(paths, lo, hi, lambda p: open(p, "rb"), sink)
        data = sink.getvalue()
        assert (out.bytes, out.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        parts.append((rows, data))
    return parts


@pytest.mark.parametrize("count", slow_after(1, [7, 1, shards.SCAN_SHARDS]))
def test_parts_are_the_sorted_table_whatever_the_shard_count(tmp_path: Path, count: int) -> None:
    """1,500 rows (several row groups per shard below 256 shards) cut into parts: each part is the
    file of its slice of the sorted table, byte for byte, so every row is in exactly one part. With
    stride 1 the parts are exactly ``part_rows`` rows (the last shorter); with ``key_stride`` they are
    within a stride per shard of it. The shard order does not change a byte."""
    rows = _rows(1500, seed=3)
    paths, rejects = _shard_files(rows, tmp_path, count)
    want = rows_to_table(rows, schemas.sample_schema()).sort_by("sample_id")
    assert rejects == []
    for part_rows, stride in ((400, 1), (256, shards.key_stride(256))):
        parts = _write_parts(paths, part_rows, stride)
        sizes = [n for n, _ in parts]
        assert sum(sizes) == want.num_rows
        first = 0
        for n, data in parts:
            assert data == parquet_bytes(want.slice(first, n))
            first += n
        if stride == 1:
            assert sizes == [400, 400, 400, 300]
        else:
            assert stride > 1 and len(parts) > 2
            target = part_rows // stride * stride
            assert all(abs(n - target) < count * stride for n in sizes[:-1]), sizes
        assert _write_parts(paths[::-1], part_rows, stride) == parts


def test_the_cut_depends_only_on_the_key_set(tmp_path: Path) -> None:
    """Shards in another order, keys shuffled, rows arriving in another order: the same split keys;
    with stride 1 they are every ``part_rows``-th id of the sorted ids."""
    rows = _rows(1000, seed=5)
    ids = sorted(r["sample_id"] for r in rows)
    for stride in (1, 3):
        seen = []
        for order, name in ((rows, "a"), (rows[::-1], "b")):
            (tmp_path / name).mkdir(exist_ok=True)
            paths, _ = _shard_files(order, tmp_path / name, 7)
            keys = _sampled(paths, stride)
            flat = [k for shard in keys for k in shard]
            shuffled = [flat[i] for i in np.random.default_rng(stride).permutation(len(flat))]
            for listing in (flat, [k for shard in keys[::-1] for k in shard], shuffled):
                seen.append(shards.split_keys(listing, 90, stride))
        assert all(s == seen[0] for s in seen) and len(seen[0]) > 1
        if stride == 1:
            assert seen[0] == ids[90::90]


def test_sampled_keys_stand_for_a_stride_of_rows_each() -> None:
    ids = [f"k{i:02d}" for i in range(10)]
    table = pa.table({"sample_id": ids})
    assert shards.sampled_keys(table, 1, 7) == ids
    assert shards.sampled_keys(table, 3, 0) == ["k00", "k03", "k06", "k09"]
    assert shards.sampled_keys(table, 3, 200) == ["k02", "k05", "k08"]  # staggered: 200 * 3 // 256 = 2
    assert shards.sampled_keys(table, 64, 255) == []  # starts at 63, past the shard's rows
    assert shards.sampled_keys(table.slice(0, 0), 3, 0) == []
    assert shards.key_ranges(["k03", "k07"]) == [(None, "k03"), ("k03", "k07"), ("k07", None)]
    assert shards.key_stride(1) == 1 and shards.key_stride(64 * 5 + 63) == 5


def test_no_shard_writes_one_empty_part(tmp_path: Path) -> None:
    """No rows: one part, an empty file of ``sample_schema()``; a range holding no row is one too."""
    empty = parquet_bytes(schemas.sample_schema().empty_table())
    assert shards.key_ranges(shards.split_keys([], 100, 1)) == [(None, None)]
    assert _write_parts([], 100, 1) == [(0, empty)]
    paths, _ = _shard_files(_rows(20, seed=4), tmp_path, 3)
    sink = io.BytesIO()
    rows, _ = shards.write_range(paths, "zzz", None, lambda p: open(p, "rb"), sink)
    assert (rows, sink.getvalue()) == (0, empty)


class _Counting:
    """A ``pq.ParquetFile`` that records which row groups were read."""

    def __init__(self, data: bytes) -> None:
        self._file = pq.ParquetFile(pa.BufferReader(data))
        self.metadata, self.schema_arrow = self._file.metadata, self._file.schema_arrow
        self.read: list[int] = []

    def read_row_group(self, g: int, **kw) -> pa.Table:
        self.read.append(g)
        return self._file.read_row_group(g, **kw)


def test_row_groups_outside_the_range_are_not_read() -> None:
    """Groups whose sample_id statistics lie outside ``[lo, hi)`` are skipped; without statistics
    every group is read and filtered; either way the rows are those of the range."""
    size = shards.SHARD_GROUP_ROWS
    table = rows_to_table(_rows(8 * size, seed=6), schemas.sample_schema()).sort_by("sample_id")
    ids = table.column("sample_id").to_pylist()
    above = table.set_column(0, "sample_id", pa.array(["~" + i for i in ids]))  # all after hi
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=size, write_statistics=False)
    bare = sink.getvalue().to_pybytes()
    both = pa.concat_tables([table, above]).sort_by("sample_id")
    for a, b in ((300, 700), (0, 5 * size), (size + 1, len(ids))):
        lo, hi = ids[a] if a else None, ids[b] if b < len(ids) else None
        files = [_Counting(shards.shard_bytes(table)), _Counting(shards.shard_bytes(above)), _Counting(bare)]
        got = pa.concat_tables(shards.merge_shards(files[:2], lo, hi))
        assert got.equals(both.slice(a, b - a) if hi is not None else both.slice(a))
        assert files[0].read == sorted({i // size for i in range(a, b)})
        assert files[1].read == ([] if hi is not None else list(range(8)))
        assert pa.concat_tables(shards.merge_shards(files[2:], lo, hi)).equals(table.slice(a, b - a))
        assert files[2].read == list(range(8))


@pytest.mark.parametrize("chunk", [4096, 7, 1])
def test_a_duplicate_id_keeps_the_same_row_whatever_the_arrival_order(monkeypatch, chunk: int) -> None:
    """Also whatever the chunks the streamed rows become Arrow in (``CHUNK_ROWS``)."""
    monkeypatch.setattr(shards, "CHUNK_ROWS", chunk)
    rows = _rows(50, seed=1)
    twins = [dict(rows[7], path=p, file_bytes=b) for p, b in (("/data/z.bin", 5), ("/data/a.bin", 9))]
    kept, ids = [], sorted({r["sample_id"] for r in rows})
    for order in (rows + twins, twins[::-1] + rows[::-1]):
        table, dups = shards.settle_shard(iter(order))
        assert table.column("sample_id").to_pylist() == ids
        assert table.column("path").to_pylist()[ids.index(rows[7]["sample_id"])] == "/data/a.bin"
        assert sorted(d["path"] for d in dups) == sorted([rows[7]["path"], "/data/z.bin"])
        assert {d["reason"] for d in dups} == {"duplicate_id"}
        kept.append(parquet_bytes(table))
    assert kept[0] == kept[1] == parquet_bytes(shards.settle_shard(rows + twins)[0])


def test_shard_of_is_the_same_in_every_process() -> None:
    """No salted ``hash()``: two interpreters with different hash seeds agree."""
    ids = ["a", "scene-0001/tok", "ünïcode/x.bin", ""]
    code = (
        "from lidarshard.transforms.features.shards import SCAN_SHARDS; from lidarshard.transforms.plan.seeds "
        f"import scan_shard; print([scan_shard(i, SCAN_SHARDS) for i in {ids!r}])"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout  # fmt: skip
        for seed in ("1", "2")
    }
    assert seen == {repr([seeds.scan_shard(i, shards.SCAN_SHARDS) for i in ids]) + "\n"}
    assert all(0 <= seeds.scan_shard(i, shards.SCAN_SHARDS) < shards.SCAN_SHARDS for i in ids)


def test_row_groups_of_a_shard_file_are_small() -> None:
    """The merge holds one row group per shard: a shard file's groups are ``SHARD_GROUP_ROWS`` rows."""
    size = shards.SHARD_GROUP_ROWS
    table = rows_to_table(_rows(2 * size + 76, seed=2), schemas.sample_schema())
    meta = pq.ParquetFile(pa.BufferReader(shards.shard_bytes(table))).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [size, size, 76]


def test_parts_are_about_part_rows_with_every_scan_shard() -> None:
    """``SCAN_SHARDS`` shards of 64,000 ids cut with ``key_stride``: every part but the last within a
    factor 2 of ``part_rows`` (``split_keys``: "parts of about ``part_rows`` rows")."""
    part_rows = 1024
    stride = shards.key_stride(part_rows)
    ids = sorted(f"scene-{i % 97:03d}/tok{i:07d}" for i in range(64_000))
    by_shard: dict[int, list[str]] = {}
    for i in ids:
        by_shard.setdefault(seeds.scan_shard(i, shards.SCAN_SHARDS), []).append(i)
    keys = [
        k for n, s in by_shard.items() for k in shards.sampled_keys(pa.table({"sample_id": s}), stride, n)
    ]
    cuts = [0, *(bisect.bisect_left(ids, k) for k in shards.split_keys(keys, part_rows, stride)), len(ids)]
    sizes = np.diff(cuts)
    assert stride > 1 and sizes.sum() == len(ids)
    assert all(part_rows // 2 <= n <= 2 * part_rows for n in sizes[:-1]), sorted(sizes)
