"""The close-point rule (``--close-points``): recorded by the scan, its size features computed under it, applied
by the loaders, refused where it would not match (issue 39)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lidarshard  # noqa: E402
from lidarshard.loaders import read_samples  # noqa: E402
from lidarshard.loaders.points import load_points  # noqa: E402
from lidarshard.loaders.torch import PointCloudDataset  # noqa: E402
from lidarshard.transforms.layouts.multisweep import aggregate, recorded_close_points  # noqa: E402
from lidarshard.transforms.value_checks import UsageError  # noqa: E402
from tests.manifest_fixture import make_fixture  # noqa: E402

CLOSE = np.array([0.2, -0.3, 1.0, 7.0, 0.0], np.float32)  # inside the |x| < 1, |y| < 1 m box


def _with_close_rows(out: Path) -> None:
    """Make the first row of every keyframe and sweep file a close point (same sizes: nothing else changes)."""
    for row in read_samples(out, ["path", "sweep_paths"]).to_pylist():
        for path in [row["path"], *row["sweep_paths"]]:
            pts = np.fromfile(path, np.float32).reshape(-1, 5)
            pts[0] = CLOSE
            pts.tofile(path)


def _record(out: Path, rule: str) -> None:
    """Record ``rule`` as the scan's (the fixture writes no scan provenance)."""
    meta = json.loads((out / "_manifest.json").read_text())
    meta["scan_config"] = {"close_points": rule}
    (out / "_manifest.json").write_text(json.dumps(meta))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    out = make_fixture(
        tmp_path, [40, 30, 20, 50], world_size=1, batch_size=2, epochs=1, sweeps=2, sweep_size=9
    )
    _with_close_rows(out)
    return out


def _clouds(out: Path, i: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    row = read_samples(out).to_pylist()[i]
    key = np.fromfile(row["path"], np.float32).reshape(-1, 5)
    sweeps = [np.fromfile(p, np.float32).reshape(-1, 5) for p in row["sweep_paths"]]
    return key, sweeps, list(np.asarray(row["sweep_transforms"]).reshape(-1, 4, 4))


@pytest.mark.parametrize("rule", ["sweeps", "devkit", "none"])
def test_the_dataset_applies_the_recorded_rule(out: Path, rule: str) -> None:
    _record(out, rule)
    dataset = PointCloudDataset(out)
    assert dataset.close_points == rule
    key, sweeps, mats = _clouds(out, 1)
    pts = dataset[1]["points"].numpy()
    np.testing.assert_array_equal(pts, aggregate(key, sweeps, mats, close_points=rule))
    assert len(pts) == {"sweeps": 30 + 2 * 8, "devkit": 29 + 2 * 8, "none": 30 + 2 * 9}[rule]
    alone = PointCloudDataset(out, sweeps=False)[1]["points"].numpy()
    np.testing.assert_array_equal(alone, key[1:] if rule == "devkit" else key)


def test_a_manifest_without_a_rule_is_read_as_sweeps(out: Path) -> None:
    assert recorded_close_points({}) == recorded_close_points({"scan_config": {}}) == "sweeps"
    assert PointCloudDataset(out).close_points == "sweeps"
    with pytest.raises(ValueError, match=r"scan_config.close_points: close_points must be one of .*got 'al'"):
        recorded_close_points({"scan_config": {"close_points": "al"}})


def test_another_rule_than_the_recorded_one_is_refused(out: Path) -> None:
    _record(out, "devkit")
    assert PointCloudDataset(out, close_points="devkit").close_points == "devkit"
    with pytest.raises(ValueError, match=r"close_points='sweeps': this manifest's size features were computed "
                       r"under 'devkit' \(scan_config.close_points\); rebuild with --close-points sweeps"):  # fmt: skip
        PointCloudDataset(out, close_points="sweeps")
    with pytest.raises(ValueError, match="close_points must be one of sweeps, devkit, none, got 'both'"):
        PointCloudDataset(out, close_points="both")


def test_labels_are_refused_under_devkit(out: Path) -> None:
    _record(out, "devkit")
    with pytest.raises(ValueError, match="labels=True: under close_points 'devkit' the keyframe loses"):
        PointCloudDataset(out, labels=True)


def test_load_points_takes_the_rule(out: Path) -> None:
    row = read_samples(out).to_pylist()[0]
    key, sweeps, mats = _clouds(out, 0)
    for rule in ("sweeps", "devkit", "none"):
        got = load_points(row["path"], None, row["sweep_paths"], row["sweep_transforms"], close_points=rule)
        np.testing.assert_array_equal(got, aggregate(key, sweeps, mats, close_points=rule))
    np.testing.assert_array_equal(load_points(row["path"], None, close_points="devkit"), key[1:])


def _loose(root: Path) -> Path:
    """Three keyframe-only .pcd.bin files, each with one close point."""
    rng = np.random.default_rng(3)
    root.mkdir()
    for i, n in enumerate((30, 40, 50)):
        pts = rng.uniform(5, 20, (n, 5)).astype(np.float32)
        pts[3] = CLOSE
        pts.tofile(root / f"f{i}.pcd.bin")
    return root


def test_build_records_the_rule_and_the_features_count_what_the_trainer_gets(tmp_path: Path) -> None:
    data = _loose(tmp_path / "data")
    out = tmp_path / "out"
    lidarshard.build(
        str(data), str(out), world_size=1, batch_size=1, runner="FnApiRunner", close_points="devkit"
    )
    meta = json.loads((out / "_manifest.json").read_text())
    assert meta["scan_config"]["close_points"] == "devkit"
    dataset = PointCloudDataset(out)
    recorded = read_samples(out, ["num_points"])["num_points"].to_pylist()
    assert [len(dataset[i]["points"]) for i in range(len(dataset))] == recorded == [29, 39, 49]
    again = tmp_path / "again"
    lidarshard.build(None, str(again), world_size=1, batch_size=1, runner="FnApiRunner",
                     from_samples=str(out / "samples"))  # fmt: skip
    assert json.loads((again / "_manifest.json").read_text())["scan_config"]["close_points"] == "devkit"
    with pytest.raises(UsageError, match="--close-points none: .* was scanned under --close-points devkit"):
        lidarshard.build(None, str(tmp_path / "x"), world_size=1, batch_size=1, runner="FnApiRunner",
                         from_samples=str(out / "samples"), close_points="none")  # fmt: skip
