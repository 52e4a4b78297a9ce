"""``--from-samples`` streamed (``transforms.features.previous``): the same manifest as the in-memory path."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines.cli import main
from lidarshard.transforms.core import previous
from lidarshard.transforms.features.accounting import fingerprint
from lidarshard.transforms.io import parts
from lidarshard.transforms.io.arrow import parquet_bytes
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


def _numeric(file: pq.ParquetFile, extras: list[str] | None = None) -> pa.Table:
    """``previous.numeric_groups``' row groups joined (the settle step's columns of every row)."""
    extras = extras or []
    empty = previous.numeric_schema(file, extras).empty_table()
    return pa.concat_tables([empty, *previous.numeric_groups(file, extras)])


def _part_tasks(file, paths, keep, cost, bucket, weight, roots, part_rows) -> list[previous.PartTask]:
    """The tests' oracle of the settle step's part tasks: ``previous.part_spans`` with their kept rows
    (parts with none dropped, the rest numbered from 0) and one cost, bucket and weight per kept row."""
    tasks: list[previous.PartTask] = []
    out = 0
    for span in previous.part_spans(file, paths, part_rows):
        mask = keep[span.rows[0] : span.rows[1]]
        kept = int(mask.sum())
        if kept:
            scores = (cost[out : out + kept], bucket[out : out + kept], weight[out : out + kept])
            tasks.append(previous.PartTask(len(tasks), span.path, span.groups, mask, *scores, roots))
        out += kept
    return tasks


def test_numeric_columns_need_strictly_increasing_ids(built: Path) -> None:
    samples = pq.read_table(built / schemas.SAMPLES_DIR).select(schemas.sample_schema().names)
    got = _numeric(_file(samples, row_group_size=7))
    assert got.column_names == previous.NUMERIC and got.num_rows == samples.num_rows
    assert got.column("num_points").to_pylist() == samples.column("num_points").to_pylist()
    assert not previous.repeated_ids(_file(samples, row_group_size=7)).any()
    swapped = pa.concat_tables([samples.slice(1, 1), samples.slice(0, 1), samples.slice(2)])
    assert previous.repeated_ids(_file(swapped, row_group_size=7)) is None
    across = pa.concat_tables([samples.slice(0, 7), samples.slice(6)])  # a duplicate across row groups
    assert previous.repeated_ids(_file(across, row_group_size=7)) is None
    # sorted by (sample_id, path) with repeats (what score.prepare writes): the repeat is marked
    assert np.flatnonzero(previous.repeated_ids(_file(across, row_group_size=7), ordered=True)).tolist() == [
        7
    ]
    assert previous.repeated_ids(_file(swapped, row_group_size=7), ordered=True) is None
    empty = _numeric(_file(samples.slice(0, 0)), ["sample_id"])
    assert empty.num_rows == 0 and empty.column_names == [*previous.NUMERIC, "sample_id"]
    assert previous.paths_at(_file(samples, row_group_size=7), np.array([0, 8, 20])) == [
        samples.column("path")[i].as_py() for i in (0, 8, 20)
    ]


def test_numeric_groups_keep_types_and_nulls(built: Path) -> None:
    """The settle step's columns: the schema's types for ``NUMERIC``, extras as stored, nulls kept."""
    samples = pq.read_table(built / schemas.SAMPLES_DIR).select(schemas.sample_schema().names)
    points = samples.column("num_points").to_pylist()
    points[3] = None
    holey = samples.set_column(samples.schema.get_field_index("num_points"), "num_points", pa.array(points))
    got = _numeric(_file(holey, row_group_size=7), ["sample_id", "num_points"])
    assert got.column_names == [*previous.NUMERIC, "sample_id"]
    assert got.schema.field("sample_id").type == pa.string()
    assert got.column("num_points").to_pylist() == points and got.column("num_points").null_count == 1
    assert got.column("sample_id").to_pylist() == samples.column("sample_id").to_pylist()


def test_a_parked_part_task_carries_no_rows_and_unparks_whole(tmp_path: Path) -> None:
    """What the build's SpreadParts shuffle carries of a part task: its numbers, its arrays in scratch."""
    keep = np.array([True, False, True, True])
    task = previous.PartTask(3, "in.parquet", (0, 2), keep, np.array([1.5, 2.0, 3.25]),
                             np.array([0, 2, 1], np.int32), np.ones(3), ("/a", None))  # fmt: skip
    previous.park_keep(str(tmp_path / "part-00003"), task.keep)
    previous.park_scores(str(tmp_path / "part-00003"), task.cost, task.bucket_id, task.weight)
    parked = previous.parked(task)
    assert (parked.keep.size, parked.cost.size, parked.bucket_id.size, parked.weight.size) == (0, 0, 0, 0)
    assert (parked.part, parked.path, parked.groups, parked.roots) == (3, "in.parquet", (0, 2), ("/a", None))
    back = previous.unpark(parked, str(tmp_path / "part-00003"))
    for name in ("keep", "cost", "bucket_id", "weight"):
        got, want = getattr(back, name), getattr(task, name)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()


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


#: Rows of the input files of the part tests (one empty), rows per row group, rows per part.
INPUT_ROWS, GROUP, PART = (35, 0, 55), 7, 14


def _inputs(built: Path, where: Path) -> tuple[pa.Table, list[str]]:
    """The built samples (sample columns) as input files of ``INPUT_ROWS`` rows: (table, paths)."""
    samples = pq.read_table(built / schemas.SAMPLES_DIR).select(schemas.sample_schema().names)
    assert samples.num_rows == sum(INPUT_ROWS)
    where.mkdir()
    paths, first = [], 0
    for k, n in enumerate(INPUT_ROWS):
        paths.append(str(where / schemas.part_name(k)))
        pq.write_table(samples.slice(first, n), paths[-1], row_group_size=GROUP)
        first += n
    return samples, paths


def _group_rows(file: pq.ParquetFile) -> list[int]:
    return [file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups)]


def _scores(samples: pa.Table) -> tuple[np.ndarray, ...]:
    """keep (rows 49..62, a whole part of the second file, dropped) and one cost, bucket and weight
    per kept row."""
    rng = np.random.default_rng(7)
    keep = rng.random(samples.num_rows) < 0.7
    keep[35 + PART : 35 + 2 * PART] = False
    n = int(keep.sum())
    return keep, rng.lognormal(0.0, 1.0, n), rng.integers(0, 3, n).astype(np.int32), rng.random(n)


def test_part_tasks_cut_at_every_input_file_and_every_part_rows(built: Path, tmp_path: Path) -> None:
    """Whole row groups of one input file a part, cut once ``part_rows`` input rows are reached;
    parts with no kept row dropped; the rest numbered 0..n-1 holding every kept row once, in order."""
    samples, paths = _inputs(built, tmp_path / "in")
    keep, cost, bucket, weight = _scores(samples)
    roots = (None, None)
    with parts.open_parts(paths) as file:
        tasks = _part_tasks(file, paths, keep, cost, bucket, weight, roots, PART)
    groups = {p: _group_rows(pq.ParquetFile(p)) for p in paths}
    assert [t.part for t in tasks] == list(range(len(tasks)))
    starts = dict(zip(paths, np.cumsum([0, *INPUT_ROWS]).tolist(), strict=False))
    covered, kept_rows = {p: 0 for p in paths}, []
    for t in tasks:
        sizes = groups[t.path]
        lo, hi = t.groups
        first = sum(sizes[:lo])
        rows = sum(sizes[lo:hi])
        assert lo < hi and t.keep.size == rows and t.keep.any()
        assert rows >= PART or hi == len(sizes)  # cut at part_rows or at the file's end
        assert rows - sizes[hi - 1] < PART  # not a group later than that
        skipped = keep[starts[t.path] + covered[t.path] : starts[t.path] + first]
        assert not skipped.any()  # only parts without a kept row are left out
        assert np.array_equal(t.keep, keep[starts[t.path] + first : starts[t.path] + first + rows])
        covered[t.path] = first + rows
        kept_rows += (starts[t.path] + first + np.flatnonzero(t.keep)).tolist()
        assert t.roots == roots
    assert kept_rows == np.flatnonzero(keep).tolist()
    cuts = [(t.path, t.groups) for t in tasks]
    assert (paths[0], (0, 2)) in cuts and (paths[0], (4, 5)) in cuts  # a short part at a file's end
    assert not any(t.path == paths[2] and t.groups == (2, 4) for t in tasks)  # its rows all dropped
    assert not any(t.path == paths[1] for t in tasks)  # an empty input file gives no part
    offsets = np.cumsum([0, *(int(t.keep.sum()) for t in tasks)])
    for t, a, b in zip(tasks, offsets[:-1], offsets[1:], strict=True):
        assert np.array_equal(t.cost, cost[a:b]) and np.array_equal(t.bucket_id, bucket[a:b])
        assert np.array_equal(t.weight, weight[a:b])
    with parts.open_parts(paths) as file:
        whole = _part_tasks(file, paths, keep, cost, bucket, weight, roots, 10**9)
    assert [(t.path, t.groups) for t in whole] == [(paths[0], (0, 5)), (paths[2], (0, 8))]


def test_parts_written_by_their_tasks_are_the_kept_table_scored(built: Path, tmp_path: Path) -> None:
    """Every task's part written and concatenated: the kept rows, re-rooted, with their scores, as
    ``scored_schema()``; the kept rows' fingerprint read across the files is that of the kept table."""
    samples, paths = _inputs(built, tmp_path / "in")
    keep, cost, bucket, weight = _scores(samples)
    root = str(built.parent)
    roots = (f"{root}/in", root)
    with parts.open_parts(paths) as file:
        tasks = _part_tasks(file, paths, keep, cost, bucket, weight, roots, PART)
        assert previous.fingerprint_kept(file, keep) == fingerprint(samples.filter(pa.array(keep)))
        assert previous.fingerprint_kept(file) == fingerprint(samples)
    written = []
    for t in tasks:
        sink = pa.BufferOutputStream()
        out = previous.write_part(pq.ParquetFile(t.path), t, sink)
        data = sink.getvalue().to_pybytes()
        assert (out.bytes, out.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        written.append(pq.read_table(pa.BufferReader(data)))
    kept = samples.filter(pa.array(keep))
    want = previous.reroot(kept, roots)
    assert want.column("path")[0].as_py() == "in/" + kept.column("path")[0].as_py()
    scored = schemas.scored_schema()
    for name, values in (("cost", cost), ("bucket_id", bucket), ("weight", weight)):
        want = want.append_column(scored.field(name), pa.array(values, scored.field(name).type))
    got = pa.concat_tables(written)
    assert got.schema.equals(scored) and got.equals(want.cast(scored))
    assert [w.num_rows for w in written] == [int(t.keep.sum()) for t in tasks]
