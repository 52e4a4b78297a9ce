"""``transforms.features.shards``: the scan's rows in hash shards, settled per shard, merged back in
sample_id order with the bytes and fingerprint of the whole sorted table."""

from __future__ import annotations

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
from lidarshard.transforms.arrow import parquet_bytes, rows_to_table
from lidarshard.transforms.features import shards
from lidarshard.transforms.features.accounting import fingerprint
from tests.helpers import REPO


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
    """Rows dealt to ``count`` shards by ``shard_of`` (as the scan does), each settled and written."""
    by_shard: dict[int, list[dict]] = {}
    for row in rows:
        by_shard.setdefault(shards.shard_of(row["sample_id"]) % count, []).append(row)
    paths, rejects = [], []
    for s, part in sorted(by_shard.items()):
        table, dups = shards.settle_shard(part)
        path = tmp / f"count{count}-shard{s}.parquet"
        path.write_bytes(shards.shard_bytes(table))
        paths.append(str(path))
        rejects += dups
    return paths, rejects


def _merged(paths: list[str]) -> tuple[int, str, bytes]:
    sink = io.BytesIO()
    rows, digest, out = shards.write_merged(paths, lambda p: open(p, "rb"), sink)
    assert out.bytes == len(sink.getvalue())
    return rows, digest, sink.getvalue()


@pytest.mark.parametrize("count", [1, 7, shards.SCAN_SHARDS])
def test_merged_shards_are_the_sorted_table_whatever_the_shard_count(tmp_path: Path, count: int) -> None:
    """1,500 rows over several row groups per shard: same bytes as writing the sorted table at once,
    same inputs fingerprint, for 1, 7 or 256 shards."""
    rows = _rows(1500, seed=3)
    paths, rejects = _shard_files(rows, tmp_path, count)
    n, digest, data = _merged(paths)
    want = rows_to_table(rows, schemas.sample_schema()).sort_by("sample_id")
    assert (n, rejects) == (1500, [])
    assert data == parquet_bytes(want)
    assert digest == fingerprint(want)


def test_a_duplicate_id_keeps_the_same_row_whatever_the_arrival_order(tmp_path: Path) -> None:
    rows = _rows(50, seed=1)
    twins = [dict(rows[7], path=p, file_bytes=b) for p, b in (("/data/z.bin", 5), ("/data/a.bin", 9))]
    kept, ids = [], sorted({r["sample_id"] for r in rows})
    for order in (rows + twins, twins[::-1] + rows[::-1]):
        table, dups = shards.settle_shard(order)
        assert table.column("sample_id").to_pylist() == ids
        assert table.column("path").to_pylist()[ids.index(rows[7]["sample_id"])] == "/data/a.bin"
        assert sorted(d["path"] for d in dups) == sorted([rows[7]["path"], "/data/z.bin"])
        assert {d["reason"] for d in dups} == {"duplicate_id"}
        kept.append(parquet_bytes(table))
    assert kept[0] == kept[1]


def test_no_shard_merges_to_an_empty_samples_file(tmp_path: Path) -> None:
    n, digest, data = _merged([])
    assert n == 0 and data == parquet_bytes(schemas.sample_schema().empty_table())
    assert digest == fingerprint(schemas.sample_schema().empty_table())


def test_shard_of_is_the_same_in_every_process() -> None:
    """No salted ``hash()``: two interpreters with different hash seeds agree."""
    ids = ["a", "scene-0001/tok", "ünïcode/x.bin", ""]
    code = (
        f"from lidarshard.transforms.features.shards import shard_of; print([shard_of(i) for i in {ids!r}])"
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
    assert seen == {repr([shards.shard_of(i) for i in ids]) + "\n"}
    assert all(0 <= shards.shard_of(i) < shards.SCAN_SHARDS for i in ids)


def test_row_groups_of_a_shard_file_are_small() -> None:
    """The merge holds one row group per shard: a shard file's groups are ``SHARD_GROUP_ROWS`` rows."""
    size = shards.SHARD_GROUP_ROWS
    table = rows_to_table(_rows(2 * size + 76, seed=2), schemas.sample_schema())
    meta = pq.ParquetFile(pa.BufferReader(shards.shard_bytes(table))).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [size, size, 76]
