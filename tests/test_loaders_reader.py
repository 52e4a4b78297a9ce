"""lidarshard.loaders.reader and .points: committed-dir checks, per-rank steps, resume, cycling, plan_dataset, load_points."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.loaders import ManifestReader, load_manifest, load_points, plan_dataset, read_samples
from lidarshard.schemas import MANIFEST_FILE, PLAN_DIR, PLAN_FIELDS, SCHEMA_VERSION, SUCCESS_FILE, plan_file
from tests.manifest_fixture import make_fixture, sweep_offset

REPO = Path(__file__).resolve().parents[1]
SIZES = [100 + 37 * i for i in range(23)]  # 23 samples, W*B = 4 -> 5 steps, 3 dropped


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return make_fixture(tmp_path, SIZES, world_size=2, batch_size=2, epochs=2, sweeps=1, sweep_size=10)


def test_yields_the_planned_steps_of_its_rank(out: Path) -> None:
    for rank in range(2):
        reader = ManifestReader(out, rank, 2, 0)
        batches = list(reader)
        assert len(reader) == len(batches) == 5 == reader.steps
        table = pq.read_table(out / plan_file(0, rank))
        table = table.sort_by([("step", "ascending"), ("slot", "ascending")])
        assert [b.step for b in batches] == list(range(5))
        assert [s for b in batches for s in b.sample_ids] == table["sample_id"].to_pylist()
        assert [p for b in batches for p in b.paths] == table["path"].to_pylist()
        assert all(len(b.sweep_paths) == 2 and len(b.sweep_paths[0]) == 1 for b in batches)
        assert np.concatenate([b.costs for b in batches]).tolist() == table["cost"].to_pylist()
    ids = [s for r in range(2) for b in ManifestReader(out, r, 2, 1) for s in b.sample_ids]
    assert len(ids) == len(set(ids)) == 20  # every planned sample once per epoch, across ranks


@pytest.mark.parametrize("start", [0, 1, 3, 5])
def test_resume_yields_exactly_the_remaining_batches(out: Path, start: int) -> None:
    full = list(ManifestReader(out, 1, 2, 1))
    resumed = ManifestReader(out, 1, 2, 1, start_step=start)
    rest = list(resumed)
    assert len(resumed) == len(rest) == 5 - start
    assert [(b.step, b.sample_ids) for b in rest] == [(b.step, b.sample_ids) for b in full[start:]]
    with pytest.raises(ValueError, match="start_step 6"):
        ManifestReader(out, 1, 2, 1, start_step=6)


def test_world_size_mismatch_names_both_numbers(out: Path) -> None:
    with pytest.raises(ValueError, match=r"world_size=3.*world_size=2"):
        ManifestReader(out, 0, 3, 0)
    with pytest.raises(ValueError, match="rank 2"):
        ManifestReader(out, 2, 2, 0)


def test_refuses_a_directory_without_success(out: Path) -> None:
    (out / SUCCESS_FILE).unlink()
    for call in (lambda: ManifestReader(out, 0, 2, 0), lambda: load_manifest(out), lambda: plan_dataset(out)):
        with pytest.raises(FileNotFoundError, match="not a committed lidarshard manifest"):
            call()


def test_refuses_a_v1_manifest_naming_both_versions_and_the_rebuild(out: Path) -> None:
    meta = json.loads((out / MANIFEST_FILE).read_text())
    meta["schema_version"] = "1.0"
    (out / MANIFEST_FILE).write_text(json.dumps(meta))
    want = (
        rf"{out} was written with manifest schema 1\.0; this lidarshard reads 4\.x \(writes {re.escape(SCHEMA_VERSION)}\): rebuild it "
        rf"without rescanning with `lidarshard build NEW_OUT --from-samples {out}/samples\.parquet "
        r"--world-size 2 --batch-size 2 --epochs 2 --seed 0 --strategy fixture_sorted_lpt`"
    )
    for call in (lambda: ManifestReader(out, 0, 2, 0), lambda: plan_dataset(out), lambda: read_samples(out)):
        with pytest.raises(ValueError, match=want):
            call()


@pytest.mark.parametrize(
    ("key", "value"),
    [("epochs", 2.5), ("epochs", "2"), ("world_size", True), ("batch_size", 0), ("steps_per_epoch", [5])],
)
def test_refuses_a_manifest_with_malformed_plan_keys(out: Path, key: str, value: object) -> None:
    meta = json.loads((out / MANIFEST_FILE).read_text())
    meta[key] = value
    (out / MANIFEST_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"_manifest.json: {key} must"):
        ManifestReader(out, 0, 2, 0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rank": 0.5}, TypeError, r"rank must be an int, got 0\.5 \(float\)"),
        ({"rank": True}, TypeError, r"rank must be an int, got True \(bool\)"),
        ({"rank": "0"}, TypeError, r"rank must be an int, got '0' \(str\)"),
        ({"rank": -1}, ValueError, r"rank -1 is outside 0\.\.1"),
        ({"world_size": 2.9}, TypeError, r"world_size must be an int, got 2\.9"),
        ({"world_size": np.float64(2)}, TypeError, "world_size must be an int"),
        ({"epoch": 1.0}, TypeError, r"epoch must be an int, got 1\.0"),
        ({"epoch": False}, TypeError, "epoch must be an int, got False"),
        ({"start_step": 2.0}, TypeError, "start_step must be an int"),
    ],
)
def test_rank_world_size_epoch_must_be_real_ints(out: Path, kwargs: dict, error: type, match: str) -> None:
    args = {"rank": 0, "world_size": 2, "epoch": 0} | kwargs
    start = args.pop("start_step", 0)
    with pytest.raises(error, match=match):
        ManifestReader(out, args["rank"], args["world_size"], args["epoch"], start_step=start)
    assert ManifestReader(out, np.int64(1), np.int32(2), np.int8(1)).rank == 1  # numpy ints are ints


def test_unplanned_epoch_errors_unless_cycle(out: Path) -> None:
    with pytest.raises(ValueError, match="epoch 2 was not planned"):
        ManifestReader(out, 0, 2, 2)
    with pytest.warns(UserWarning, match="reuses the plan of epoch 1"):
        cycled = ManifestReader(out, 0, 2, 3, cycle=True)
    assert cycled.epoch == 3 and cycled.plan_epoch == 1
    assert [b.sample_ids for b in cycled] == [b.sample_ids for b in ManifestReader(out, 0, 2, 1)]
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        ManifestReader(out, 0, 2, -1, cycle=True)


def test_malformed_plan_is_refused(out: Path) -> None:
    path = out / plan_file(0, 1)
    pq.write_table(pq.read_table(path).slice(0, 9), path)
    with pytest.raises(ValueError, match="malformed"):
        ManifestReader(out, 1, 2, 0)


def test_an_empty_rank_directory_names_itself(out: Path) -> None:
    (out / plan_file(0, 1)).unlink()
    with pytest.raises(ValueError, match=r"plan/epoch-0/rank-1: the rank directory holds no plan file"):
        ManifestReader(out, 1, 2, 0)


@pytest.mark.parametrize("name", ["notes.txt", "part-00001.parquet"])
def test_a_foreign_or_empty_file_in_the_plan_tree_is_named(out: Path, name: str) -> None:
    stray = out / plan_file(0, 1).replace("part-00000.parquet", name)
    stray.write_bytes(b"")
    what = "not a plan file" if name.endswith(".txt") else "not a readable plan file"
    with pytest.raises(ValueError, match=rf"{stray}: {what}"):
        ManifestReader(out, 1, 2, 0)
    with pytest.raises(ValueError, match=rf"{stray}: not a"):
        plan_dataset(out)
    assert len(ManifestReader(out, 0, 2, 0)) == 5  # other ranks still read


def test_a_stray_file_at_the_plan_root_is_named(out: Path) -> None:
    (out / PLAN_DIR / "README.md").write_text("notes")
    with pytest.raises(ValueError, match=rf"{out / PLAN_DIR / 'README.md'}: not a plan file"):
        plan_dataset(out)


def test_plan_dataset_holds_only_plan_partitions(out: Path) -> None:
    dataset = plan_dataset(out)
    assert dataset.schema.names == [name for name, _, _ in PLAN_FIELDS]
    assert PLAN_FIELDS[:2] == schemas.PLAN_KEY_FIELDS
    assert dataset.schema.field("epoch").type == dataset.schema.field("rank").type == pa.int32()
    table = dataset.to_table()
    assert table.num_rows == 2 * 5 * 2 * 2  # epochs * steps * ranks * batch
    part = dataset.to_table(filter=(ds.field("epoch") == 1) & (ds.field("rank") == 0))
    part = part.sort_by([("step", "ascending"), ("slot", "ascending")])
    assert part["sample_id"].to_pylist() == [s for b in ManifestReader(out, 0, 2, 1) for s in b.sample_ids]


def test_uri_out_dir(out: Path) -> None:
    uri = out.resolve().as_uri()  # file:///...
    assert [b.sample_ids for b in ManifestReader(uri, 0, 2, 0)] == [
        b.sample_ids for b in ManifestReader(out, 0, 2, 0)
    ]
    assert plan_dataset(uri).count_rows() == 40
    assert read_samples(uri, ["sample_id"]).num_rows == 23


def test_load_points_aggregates_sweeps(out: Path) -> None:
    row = read_samples(out).slice(4, 1).to_pylist()[0]
    key = np.fromfile(row["path"], np.float32).reshape(-1, 5)
    sweep = np.fromfile(row["sweep_paths"][0], np.float32).reshape(-1, 5)
    pts = load_points(row["path"], row["format"], row["sweep_paths"], row["sweep_transforms"])
    assert pts.dtype == np.float32 and pts.shape == (SIZES[4] + 10, 5) == (row["num_points"], 5)
    np.testing.assert_array_equal(pts[: SIZES[4]], key)
    np.testing.assert_allclose(pts[SIZES[4] :, 0], sweep[:, 0] + sweep_offset(0)[0, 3], rtol=1e-6)
    np.testing.assert_array_equal(pts[SIZES[4] :, 3:], sweep[:, 3:])
    only_key = load_points(row["path"], None)  # format detected from the extension
    np.testing.assert_array_equal(only_key, key)
    with pytest.raises(ValueError, match="transform values"):
        load_points(row["path"], row["format"], row["sweep_paths"], [])


def test_import_loaders_pulls_neither_beam_nor_torch() -> None:
    code = "import sys, loaders; assert not {'apache_beam', 'torch'} & set(sys.modules), sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_loaders_torch_without_torch_names_the_extra() -> None:
    code = "import sys; sys.modules['torch'] = None; import lidarshard.loaders.torch"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert 'pip install "lidarshard[torch]"' in proc.stderr
