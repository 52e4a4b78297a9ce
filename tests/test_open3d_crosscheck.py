"""Cross-check our PCD/PLY readers against open3d on every real file (skipped without open3d)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from lidarshard.transforms.formats.open3d_backend import read_points_open3d
from lidarshard.transforms.formats.readers import read_points

if importlib.util.find_spec("open3d") is None:  # imported by the backend when a test reads through it
    pytest.skip("open3d is not installed", allow_module_level=True)

REAL = [
    "pcd/mmdet3d_pr2611/8_0001.pcd",
    "pcd/pcl/bunny.pcd",
    "pcd/pcl/car6.pcd",
    "pcd/pcl/colored_cloud.pcd",
    "pcd/pcl/cturtle.pcd",
    "pcd/pcl/lamppost.pcd",
    "pcd/pcl/milk.pcd",
    "pcd/pcl/office1_keypoints.pcd",
    "pcd/pcl/table_scene_mug_stereo_textured.pcd",
    "ply/pcl/cube.ply",
]


@pytest.mark.parametrize("rel", REAL)
def test_xyz_matches_open3d(realdata, rel):
    data = (realdata / rel).read_bytes()
    fmt = rel.rsplit(".", 1)[-1]
    ours = read_points(data, fmt)[:, :3]
    theirs = read_points_open3d(data, fmt)
    assert theirs.shape == ours.shape  # NaN points kept by both: organized clouds stay WIDTH x HEIGHT
    ok_ours, ok_theirs = np.isfinite(ours).all(axis=1), np.isfinite(theirs).all(axis=1)
    np.testing.assert_array_equal(ok_ours, ok_theirs)
    np.testing.assert_allclose(ours[ok_ours], theirs[ok_theirs], rtol=0, atol=1e-6)


def test_open3d_drops_nan_points_on_request(realdata):
    data = (realdata / "pcd/pcl/table_scene_mug_stereo_textured.pcd").read_bytes()
    finite = read_points_open3d(data, "pcd", remove_nan_points=True)
    assert finite.shape == (209280, 3) and np.isfinite(finite).all()


def test_open3d_backend_rejects_other_formats():
    from lidarshard.transforms.errors import RejectError

    with pytest.raises(RejectError) as e:
        read_points_open3d(b"\0" * 16, "kitti_bin")
    assert e.value.reason == "unsupported_format"


@pytest.mark.parametrize("rel", [r for r in REAL if r.endswith(".pcd")])
def test_packed_colours_match_open3d(realdata, rel):
    """Every real PCD with a packed ``rgb``/``rgba`` field (TYPE F and U among them): our r, g, b
    channels equal open3d's colours (its 0..1 doubles are byte / 255) on every point."""
    import open3d as o3d

    from lidarshard.transforms.formats.pcd import parse_header

    data = (realdata / rel).read_bytes()
    columns = parse_header(data).columns
    cloud = o3d.io.read_point_cloud(
        str(realdata / rel), remove_nan_points=False, remove_infinite_points=False
    )
    theirs = np.rint(np.asarray(cloud.colors) * 255)
    if "r" not in columns:
        assert theirs.size == 0
        return
    i = columns.index("r")
    assert columns[i : i + 3] == ["r", "g", "b"]
    np.testing.assert_array_equal(read_points(data, "pcd")[:, i : i + 3], theirs)
