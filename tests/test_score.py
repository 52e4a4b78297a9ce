"""``transforms.features.score``: the one settle-and-score path, and the build core around it
(``transforms.beam.build.BuildManifest``) as a Beam graph."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.util import assert_that, equal_to

from lidarshard import schemas
from lidarshard.tools.validate import validate
from lidarshard.transforms.beam.build_transform import BuildJob, BuildManifest
from lidarshard.transforms.core import previous
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.score import GIVEN, ScoreSettings, Source, prepare, settle_and_score
from lidarshard.transforms.features.accounting import DEDUPE_ORDER, TooManyRejects, dedupe
from lidarshard.transforms.features.cost import CostModel
from lidarshard.transforms.features.repeat import WeightSpec
from lidarshard.transforms.io.scratch import scores_path
from lidarshard.transforms.plan.caps import Caps
from tests.helpers import samples_table

VOXELS = CostModel("voxels", b=1.0)


def _samples(ids: list[str], points: list[int], paths: list[str] | None = None) -> pa.Table:
    return samples_table(ids, points, paths)


def _write(path: Path, table: pa.Table) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return str(path)


def _settings(tmp: Path, fraction: float = 1.0) -> ScoreSettings:
    return ScoreSettings(fraction, str(tmp / "OUT.rejects.parquet"), 1 << 20)


def _written(tmp: Path):
    files: dict[str, bytes] = {}

    def write(rel: str, data: bytes) -> None:
        files[rel] = data

    return files, write


def _settle(source: Source, model: CostModel, cfg: PlanConfig, settings: ScoreSettings, write, tmp: Path):
    """``settle_and_score`` with its scratch under ``tmp``: (metadata, the part tasks unparked)."""
    work = str(tmp / "work")
    meta, tasks = settle_and_score(source, model, cfg, settings, write, work)
    return meta, [previous.unpark(t, scores_path(work, t.part)) for t in tasks]


def test_unsorted_sources_are_sorted_once_and_repeats_become_rejects(tmp_path: Path) -> None:
    table = _samples(["c", "a", "b", "a"], [30, 10, 20, 40], ["/d/c", "/d/a2", "/d/b", "/d/a1"])
    source = Source((_write(tmp_path / "in.parquet", table),))
    cfg = PlanConfig(world_size=1, batch_size=1)
    ready = prepare(source, str(tmp_path / "work"))
    assert ready.ordered and ready.files != source.files
    assert pq.read_table(ready.files[0]).column("path").to_pylist() == ["/d/a1", "/d/a2", "/d/b", "/d/c"]
    files, write = _written(tmp_path)
    meta, tasks = _settle(ready, VOXELS, cfg, _settings(tmp_path), write, tmp_path)
    assert meta["counts"] == {
        "scanned": 4,
        "accepted": 3,
        "rejected": 1,
        "rejected_by_reason": {"duplicate_id": 1},
    }
    rejects = pq.read_table(pa.BufferReader(files[schemas.REJECTS_FILE]))
    assert rejects.column("path").to_pylist() == ["/d/a2"]  # the first by path stays
    assert [int(t.keep.sum()) for t in tasks] == [3]
    sorted_source = Source((_write(tmp_path / "sorted.parquet", table.sort_by("sample_id").slice(1)),))
    assert prepare(sorted_source, str(tmp_path / "work2")) == sorted_source  # nothing to do


def test_one_duplicate_rule_keeps_the_row_a_scan_shard_keeps_whatever_the_arrival(tmp_path: Path) -> None:
    """Two rows of one id and one path: the build keeps the first by DEDUPE_ORDER (here fewer points),
    as a scan shard does, in either arrival order."""
    table = _samples(["a", "a", "b"], [50, 40, 10], ["/d/a", "/d/a", "/d/b"])
    kept_by_scan = dedupe(table.sort_by([(k, "ascending") for k in DEDUPE_ORDER]))[0]
    for i, order in enumerate(([0, 1, 2], [1, 0, 2], [2, 0, 1])):
        ready = prepare(
            Source((_write(tmp_path / f"in{i}.parquet", table.take(order)),)), str(tmp_path / f"w{i}")
        )
        meta, tasks = _settle(
            ready, VOXELS, PlanConfig(1, 1), _settings(tmp_path), _written(tmp_path)[1], tmp_path / f"s{i}"
        )
        points = pq.read_table(ready.files[0]).column("num_points").to_numpy()[tasks[0].keep]
        assert points.tolist() == kept_by_scan.column("num_points").to_pylist() == [40, 10]
        assert meta["counts"]["rejected_by_reason"] == {"duplicate_id": 1}


def test_caps_given_costs_and_the_reject_fraction(tmp_path: Path) -> None:
    table = _samples(["a", "b", "c", "d"], [10, 20, 5000, 30]).append_column(
        "cost", pa.array([1.0, 2.0, 9.0, 3.0])
    )
    source = Source((_write(tmp_path / "in.parquet", table),))
    cfg = PlanConfig(world_size=1, batch_size=1, caps=Caps(max_points=1000))
    files, write = _written(tmp_path)
    meta, tasks = _settle(source, GIVEN, cfg, _settings(tmp_path), write, tmp_path)
    assert meta["counts"]["rejected_by_reason"] == {"over_cap": 1} and meta["model"]["name"] == "given"
    assert tasks[0].cost.tolist() == [1.0, 2.0, 3.0] and tasks[0].keep.tolist() == [True, True, False, True]
    with pytest.raises(TooManyRejects, match="OUT.rejects.parquet"):
        _settle(source, GIVEN, cfg, _settings(tmp_path, 0.1), write, tmp_path)
    assert pq.read_table(tmp_path / "OUT.rejects.parquet").column("reason").to_pylist() == ["over_cap"]
    bad = table.set_column(table.schema.get_field_index("cost"), "cost", pa.array([1.0, -1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="finite value >= 0"):
        _settle(
            Source((_write(tmp_path / "bad.parquet", bad),)), GIVEN, cfg, _settings(tmp_path), write, tmp_path
        )
    with pytest.raises(ValueError, match="not sorted by sample_id"):
        unsorted = Source((_write(tmp_path / "u.parquet", table.take([1, 0, 2, 3])),))
        _settle(unsorted, GIVEN, cfg, _settings(tmp_path), write, tmp_path)


def test_build_graph_writes_a_valid_manifest(tmp_path: Path) -> None:
    """The build core as a Beam graph (TestPipeline, assert_that): a source with a repeated id and a
    sample over the cap -> one manifest whose counts hold the rejects, which validate accepts."""
    n = 40
    ids = [f"s{i:03d}" for i in range(n)]
    points = [100 + (i * 37) % 300 for i in range(n)]
    points[5] = 100_000  # over the cap
    table = _samples(ids + ["s007"], points + [1], [f"/d/{s}.bin" for s in ids] + ["/e/dup.bin"])
    table = table.sort_by([("sample_id", "ascending"), ("path", "ascending")])
    source = Source((_write(tmp_path / "in.parquet", table),), ordered=True)
    staging = tmp_path / "staging"
    cfg = PlanConfig(world_size=2, batch_size=3, epochs=2, seed=1, caps=Caps(max_points=50_000))
    job = BuildJob(
        str(staging),
        {"schema_version": schemas.SCHEMA_VERSION, "created_by": "test", "path_root": None},
        cfg,
        VOXELS,
        _settings(tmp_path),
    )
    with BeamPipeline(runner="FnApiRunner") as p:
        written = p | beam.Create([source]) | BuildManifest(job)
        counts = written | beam.Map(lambda m: (m["counts"]["accepted"], m["counts"]["rejected_by_reason"]))
        assert_that(counts, equal_to([(n - 1, {"duplicate_id": 1, "over_cap": 1})]))
        epochs = written | "Epochs" >> beam.Map(
            lambda m: (m["epochs"], len(m["balance"]), m["pair_repeat_rate"] is not None)
        )
        assert_that(epochs, equal_to([(2, 2, True)]), label="TwoEpochs")
    assert not (staging / schemas.WORK_DIR).exists()
    (staging / schemas.SUCCESS_FILE).write_bytes(b"")
    assert validate(str(staging))[0] == []
    plan = pq.read_table(staging / "plan")
    assert (
        plan.num_rows == 2 * ((n - 1) // 6 * 6)
        and np.isin("s005", plan.column("sample_id").to_numpy(False)).sum() == 0
    )


def _scored_parts(meta: dict, tasks: list, files: dict[str, bytes]) -> tuple:
    """What a settle-and-score run gives the build, parts joined: (metadata, rejects bytes, keep, costs,
    bucket ids, weights)."""
    joined = [np.concatenate([getattr(t, a) for t in tasks]) for a in ("keep", "cost", "bucket_id", "weight")]
    return ({k: v for k, v in meta.items() if k != "files"}, files[schemas.REJECTS_FILE], *joined)


@pytest.mark.parametrize("weighted", [False, True])
def test_settling_a_row_group_at_a_time_finds_what_one_whole_group_finds(
    tmp_path: Path, weighted: bool
) -> None:
    """Three files of 4-row groups cut into parts of 8 rows: repeated ids across a row group's and a
    file's edge, a sample over the cap, ``num_in_range`` missing in one row group only (so every
    sample is costed by its points, as the whole input is): the same counts, rejects, buckets,
    fingerprint, repeat counts and scores as one file of one row group, and the tasks come back
    parked (no array)."""
    n = 30
    ids = [f"s{i:03d}" for i in range(n)]
    ids[4] = ids[3]  # across a row group's edge (rows 3 | 4)
    ids[12] = ids[11]  # across a file's edge (rows 0-11 | 12-23 | 24-29)
    points = [10 + (i * 37) % 100 for i in range(n)]
    points[20] = 5_000  # over the cap
    table = _samples(ids, points)
    table = table.set_column(
        table.schema.get_field_index("num_in_range"),
        schemas.sample_schema().field("num_in_range"),
        pa.array([None if 16 <= i < 20 else p - 1 for i, p in enumerate(points)], pa.int64()),
    ).append_column("w", pa.array([1.0 + (i % 3) for i in range(n)]))
    cfg = PlanConfig(
        world_size=2, batch_size=2, num_buckets=4, caps=Caps(max_points=1000),
        repeat=WeightSpec(column="w") if weighted else WeightSpec(),
    )  # fmt: skip
    points_model = CostModel("points", a=1.0)
    runs = []
    for name, cuts, group_rows, part_rows in (
        ("whole", [(0, n)], n, 1 << 20),
        ("cut", [(0, 12), (12, 24), (24, n)], 4, 8),
    ):
        paths = []
        for k, (a, b) in enumerate(cuts):
            path = tmp_path / name / f"part-{k}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.slice(a, b - a), path, row_group_size=group_rows)
            paths.append(str(path))
        files, write = _written(tmp_path)
        settings = ScoreSettings(1.0, str(tmp_path / f"{name}.rejects.parquet"), part_rows)
        work = str(tmp_path / name / "work")
        meta, tasks = settle_and_score(
            Source(tuple(paths), ordered=True), points_model, cfg, settings, write, work
        )
        assert all(t.keep.size == t.cost.size == t.bucket_id.size == t.weight.size == 0 for t in tasks)
        tasks = [previous.unpark(t, scores_path(work, t.part)) for t in tasks]
        runs.append((len(tasks), _scored_parts(meta, tasks, files)))
    (one, whole), (many, cut) = runs
    assert one == 1 and many > 3
    assert whole[0] == cut[0] and whole[1] == cut[1]
    assert whole[0]["counts"]["rejected_by_reason"] == {"duplicate_id": 2, "over_cap": 1}
    assert (whole[0]["repeat"] is not None) == weighted
    for a, b in zip(whole[2:], cut[2:], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(whole[3], np.asarray(points, np.float64)[whole[2]])  # num_points costs
