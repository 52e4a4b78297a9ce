"""``tools.validate_samples``: the row keys, the streamed read into validate's database, the step groups."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.tools import validate_db
from lidarshard.tools.validate_db import ROW_KEY, Engine, scratch_error
from lidarshard.tools.validate_samples import Samples, check_samples, sample_columns
from lidarshard.transforms.core.groups import deal
from lidarshard.transforms.io.arrow import parquet_bytes
from lidarshard.transforms.plan.seeds import sample_keys
from tests.helpers import scored_pool


@pytest.fixture
def db(tmp_path: Path):
    engine = Engine(str(tmp_path))
    yield engine
    engine.close()


def test_row_keys_see_every_part_of_a_row(db: Engine) -> None:
    path = pa.array(["p", "p", "q", None, "p", "p"])
    sweeps = pa.array([["x", "y"], ["xy"], ["x", "y"], ["x", "y"], None, []], pa.list_(pa.string()))
    table = pa.table({"path": path, "sweep_paths": sweeps})
    keys = [k for (k,) in db.rows(f"SELECT {ROW_KEY} FROM t", t=table)]
    assert len(set(keys)) == 6  # a changed path, a split sweep, a null path, null sweeps, no sweeps
    again = [k for (k,) in db.rows(f"SELECT {ROW_KEY} FROM t", t=table)]
    assert again == keys  # deterministic (no salted hash)


def _samples_parts(tmp_path: Path) -> tuple[pa.Table, list[str]]:
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
    assert [pq.ParquetFile(f).metadata.num_row_groups for f in files] == [2, 1]
    return table, files


def _read(db: Engine, files: list[str], model=None) -> tuple[Samples | None, list[str]]:
    problems: list[str] = []
    groups = [
        (f, file.read_row_group(g, columns=sample_columns(file.schema_arrow.names)))
        for f in files
        for file in [pq.ParquetFile(f)]
        for g in range(file.metadata.num_row_groups)
    ]
    view = check_samples(db, groups, 40_000, "", False, lambda w, x: problems.append(f"{w}: {x}"), model)
    return view, problems


def test_streamed_view_holds_every_row_and_reads_ids_on_demand(db: Engine, tmp_path: Path) -> None:
    table, files = _samples_parts(tmp_path)
    view, problems = _read(db, files)
    assert problems == ["samples: inputs_fingerprint recomputed from (sample_id, file_bytes) differs"]
    assert view is not None and view.num_rows == 40_000
    for row in (0, 17_000, 25_000, 39_999):  # both parts
        assert view.column("sample_id")[row] == table.column("sample_id")[row].as_py()
    assert view.table(["cost"]).column("cost").to_numpy()[5] == table.column("cost")[5].as_py()
    assert [start for start, _ in view.chunks(["cost"])][0] == 0
    assert view.cost_mismatch is None  # no cost model given


def test_cost_model_mismatches_are_counted_across_row_groups(db: Engine, tmp_path: Path) -> None:
    table, files = _samples_parts(tmp_path)

    def model(t: pa.Table) -> np.ndarray:  # differs from row 30_001 on (a later row group)
        return t.column("cost").to_numpy() + (t.column("file_bytes").to_numpy() > 30_000)

    view, _ = _read(db, files, model)
    assert view is not None
    count, first, got, want = view.cost_mismatch
    assert (count, first) == (9_999, 30_001) and want == got + 1
    assert got == table.column("cost")[30_001].as_py()


def test_each_step_group_holds_the_rows_the_build_deals_it(db: Engine, tmp_path: Path) -> None:
    """``Samples.group`` of epoch 1 with seed 7 and 3 groups: each group's rows are those ``groups.deal``
    gives it (ascending, with its numbers), every sample in exactly one; another epoch deals again."""
    table, files = _samples_parts(tmp_path)
    view, _ = _read(db, files)
    assert view is not None
    cost = table.column("cost").to_numpy()
    for e in (1, 2):
        labels = deal(sample_keys(table.column("sample_id")), 7, e, 3)
        seen = 0
        for g in range(3):
            got, want = view.group(g, 7, e, 3), np.flatnonzero(labels == g)
            assert got.column("row").to_numpy().tolist() == want.tolist()
            assert np.array_equal(got.column("cost").to_numpy(), cost[want])
            seen += got.num_rows
        assert seen == 40_000


def test_pages_hold_their_rows_in_order(db: Engine) -> None:
    """Each page of ``Engine.pages`` holds exactly its rids, in order. DuckDB 1.1 read a query with parameters
    out of order (8-10 of 16 pages here) or crashed once its relation was freed; pages and every other result
    are read from queries without parameters."""
    db.run(
        "CREATE TABLE s AS SELECT range AS rid, range * 2 AS v, md5(range::VARCHAR) AS sid FROM range(1000000)"
    )
    starts = []
    for start, t in db.pages("SELECT v, sid FROM s WHERE rid >= {lo} AND rid < {hi} ORDER BY rid", 1_000_000):
        assert t["v"].to_numpy().tolist() == list(range(2 * start, 2 * (start + t.num_rows), 2))
        starts.append(start)
    assert starts == list(range(0, 1_000_000, 65_536))
    first = db.table("SELECT sid FROM s ORDER BY sid LIMIT 1")["sid"][0].as_py()
    assert first == min(hashlib.md5(str(i).encode()).hexdigest() for i in range(1_000_000))


def test_running_out_of_memory_on_duckdb_1_says_what_validates_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB 1.5 ran out of validate's 64 MB at 10M samples, 2.0 did not: the one line says which to install."""
    err = duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block of size 256.0 KiB")
    monkeypatch.setattr(duckdb, "__version__", "1.5.0")
    assert "not checked: DuckDB 1.5.0 is installed; 2.0 or later" in scratch_error("/s", err).strerror
    monkeypatch.setattr(duckdb, "__version__", "2.0.1")
    assert scratch_error("/s", err).strerror.endswith("not checked: report this with the manifest's size")


@pytest.mark.timeout(120, method="thread")  # the bug waited forever: fail the run rather than hang it
def test_validate_writes_while_it_reads_the_samples_page_by_page(
    db: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit may start a checkpoint (here every commit does: threshold 1 KB), which DuckDB 1.1 waited on
    forever while a cursor on a table was open: ``Samples.deal`` and a write per ``chunks``
    page (as ``planned_values`` does) read each page whole first, so they finish, every row once, in order."""
    monkeypatch.setattr(validate_db, "BATCH_ROWS", 4096)  # 10 pages of the 40,000 rows
    table, files = _samples_parts(tmp_path)
    view, _ = _read(db, files)
    assert view is not None
    db.run("SET checkpoint_threshold = '1KB'")
    view.deal(7, 1, 3)
    labels = deal(sample_keys(table.column("sample_id")), 7, 1, 3)
    assert view.group(2, 7, 1, 3).column("row").to_numpy().tolist() == np.flatnonzero(labels == 2).tolist()
    db.run("CREATE TABLE copied (rid BIGINT, cost DOUBLE)")
    starts = []
    for start, t in view.chunks(["cost"]):
        part = pa.table({"rid": np.arange(start, start + t.num_rows), "cost": t["cost"]})
        db.run("INSERT INTO copied SELECT * FROM part", part=part)
        starts.append(start)
    assert starts == list(range(0, 40_000, 4096))
    copied = db.table("SELECT cost FROM copied ORDER BY rid").column("cost")
    assert copied.to_pylist() == table.column("cost").to_pylist()


def test_insert_streams_every_table_and_raises_an_error_midway_after_the_statement(db: Engine) -> None:
    """``Engine.insert``: one statement over the stream; an exception raised making it is raised as itself
    (not as DuckDB's), after the rows before it went in."""
    schema = pa.schema([("x", pa.int64())])
    db.run("CREATE TABLE xs (x BIGINT)")

    def tables(fail: bool):
        yield pa.table({"x": [1, 2]})
        yield pa.table({"x": [3], "other": ["dropped"]})  # columns beyond the schema's are not passed on
        if fail:
            raise pa.ArrowInvalid("row group 2 unreadable")

    db.insert("INSERT INTO xs SELECT x FROM t", schema, tables(False))
    assert db.rows("SELECT count(*), sum(x) FROM xs") == [(3, 6)]
    with pytest.raises(pa.ArrowInvalid, match="row group 2 unreadable"):
        db.insert("INSERT INTO xs SELECT x FROM t", schema, tables(True))
    assert db.rows("SELECT count(*), sum(x) FROM xs") == [(6, 12)]


def test_a_row_group_unreadable_midway_is_raised_by_check_samples(db: Engine, tmp_path: Path) -> None:
    _, files = _samples_parts(tmp_path)
    file = pq.ParquetFile(files[0])

    def groups():  # 40 row groups read before it fails: the failure comes while DuckDB pulls the stream
        rows = file.read_row_group(0, columns=sample_columns(file.schema_arrow.names))
        yield from ((files[0], rows.slice(k * 300, 300)) for k in range(40))
        raise pa.ArrowInvalid("Parquet page header unreadable")

    with pytest.raises(pa.ArrowInvalid, match="page header"):
        check_samples(db, groups(), 40_000, "", False, lambda w, x: None)
