"""lidarshard.loaders.reader: committed-dir checks, per-rank steps, resume, cycling, plan_dataset, load_points."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from manifest_fixture import make_fixture, sweep_offset

from lidarshard.loaders import ManifestReader, load_manifest, load_points, plan_dataset, read_samples
from lidarshard.schemas import MANIFEST_FILE, PLAN_FIELDS, SUCCESS_FILE, plan_file

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


def test_refuses_another_schema_major(out: Path) -> None:
    meta = json.loads((out / MANIFEST_FILE).read_text())
    meta["schema_version"] = "2.0"
    (out / MANIFEST_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="schema version '2.0'"):
        ManifestReader(out, 0, 2, 0)


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


def test_plan_dataset_holds_only_plan_partitions(out: Path) -> None:
    dataset = plan_dataset(out)
    assert dataset.schema.names == [name for name, _, _ in PLAN_FIELDS]
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
