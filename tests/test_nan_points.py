"""Rows with a NaN in x, y or z (organised PCDs' no-return pixels) are not points: the loaders drop them by
default, as open3d's ``remove_nan_points``, and the scan's ``num_points`` counts the rows the trainer gets
(issue 39)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lidarshard  # noqa: E402
from lidarshard.loaders import read_samples  # noqa: E402
from lidarshard.loaders.points import load_points  # noqa: E402
from lidarshard.loaders.torch import PointCloudDataset  # noqa: E402
from lidarshard.transforms.formats.readers import read_points  # noqa: E402
from lidarshard.transforms.layouts.multisweep import drop_nan_rows  # noqa: E402

MUG = "pcd/pcl/table_scene_mug_stereo_textured.pcd"


def test_drop_nan_rows_drops_a_nan_in_any_of_x_y_z_and_keeps_inf() -> None:
    pts = np.arange(24, dtype=np.float32).reshape(6, 4)
    pts[1, 0] = pts[2, 1] = pts[3, 2] = np.nan
    pts[4, 3] = np.nan  # a NaN past z is a value, not a missing point
    pts[5, 0] = np.inf
    np.testing.assert_array_equal(drop_nan_rows(pts), pts[[0, 4, 5]])
    clean = pts[[0, 5]]
    assert drop_nan_rows(clean) is clean


def test_an_organised_pcd_gives_the_trainer_the_rows_the_scan_counted(tmp_path: Path, realdata: Path) -> None:
    path = realdata / MUG
    raw = read_points(path.read_bytes(), "pcd")
    nan = np.isnan(raw[:, :3]).any(axis=1)
    assert (len(raw), int(nan.sum())) == (307_200, 97_920)
    out = tmp_path / "out"
    lidarshard.build(
        str(path.parent / "table_scene_mug_*.pcd"), str(out), world_size=1, batch_size=1, runner="FnApiRunner"
    )
    assert read_samples(out, ["num_points"])["num_points"].to_pylist() == [307_200 - 97_920]
    pts = PointCloudDataset(out)[0]["points"].numpy()
    np.testing.assert_array_equal(pts, raw[~nan])
    np.testing.assert_array_equal(PointCloudDataset(out, keep_nan=True)[0]["points"].numpy(), raw)
    np.testing.assert_array_equal(load_points(str(path), "pcd"), raw[~nan])
    np.testing.assert_array_equal(load_points(str(path), "pcd", drop_nan=False), raw)


def test_labels_lose_the_rows_their_points_lose(tmp_path: Path) -> None:
    """A labelled SemanticKITTI-style scan with NaN rows: each kept point keeps its own label."""
    from tests.manifest_fixture import write_manifest

    pts = np.arange(40, dtype=np.float32).reshape(10, 4) + 2.0
    pts[[2, 7], 1] = np.nan
    (tmp_path / "k.pcd.bin").write_bytes(np.c_[pts, np.zeros(10, np.float32)].tobytes())
    (tmp_path / "k_lidarseg.bin").write_bytes(np.arange(10, dtype=np.uint8).tobytes())
    cols = {
        "sample_id": ["k"],
        "path": [str(tmp_path / "k.pcd.bin")],
        "label_path": [str(tmp_path / "k_lidarseg.bin")],
    }
    out = write_manifest(tmp_path / "out", cols, world_size=1, batch_size=1, epochs=1)
    item = PointCloudDataset(out, labels=True)[0]
    assert item["labels"].tolist() == [0, 1, 3, 4, 5, 6, 8, 9]
    np.testing.assert_array_equal(item["points"].numpy()[:, :4], pts[[0, 1, 3, 4, 5, 6, 8, 9]])
    assert PointCloudDataset(out, labels=True, keep_nan=True)[0]["labels"].tolist() == list(range(10))
