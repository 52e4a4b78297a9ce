"""Size features against hand-computed values and the real files' provenance figures."""

from __future__ import annotations

import numpy as np
import pytest

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features.size import FEATURE_NAMES, compute_features, count_occupied_voxels

NUSCENES_KEYFRAME = (
    "nuscenes/samples/LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"
)


def _brute_voxels(xyz: np.ndarray, size: float) -> int:
    return len({tuple(v) for v in np.floor(xyz.astype(np.float64) / size).astype(np.int64).tolist()})


@pytest.mark.parametrize("size", [0.05, 0.2, 1.0])
def test_voxels_match_brute_force(size: float) -> None:
    xyz = np.random.default_rng(3).normal(scale=4.0, size=(5000, 3)).astype(np.float32)
    assert count_occupied_voxels(xyz, size) == _brute_voxels(xyz, size)


def test_voxels_fall_back_when_the_grid_overflows_int64() -> None:
    xyz = np.array([[-9e4, -9e4, -9e4], [9e4, 9e4, 9e4], [9e4, 9e4, 9e4], [0, 0, 0]], dtype=np.float32)
    assert count_occupied_voxels(xyz, 1e-6) == 3


@pytest.mark.parametrize(
    ("rel", "dims", "voxels"),
    [
        (NUSCENES_KEYFRAME, 5, 12641),
        ("kitti/training/velodyne_reduced/000008.bin", 4, 5612),
        ("scannet_demo/points/scene0000_00.bin", 6, 4392),
    ],
)
def test_real_files_match_provenance(realdata, rel: str, dims: int, voxels: int) -> None:
    pts = np.fromfile(realdata / rel, dtype=np.float32).reshape(-1, dims)
    f = compute_features(pts, voxel_size=0.2)
    assert f["occupied_voxels"] == voxels
    assert f["num_points"] == f["num_finite"] == f["num_in_range"] == len(pts)


def test_extents_percentiles_and_range_filter() -> None:
    xyz = np.stack([np.arange(100.0), np.zeros(100), np.full(100, 2.0)], axis=1).astype(np.float32)
    pts = np.concatenate([xyz, np.full((3, 3), np.nan, np.float32), np.full((2, 3), np.inf, np.float32)])
    f = compute_features(pts, point_cloud_range=(10, -1, 0, 50, 1, 3))
    assert set(f) == set(FEATURE_NAMES)
    # NaN and inf rows are no points (the loaders drop them, as open3d's remove_non_finite_points)
    assert (f["num_points"], f["num_finite"], f["num_in_range"]) == (100, 100, 40)
    assert (f["x_min"], f["x_max"]) == (10.0, 49.0)
    assert f["x_p01"] == pytest.approx(10.39) and f["x_p99"] == pytest.approx(48.61)
    assert f["occupied_voxels"] == 40


@pytest.mark.parametrize(
    ("points", "reason"),
    [
        (np.empty((0, 3), np.float32), "empty"),
        (np.full((10, 4), np.nan, np.float32), "non_finite"),
        (np.array([[1e30, 0, 0], [0, 0, 0]], np.float32), "absurd_coordinates"),
    ],
)
def test_bad_clouds_are_rejected(points: np.ndarray, reason: str) -> None:
    with pytest.raises(RejectError) as e:
        compute_features(points)
    assert e.value.reason == reason


def test_nothing_in_range_is_rejected() -> None:
    with pytest.raises(RejectError, match="empty_after_filter"):
        compute_features(np.ones((5, 3), np.float32) * 100, point_cloud_range=(-1, -1, -1, 1, 1, 1))
