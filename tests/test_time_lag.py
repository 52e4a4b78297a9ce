"""The time-lag channel (issue 39): the samples' ``sweep_time_lags`` and ``PointCloudDataset(time_lag=True)``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import yaw_tf

torch = pytest.importorskip("torch")

from lidarshard.loaders import read_samples  # noqa: E402
from lidarshard.loaders.points import load_points  # noqa: E402
from lidarshard.loaders.torch import PointCloudDataset  # noqa: E402
from lidarshard.transforms.layouts.multisweep import aggregate  # noqa: E402
from tests.manifest_fixture import write_clouds, write_manifest  # noqa: E402

LAGS = [0.05, 0.1]


def test_aggregate_appends_the_lag_of_each_cloud_after_close_point_removal() -> None:
    key = np.array([[0.1, 0.1, 0.0, 7], [5.0, 0.0, 0.0, 8]], np.float32)
    sweeps = [np.array([[0.5, 0.0, 0.0, 9], [2.0, 0.0, 1.0, 10]], np.float32), np.zeros((0, 4), np.float32)]
    tfs = [yaw_tf(0.0, (10.0, 0.0, 0.0)), np.eye(4)]
    for rule, lags in (("sweeps", [0, 0, 0.5]), ("devkit", [0, 0.5]), ("none", [0, 0, 0.5, 0.5])):
        out = aggregate(key, sweeps, tfs, close_points=rule, time_lags=[0.5, 0.55])
        assert out.dtype == np.float32 and out.shape == (len(lags), 5)
        np.testing.assert_array_equal(out[:, :4], aggregate(key, sweeps, tfs, close_points=rule))
        np.testing.assert_array_equal(out[:, 4], np.float32(lags))
    np.testing.assert_array_equal(aggregate(key, [], [], time_lags=[]), np.c_[key, np.zeros(2, np.float32)])
    with pytest.raises(ValueError, match="2 sweeps but 1 time lags"):
        aggregate(key, sweeps, tfs, time_lags=[0.5])


def _manifest(tmp_path: Path, lags: bool = True) -> Path:
    cols = write_clouds(tmp_path / "data", [40, 30, 20], sweeps=2, sweep_size=9, seed=1)
    if lags:
        cols["sweep_time_lags"] = [LAGS] * 3
    return write_manifest(tmp_path / "out", cols, world_size=1, batch_size=1, epochs=1)


def test_dataset_appends_the_time_lag_column(tmp_path: Path) -> None:
    out = _manifest(tmp_path)
    row = read_samples(out).to_pylist()[1]
    plain = PointCloudDataset(out)[1]["points"].numpy()
    pts = PointCloudDataset(out, time_lag=True)[1]["points"].numpy()
    assert pts.dtype == np.float32 and pts.shape == (len(plain), plain.shape[1] + 1)
    np.testing.assert_array_equal(pts[:, :-1], plain)
    key = np.fromfile(row["path"], np.float32).reshape(-1, 5)
    sweeps = [np.fromfile(p, np.float32).reshape(-1, 5) for p in row["sweep_paths"]]
    mats = list(np.asarray(row["sweep_transforms"]).reshape(-1, 4, 4))
    np.testing.assert_array_equal(pts, aggregate(key, sweeps, mats, time_lags=LAGS))
    assert pts[:30, -1].tolist() == [0.0] * 30 and set(pts[30:, -1].tolist()) == {
        np.float32(0.05),
        np.float32(0.1),
    }
    alone = PointCloudDataset(out, sweeps=False, time_lag=True)[1]["points"].numpy()
    np.testing.assert_array_equal(alone, np.c_[key, np.zeros(30, np.float32)])
    got = load_points(row["path"], None, row["sweep_paths"], row["sweep_transforms"], time_lags=LAGS)
    np.testing.assert_array_equal(got, pts)


def test_time_lag_without_recorded_lags_is_refused_in_one_line(tmp_path: Path) -> None:
    out = _manifest(tmp_path, lags=False)
    with pytest.raises(
        ValueError, match=r"time_lag=True: 3 samples with sweeps record no sweep_time_lags \(first"
    ):
        PointCloudDataset(out, time_lag=True)
    assert PointCloudDataset(out, time_lag=True, sweeps=False)[0]["points"].shape[1] == 6  # keyframes: lag 0


def test_misaligned_lags_are_refused(tmp_path: Path) -> None:
    cols = write_clouds(tmp_path / "data", [40], sweeps=2, sweep_size=9, seed=1)
    cols["sweep_time_lags"] = [[0.05]]
    out = write_manifest(tmp_path / "out", cols, world_size=1, batch_size=1, epochs=1)
    with pytest.raises(ValueError, match="sweep_time_lags does not hold one value per sweep path"):
        PointCloudDataset(out)


def test_a_scan_records_the_lags_of_its_layout(tmp_path: Path) -> None:
    """A synthetic SemanticKITTI sequence (10 Hz): lags 0.1 s a scan, aligned with sweep_paths."""
    import lidarshard
    from lidarshard.pipelines.synth import run
    from tests.helpers import BEAM_TEST_FLAGS

    root = tmp_path / "kitti"
    flags = ["--layout", "semantickitti", "--scenes", "1", "--keyframes-per-scene", "3"]
    assert run([str(root), *flags, *BEAM_TEST_FLAGS]) == 0
    out = tmp_path / "out"
    lidarshard.build(str(root), str(out), world_size=1, batch_size=1, runner="FnApiRunner", sweeps=2)
    rows = read_samples(out, ["sample_id", "sweep_paths", "sweep_time_lags"]).to_pylist()
    assert [len(r["sweep_time_lags"]) for r in rows] == [len(r["sweep_paths"]) for r in rows] == [0, 1, 2]
    for r in rows:  # times.txt of a 10 Hz sequence: the k-th previous scan about k x 0.1 s before
        np.testing.assert_allclose(
            r["sweep_time_lags"], [0.1 * (k + 1) for k in range(len(r["sweep_paths"]))], atol=0.005
        )
    assert json.loads((out / "_manifest.json").read_text())["schema_version"] == "4.5"
    item = PointCloudDataset(out, time_lag=True)[0]["points"].numpy()
    assert item[:, -1].min() == 0.0
