"""``tools.validate_samples``: row keys, the id lookup, the streamed read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.tools.validate_samples import id_keys, read_samples, row_keys
from lidarshard.transforms.io.arrow import parquet_bytes, release_memory
from lidarshard.transforms.io.parts import ParquetParts, open_parts
from tests.helpers import scored_pool


def test_row_keys_see_every_part_of_a_row() -> None:
    ids = pa.array(["a", "a", "a", "a", "a"])
    path = pa.array(["p", "p", "q", None, "p"])
    sweeps = pa.array([["x", "y"], ["xy"], ["x", "y"], ["x", "y"], None])
    keys = row_keys(ids, path, sweeps)
    assert len(set(keys.tolist())) == 5  # a changed path, a split sweep, a null path, null sweeps
    assert row_keys(ids, path, sweeps).tolist() == keys.tolist()  # deterministic (no salted hash)
    assert id_keys(pa.array(["a", "b"]))[0] == id_keys(pa.array(["b", "a"]))[1]


def _samples_parts(tmp_path) -> tuple[pa.Table, list[str]]:
    """A scored pool of 40,000 rows (file_bytes = row index) written as two samples parts (25,000 rows:
    2 row groups, and 15,000 rows)."""
    table = scored_pool(40_000, 1)
    full = pa.table({f.name: table.column(f.name) if f.name in table.column_names else pa.nulls(40_000, f.type)
                     for f in schemas.scored_schema()})  # fmt: skip
    full = full.set_column(
        full.schema.get_field_index("file_bytes"), "file_bytes", pa.array(np.arange(40_000))
    )
    full = full.cast(schemas.scored_schema())
    (tmp_path / schemas.SAMPLES_DIR).mkdir()
    files = [str(tmp_path / schemas.samples_part(k)) for k in range(2)]
    for f, part in zip(files, (full.slice(0, 25_000), full.slice(25_000)), strict=True):
        Path(f).write_bytes(parquet_bytes(part))
    return table, files


def test_streamed_view_finds_rows_and_reads_ids_on_demand(tmp_path) -> None:
    table, files = _samples_parts(tmp_path)
    problems: list[str] = []
    with open_parts(files) as file:
        view, _, _ = read_samples(files, file, None, problems.append, str(tmp_path / "scratch"))
    release_memory()
    assert problems == [] and view.num_rows == 40_000 and not view.key_clash()
    rows = np.array([0, 17_000, 39_999, 5])
    assert view.find(table.column("sample_id").take(pa.array(rows))).tolist() == rows.tolist()
    assert view.find(pa.array(["nope"])).tolist() == [-1]
    for row in (0, 17_000, 25_000, 39_999):  # both parts
        assert view.column("sample_id")[row] == table.column("sample_id")[row].as_py()
    assert view.columns.table(["cost"]).column("cost").to_numpy()[5] == table.column("cost")[5].as_py()
    assert view.cost_mismatch is None  # no cost model given


def test_cost_model_mismatches_are_counted_across_row_groups(tmp_path) -> None:
    table, files = _samples_parts(tmp_path)
    file = ParquetParts([pq.ParquetFile(f) for f in files])
    assert file.part_groups == [2, 1]

    def model(t: pa.Table) -> np.ndarray:  # differs from row 30_001 on (a later row group)
        return t.column("cost").to_numpy() + (t.column("file_bytes").to_numpy() > 30_000)

    view, _, _ = read_samples(files, file, None, [].append, str(tmp_path / "scratch"), model)
    count, first, got, want = view.cost_mismatch
    assert (count, first) == (9_999, 30_001) and want == got + 1
    assert got == table.column("cost")[30_001].as_py()


def _members(view, g: int) -> np.ndarray:
    """(n_g,) ascending rows of step group ``g`` of 3 in epoch 1 with seed 7."""
    return view.group(g, 7, 1, 3).column("row").to_numpy()


def test_key_partitions_find_the_same_rows_keys_and_groups(tmp_path) -> None:
    """One key partition and 4 (10,000 keys each): the same row, row key and group key for every id,
    including each partition's first and last keys; the same step groups dealt."""
    table, files = _samples_parts(tmp_path)
    ids = table.column("sample_id")
    views = []
    for part_keys in (None, 10_000):
        with open_parts(files) as file:
            where = str(tmp_path / f"scratch-{part_keys}")
            views.append(read_samples(files, file, None, [].append, where, part_keys=part_keys)[0])
    one, four = views
    assert (one.keys.parts, four.keys.parts) == (1, 4)
    got = [v.match(ids) for v in views]
    assert got[0].rows.tolist() == got[1].rows.tolist() == list(range(40_000))
    assert np.array_equal(got[0].row_keys, got[1].row_keys)
    assert np.array_equal(got[0].group_keys, got[1].group_keys)
    assert np.array_equal(got[0].row_keys, row_keys(ids, table.column("path"), table.column("sweep_paths")))
    part = four.keys.part_of(id_keys(ids))
    assert np.bincount(part).tolist() != [40_000] and set(part.tolist()) == {0, 1, 2, 3}
    edges = []
    for p in range(4):  # the lowest and highest id key of each partition: its boundary rows
        at = np.flatnonzero(part == p)
        k = id_keys(ids.take(pa.array(at)))
        edges += [int(at[np.argmin(k)]), int(at[np.argmax(k)])]
    taken = ids.take(pa.array(edges))
    for v in views:
        assert v.find(taken).tolist() == edges
        assert v.find(pa.array(["nope", ids[edges[3]].as_py()])).tolist() == [-1, edges[3]]
    for g in range(3):
        assert _members(one, g).tolist() == _members(four, g).tolist()
    assert sum(_members(four, g).size for g in range(3)) == 40_000
    four.drop_keys()
    with pytest.raises(RuntimeError, match="dropped"):
        four.find(taken)
    assert _members(four, 0).tolist() == _members(one, 0).tolist()  # group keys stay


def test_parked_columns_deal_each_group_its_rows_in_order(tmp_path) -> None:
    """Chunks of 7 rows (so a deal spans chunks): the chunks are the columns, each dealt group is
    exactly the rows its labels give (ascending, with ``row``), a second deal of another tag replaces
    the first, and a null (from its first on) reads back as a null, whole and dealt."""
    from lidarshard.tools import validate_columns
    from lidarshard.tools.validate_columns import ParkedColumns

    rng = np.random.default_rng(3)
    cost, bucket = rng.random(50), rng.integers(0, 4, 50).astype(np.int32)
    parked = ParkedColumns(
        pa.schema([("cost", pa.float64()), ("bucket_id", pa.int32()), ("num_points", pa.int64())]),
        str(tmp_path / "columns"),
    )
    points = pa.array(
        [None if k % 9 == 4 and k > 20 else k for k in range(50)], pa.int64()
    )  # from row group 2
    for a in range(0, 50, 20):  # three "row groups"
        part = {"cost": cost[a : a + 20], "bucket_id": bucket[a : a + 20], "num_points": points[a : a + 20]}
        parked.add(pa.table(part, schema=parked.schema))
    assert parked.num_rows == 50
    whole = parked.table()
    assert (
        np.array_equal(whole.column("cost").to_numpy(), cost) and whole.column("bucket_id").type == pa.int32()
    )
    assert (
        whole.column("num_points").to_pylist() == points.to_pylist()
        and whole.column("num_points").null_count == 4
    )
    assert [a for a, _ in parked.chunks(rows=7)] == list(range(0, 50, 7))
    labels = rng.integers(0, 3, 50)
    for tag in ("first", "second"):
        labels = labels if tag == "first" else (labels + 1) % 3
        old, validate_columns.CHUNK_ROWS = validate_columns.CHUNK_ROWS, 7
        try:
            parked.deal(lambda a, n, lab=labels: lab[a : a + n], 3, tag)
        finally:
            validate_columns.CHUNK_ROWS = old
        for g in range(3):
            got, want = parked.group(g), np.flatnonzero(labels == g)
            assert got.column("row").to_numpy().tolist() == want.tolist()
            assert np.array_equal(got.column("cost").to_numpy(), cost[want])
            assert np.array_equal(got.column("bucket_id").to_numpy(), bucket[want])
            assert got.column("num_points").to_pylist() == points.take(pa.array(want)).to_pylist()
