"""Tests of transforms/multisweep.py: close-point removal, sweep aggregation, lidarseg label check."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.layouts.multisweep import aggregate, check_labels, remove_close
from tests.helpers import yaw_tf

LIDARSEG = "nuscenes_lidarseg_pr2859"
LIDARSEG_POINTS = (
    f"{LIDARSEG}/samples/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470948018.pcd.bin"
)
LIDARSEG_LABELS = f"{LIDARSEG}/lidarseg/v1.0-trainval/5f6c1e0a0c3b444b97e78d2aa3fa34d2_lidarseg.bin"
N015 = "nuscenes/samples/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470948018.pcd.bin"
N015_SWEEP = "nuscenes/sweeps/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470898274.pcd.bin"


def _pts(rows: list[list[float]]) -> np.ndarray:
    return np.asarray(rows, dtype=np.float32)


def _devkit_multisweep(key: np.ndarray, sweeps: list[np.ndarray], tfs: list[np.ndarray]) -> np.ndarray:
    """Reference in the devkit's (C, N) layout: remove_close then transform, sweeps only."""
    out = [key.T]
    for sweep, tf in zip(sweeps, tfs, strict=True):
        pts = sweep.T.copy()
        close = np.logical_and(np.abs(pts[0, :]) < 1.0, np.abs(pts[1, :]) < 1.0)
        pts = pts[:, np.logical_not(close)]
        pts[:3, :] = tf.dot(np.vstack((pts[:3, :], np.ones(pts.shape[1]))))[:3, :]
        out.append(pts)
    return reduce(lambda a, b: np.hstack((a, b)), out).T


def test_remove_close_is_a_box_not_a_radius() -> None:
    pts = _pts(
        [
            [0.99, 0.99, 0.0, 1, 0],  # radius 1.4 but inside the box: removed
            [0.5, 0.5, 100.0, 2, 1],  # any z: removed
            [1.0, 0.0, 0.0, 3, 2],  # |x| == radius is not < radius: kept
            [0.0, -1.5, 0.0, 4, 3],  # outside in y: kept
            [-0.2, 0.3, -2.0, 5, 4],  # removed
            [np.nan, 0.0, 0.0, 6, 5],  # NaN is never close: kept
        ]
    )
    out = remove_close(pts)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[:, 3], [3, 4, 6])
    assert remove_close(pts, radius=2.0)[:, 3].tolist() == [6]


def test_remove_close_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="N, C>=3"):
        remove_close(np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="N, C>=3"):
        remove_close(np.zeros(12, np.float32))


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float32, st.tuples(st.integers(0, 40), st.integers(3, 6)), elements=st.floats(-3, 3, width=32))
)
def test_remove_close_keeps_exactly_the_rows_outside_the_box(pts: np.ndarray) -> None:
    out = remove_close(pts)
    keep = [i for i, p in enumerate(pts) if not (abs(p[0]) < 1.0 and abs(p[1]) < 1.0)]
    np.testing.assert_array_equal(out, pts[keep])


def test_aggregate_keeps_keyframe_whole_and_filters_sweeps_in_their_own_frame() -> None:
    key = _pts([[0.1, 0.1, 0.0, 7, 0], [5.0, 0.0, 0.0, 8, 1]])  # a close keyframe point stays
    sweep = _pts([[0.5, 0.0, 0.0, 9, 2], [2.0, 0.0, 1.0, 10, 3]])
    shift = yaw_tf(0.0, (10.0, 0.0, 0.0))  # would move the close point out of the box if applied first
    out = aggregate(key, [sweep], [shift])
    assert out.dtype == np.float32 and out.shape == (3, 5)
    np.testing.assert_array_equal(out[:2], key)
    np.testing.assert_array_equal(out[2], [12.0, 0.0, 1.0, 10, 3])


def test_aggregate_close_point_rules() -> None:
    """ "sweeps" keeps the keyframe whole, "devkit" filters every cloud, "none" no cloud."""
    key = _pts([[0.1, 0.1, 0.0, 7, 0], [5.0, 0.0, 0.0, 8, 1]])
    sweep = _pts([[0.5, 0.0, 0.0, 9, 2], [2.0, 0.0, 1.0, 10, 3]])
    shift = yaw_tf(0.0, (10.0, 0.0, 0.0))
    moved = _pts([[10.5, 0.0, 0.0, 9, 2], [12.0, 0.0, 1.0, 10, 3]])
    np.testing.assert_array_equal(
        aggregate(key, [sweep], [shift], close_points="sweeps"), np.vstack([key, moved[1:]])
    )
    np.testing.assert_array_equal(
        aggregate(key, [sweep], [shift], close_points="devkit"), np.vstack([key[1:], moved[1:]])
    )
    np.testing.assert_array_equal(
        aggregate(key, [sweep], [shift], close_points="none"), np.vstack([key, moved])
    )
    np.testing.assert_array_equal(aggregate(key, [], [], close_points="devkit"), key[1:])  # no sweeps: still
    with pytest.raises(ValueError, match="close_points must be one of sweeps, devkit, none, got 'all'"):
        aggregate(key, [], [], close_points="all")


def test_aggregate_rotates_xyz_only() -> None:
    key = _pts([[3.0, 3.0, 3.0, 1, 1]])
    sweep = _pts([[2.0, 0.0, 0.5, 42, 17]])
    out = aggregate(key, [sweep], [yaw_tf(np.pi / 2, (0.0, 0.0, 1.0))])
    np.testing.assert_allclose(out[1], [0.0, 2.0, 1.5, 42, 17], atol=1e-6)


def test_aggregate_no_sweeps_is_a_copy_of_the_keyframe() -> None:
    key = _pts([[0.0, 0.0, 0.0, 1, 2]])
    out = aggregate(key, [], [])
    np.testing.assert_array_equal(out, key)
    assert out is not key


def test_aggregate_matches_devkit_reference() -> None:
    rng = np.random.default_rng(7)
    key = rng.uniform(-3, 3, (50, 5)).astype(np.float32)
    sweeps = [rng.uniform(-3, 3, (n, 5)).astype(np.float32) for n in (40, 0, 33)]
    tfs = [yaw_tf(a, tuple(rng.uniform(-5, 5, 3))) for a in (0.3, -1.0, 2.5)]
    out = aggregate(key, sweeps, tfs)
    np.testing.assert_array_equal(out, _devkit_multisweep(key, sweeps, tfs).astype(np.float32))


def test_aggregate_rejects_caller_errors() -> None:
    key = np.zeros((2, 5), np.float32)
    with pytest.raises(ValueError, match="1 sweeps but 0 transforms"):
        aggregate(key, [key], [])
    with pytest.raises(ValueError, match="columns"):
        aggregate(key, [np.zeros((2, 4), np.float32)], [np.eye(4)])
    with pytest.raises(ValueError, match=r"\(4, 4\)"):
        aggregate(key, [key], [np.eye(3)])


def test_aggregate_real_nuscenes_sweep(realdata) -> None:
    key = np.fromfile(realdata / N015, np.float32).reshape(-1, 5)
    sweep = np.fromfile(realdata / N015_SWEEP, np.float32).reshape(-1, 5)
    close = int(((np.abs(sweep[:, 0]) < 1) & (np.abs(sweep[:, 1]) < 1)).sum())
    assert 0 < close < len(sweep)  # the truncated wedge holds points near the sensor
    tf = yaw_tf(0.01, (-0.5, 0.02, 0.0))
    out = aggregate(key, [sweep], [tf])
    assert out.shape == (len(key) + len(sweep) - close, 5)
    np.testing.assert_array_equal(out, _devkit_multisweep(key, [sweep], [tf]).astype(np.float32))


def test_check_labels_real_lidarseg_pair(realdata) -> None:
    points = np.fromfile(realdata / LIDARSEG_POINTS, np.float32).reshape(-1, 5)
    labels = (realdata / LIDARSEG_LABELS).read_bytes()
    assert len(points) == 40
    check_labels(labels, len(points))
    with pytest.raises(RejectError) as err:
        check_labels(labels[:-1], len(points))
    assert err.value.reason == "label_mismatch"
    assert "39" in err.value.detail and "40" in err.value.detail


@pytest.mark.parametrize(("nbytes", "npoints"), [(0, 1), (41, 40), (4 * 40, 40)])
def test_check_labels_rejects_wrong_counts(nbytes: int, npoints: int) -> None:
    with pytest.raises(RejectError, match="label_mismatch"):
        check_labels(bytes(nbytes), npoints)


@pytest.mark.parametrize("n", [0, 1, 40])
def test_check_labels_accepts_exactly_one_byte_per_point(n: int) -> None:
    check_labels(bytes(n), n)  # accepted, the empty pair included
    with pytest.raises(RejectError, match="label_mismatch"):
        check_labels(bytes(n), n + 1)
