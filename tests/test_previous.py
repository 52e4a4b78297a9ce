"""``--from-samples`` streamed (``transforms.features.previous``): the same manifest as the in-memory path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines.cli import main
from lidarshard.transforms.arrow import parquet_bytes
from lidarshard.transforms.features import previous
from tests.helpers import BEAM_TEST_FLAGS, build_bins_manifest


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(
        tmp_path_factory.mktemp("previous"), n=90, world_size=2, batch_size=3, epochs=1
    )


def _file(table: pa.Table, **kw) -> pq.ParquetFile:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **kw)
    return pq.ParquetFile(pa.BufferReader(sink.getvalue()))


def test_numeric_columns_need_strictly_increasing_ids(built: Path) -> None:
    samples = pq.read_table(built / schemas.SAMPLES_DIR).select(schemas.sample_schema().names)
    got = previous.numeric_columns(_file(samples, row_group_size=7))
    assert got.column_names == previous.NUMERIC and got.num_rows == samples.num_rows
    assert got.column("num_points").to_pylist() == samples.column("num_points").to_pylist()
    swapped = pa.concat_tables([samples.slice(1, 1), samples.slice(0, 1), samples.slice(2)])
    assert previous.numeric_columns(_file(swapped, row_group_size=7)) is None
    across = pa.concat_tables([samples.slice(0, 7), samples.slice(6)])  # a duplicate across row groups
    assert previous.numeric_columns(_file(across, row_group_size=7)) is None
    assert previous.paths_at(_file(samples, row_group_size=7), np.array([0, 8, 20])) == [
        samples.column("path")[i].as_py() for i in (0, 8, 20)
    ]


def _build(src: Path, out: Path, *flags: str) -> None:
    args = ["build", str(out), "--from-samples", str(src), "--world-size", "2", "--batch-size", "2"]
    assert main([*args, "--epochs", "2", "--strategy", "budget", *flags, *BEAM_TEST_FLAGS]) == 0


def test_streamed_and_in_memory_inputs_give_the_same_manifest(built: Path, tmp_path: Path) -> None:
    """A sorted input streams; the same rows shuffled (and one duplicated) take the in-memory path.
    With a points cap (over_cap rejects) and re-rooted paths both give the same files."""
    samples = pq.read_table(built / schemas.SAMPLES_DIR).select(schemas.sample_schema().names)
    cap = int(np.sort(samples.column("num_points").to_numpy())[-3])  # the 2 largest go over it
    sorted_dir, shuffled_dir = tmp_path / "sorted", tmp_path / "shuffled"
    for d in (sorted_dir, shuffled_dir):
        d.mkdir()
        for name in (schemas.MANIFEST_FILE, schemas.REJECTS_FILE):
            (d / name).write_bytes((built / name).read_bytes())  # path_root and earlier rejects
    (sorted_dir / schemas.SAMPLES_DIR).write_bytes(parquet_bytes(samples))
    order = np.random.default_rng(0).permutation(samples.num_rows)
    (shuffled_dir / schemas.SAMPLES_DIR).write_bytes(parquet_bytes(samples.take(pa.array(order))))
    flags = ("--max-points-per-rank-step", str(cap), "--relative-to", str(built.parent))
    _build(sorted_dir / schemas.SAMPLES_DIR, tmp_path / "a", *flags)
    _build(shuffled_dir / schemas.SAMPLES_DIR, tmp_path / "b", *flags)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    for rel in files:
        if rel.name != schemas.MANIFEST_FILE:  # it names its input
            assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    rejects = pq.read_table(tmp_path / "a" / schemas.REJECTS_FILE)
    over = rejects.filter(pa.compute.equal(rejects.column("reason"), "over_cap"))
    assert over.num_rows == 2 and all(p.startswith("in/") for p in over.column("path").to_pylist())
    assert not (tmp_path / "a" / "_work").exists()
