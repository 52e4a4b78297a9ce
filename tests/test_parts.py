"""``transforms.parts``: the samples as consecutive part files, read as one Parquet file; the strict
names of a samples directory and of a manifest's parts; a 2.x single file still accepted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import ROW_GROUP_ROWS, read_rows, row_groups
from lidarshard.transforms.io.parts import (
    PART_ROWS,
    ParquetParts,
    listed_parts,
    open_parts,
    part_files,
    parts_holding,
    read_parts,
    samples_files,
)
from tests.helpers import scored_pool, write_samples
from tests.object_store import SCHEME, MemoryObjectStore

#: Rows of each part of ``_parted`` (one empty) and rows per row group.
SIZES, GROUP = (30, 0, 45, 25), 10


def _parted(samples: Path, table: pa.Table) -> list[str]:
    """``table`` written as parts of ``SIZES`` rows into ``samples``; their paths."""
    samples.mkdir(parents=True)
    paths, first = [], 0
    for k, n in enumerate(SIZES):
        path = samples / schemas.part_name(k)
        pq.write_table(table.slice(first, n), path, row_group_size=GROUP)
        paths.append(str(path))
        first += n
    return paths


def test_parts_read_as_one_file_with_row_groups_numbered_across_them(tmp_path: Path) -> None:
    table = scored_pool(sum(SIZES), seed=1)
    paths = _parted(tmp_path / "samples", table)
    files = [pq.ParquetFile(p) for p in paths]
    local = [(i, g) for i, f in enumerate(files) for g in range(f.metadata.num_row_groups)]
    with open_parts(paths) as parts:
        assert parts.schema_arrow.equals(table.schema)
        assert parts.metadata.num_row_groups == len(local) and parts.metadata.num_rows == table.num_rows
        assert parts.part_rows == list(SIZES)
        assert parts.part_groups == [f.metadata.num_row_groups for f in files]
        for g, (i, j) in enumerate(local):
            assert parts.metadata.row_group(g).num_rows == files[i].metadata.row_group(j).num_rows
            assert parts.read_row_group(g).equals(files[i].read_row_group(j))
        assert pa.concat_tables(row_groups(parts)).equals(table)
        some = [1, 3, 4, len(local) - 1]
        want = pa.concat_tables(files[local[g][0]].read_row_group(local[g][1], ["cost"]) for g in some)
        assert parts.read_row_groups(some, columns=["cost"]).equals(want)
        assert parts.read_row_groups([], columns=["cost", "path"]).equals(
            table.select(["cost", "path"]).slice(0, 0)
        )
        assert read_rows(parts, 25, 80, ["sample_id"]).equals(table.select(["sample_id"]).slice(25, 55))
    assert read_parts(paths).equals(table)
    assert read_parts(paths[2:3], ["weight"]).equals(table.select(["weight"]).slice(30, 45))


def test_parts_with_other_columns_or_none_are_refused(tmp_path: Path) -> None:
    table = scored_pool(20, seed=2)
    paths = _parted(tmp_path / "samples", table)
    pq.write_table(table.drop_columns(["weight"]), paths[2])
    with pytest.raises(ValueError, match=f"^{paths[2]}: its columns differ from the first part's$"):
        with open_parts(paths):
            pass
    pq.write_table(table.set_column(3, "cost", table.column("cost").cast(pa.float32())), paths[2])
    with pytest.raises(ValueError, match="^part 2: its columns differ"):
        ParquetParts([pq.ParquetFile(p) for p in paths])
    with pytest.raises(ValueError, match="no samples part"):
        ParquetParts([])


def test_a_samples_directory_holds_only_consecutive_parts(tmp_path: Path) -> None:
    samples = tmp_path / "samples"
    paths = _parted(samples, scored_pool(sum(SIZES), seed=3))
    assert part_files(str(samples)) == samples_files(str(samples)) == paths
    (samples / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=f"^{samples / 'notes.txt'} is not a samples part"):
        part_files(str(samples))
    (samples / "notes.txt").unlink()
    (samples / "sub").mkdir()
    (samples / "sub" / schemas.part_name(4)).write_bytes(Path(paths[0]).read_bytes())
    with pytest.raises(ValueError, match="sub/part-00004.parquet is not a samples part"):
        part_files(str(samples))
    (samples / "sub" / schemas.part_name(4)).unlink()
    (samples / "sub").rmdir()
    Path(paths[1]).unlink()
    with pytest.raises(ValueError, match=f"^{samples} lacks part-00001.parquet"):
        part_files(str(samples))
    for p in paths:
        Path(p).unlink(missing_ok=True)
    with pytest.raises(ValueError, match=f"^{samples} holds no samples part$"):
        samples_files(str(samples))


def test_samples_files_take_a_directory_or_a_single_file_not_an_output(tmp_path: Path) -> None:
    table = scored_pool(12, seed=4)
    samples = write_samples(tmp_path / "out" / schemas.SAMPLES_DIR, table)
    assert samples_files(str(samples)) == [str(samples / schemas.part_name(0))]
    single = tmp_path / schemas.SAMPLES_FILE
    pq.write_table(table, single)
    assert samples_files(str(single)) == [str(single)]
    assert read_parts(samples_files(str(single))).equals(table)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=f"^{out} is an output directory: pass its samples, {samples}$"):
        samples_files(str(out))


def test_parts_on_an_object_store() -> None:
    """No directories there: a prefix with files is the samples directory."""
    table = scored_pool(sum(SIZES), seed=5)
    base = f"{SCHEME}://bucket/run/{schemas.SAMPLES_DIR}"
    try:
        first = 0
        for k, n in enumerate(SIZES):
            sink = pa.BufferOutputStream()
            pq.write_table(table.slice(first, n), sink, row_group_size=GROUP)
            storage.write_bytes(f"{base}/{schemas.part_name(k)}", sink.getvalue().to_pybytes())
            first += n
        paths = samples_files(base)
        assert paths == [f"{base}/{schemas.part_name(k)}" for k in range(len(SIZES))]
        with open_parts(paths) as parts:
            assert pa.concat_tables(row_groups(parts)).equals(table)
        with pytest.raises(ValueError, match="is an output directory"):
            samples_files(f"{SCHEME}://bucket/run")
    finally:
        MemoryObjectStore.objects.clear()


def test_listed_parts_are_the_manifest_files_under_samples_in_order() -> None:
    files = [schemas.samples_part(2), "plan/epoch_000/rank_0000.parquet", schemas.samples_part(0)]
    files += [schemas.REJECTS_FILE, schemas.samples_part(1), schemas.SAMPLES_FILE]
    assert listed_parts(files) == [schemas.samples_part(k) for k in range(3)]
    assert listed_parts(iter(files)) == [schemas.samples_part(k) for k in range(3)]
    with pytest.raises(ValueError, match=r"^samples/part-00001\.parquet is missing"):
        listed_parts([schemas.samples_part(0), schemas.samples_part(2)])
    with pytest.raises(ValueError, match=r"^samples/part-00000\.parquet is missing"):
        listed_parts([schemas.REJECTS_FILE, schemas.SAMPLES_FILE])
    for bad in ("samples/part-1.parquet", "samples/part-000001.parquet", "samples/x/part-00000.parquet"):
        with pytest.raises(ValueError, match=f"^{bad} is not a samples part"):
            listed_parts([schemas.samples_part(0), bad])


def test_a_part_aims_at_whole_row_groups() -> None:
    assert PART_ROWS % ROW_GROUP_ROWS == 0 and PART_ROWS // ROW_GROUP_ROWS > 1


def test_parts_holding_a_row_range_are_all_a_task_opens(tmp_path: Path) -> None:
    """Every range [start, stop) of the rows: the parts returned (none ending before start or starting
    at or after stop, apart from empty ones between) read from their first row give those rows."""
    table = scored_pool(sum(SIZES), seed=6)
    paths = _parted(tmp_path / "samples", table)
    bounds = np.cumsum([0, *SIZES])
    for start in range(0, table.num_rows, 3):
        for stop in range(start + 1, table.num_rows + 1, 4):
            held, first = parts_holding(paths, list(SIZES), start, stop)
            k = paths.index(held[0])
            assert first == bounds[k] and bounds[k] <= start < bounds[k + 1]
            assert bounds[k + len(held) - 1] < stop <= bounds[k + len(held)]
            assert held == paths[k : k + len(held)]
            got = read_parts(held, ["sample_id"]).slice(start - first, stop - start)
            assert got.equals(table.select(["sample_id"]).slice(start, stop - start))
