"""transforms/layouts/geometry.py: quaternions, poses, sweep-to-keyframe transforms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.layouts.geometry import (
    pose_matrix,
    pose_record,
    quaternion_matrix,
    sweep_matrices,
    sweep_transform,
)
from tests.helpers import IDENTITY_Q, yaw_q, yaw_tf


def _cs(t=(0.0, 0.0, 0.0), q=IDENTITY_Q) -> dict:
    return {"token": "c", "translation": list(t), "rotation": list(q)}


def test_sweep_transform_pure_translation() -> None:
    cs = _cs((0.94, 0.0, 1.84))
    tf = sweep_transform(cs, _cs((10.0, 2.0, 0.0)), cs, _cs((7.0, 2.5, 0.1)))
    np.testing.assert_allclose(tf, yaw_tf(0.0, (-3.0, 0.5, 0.1)), atol=1e-12)


def test_sweep_transform_90_degree_yaw() -> None:
    cs = _cs()
    tf = sweep_transform(cs, _cs(), cs, _cs(q=yaw_q(math.pi / 2)))  # sweep ego turned left by 90 deg
    np.testing.assert_allclose(tf @ [1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], atol=1e-12)
    tf = sweep_transform(cs, _cs((5.0, 0.0, 0.0), yaw_q(math.pi / 2)), cs, _cs())  # keyframe ego turned
    np.testing.assert_allclose(tf, np.linalg.inv(yaw_tf(math.pi / 2, (5.0, 0.0, 0.0))), atol=1e-12)
    # A sensor mounted with a yaw: sweep == keyframe pose gives identity whatever the mounting.
    mount = _cs((1.0, 0.2, 1.8), yaw_q(-math.pi / 2))
    np.testing.assert_allclose(sweep_transform(mount, _cs(), mount, _cs()), np.eye(4), atol=1e-12)


def test_pose_matrix_inverse_and_normalization() -> None:
    rec = _cs((1.0, -2.0, 3.0), [2.0 * v for v in yaw_q(0.7)])  # not unit: normalized like pyquaternion
    np.testing.assert_allclose(pose_matrix(rec), yaw_tf(0.7, (1.0, -2.0, 3.0)), atol=1e-12)
    np.testing.assert_allclose(pose_matrix(rec, inverse=True) @ pose_matrix(rec), np.eye(4), atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=4, max_size=4).filter(lambda q: math.hypot(*q) > 1e-3))
def test_quaternion_matrix_is_a_rotation(q: list[float]) -> None:
    rot = quaternion_matrix(q)
    np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-9)
    assert np.linalg.det(rot) == pytest.approx(1.0)
    np.testing.assert_allclose(quaternion_matrix([-v for v in q]), rot, atol=1e-12)
    np.testing.assert_allclose(quaternion_matrix([3 * v for v in q]), rot, atol=1e-12)


@pytest.mark.parametrize(
    "q", [[0, 0, 0, 0], [1, 0, 0], [1, 0, 0, "0"], [1, 0, 0, float("nan")], None, [True, 0, 0, 0]]
)
def test_quaternion_matrix_rejects_malformed(q: object) -> None:
    with pytest.raises(RejectError, match="bad_table"):
        quaternion_matrix(q)


def test_pose_record_and_sweep_matrices() -> None:
    rec = pose_record((1.0, 2.0, 3.0), yaw_q(0.3))
    np.testing.assert_allclose(pose_matrix(rec), yaw_tf(0.3, (1.0, 2.0, 3.0)), atol=1e-12)
    flat = np.concatenate([np.eye(4).ravel(), pose_matrix(rec).ravel()])
    mats = sweep_matrices(flat, 2, "k.bin")
    assert mats.shape == (2, 4, 4)
    np.testing.assert_array_equal(mats[1], pose_matrix(rec))
    assert sweep_matrices(None, 0, "k.bin").shape == (0, 4, 4)
    with pytest.raises(ValueError, match="k.bin: 2 sweeps but 16 transform values"):
        sweep_matrices(np.eye(4).ravel(), 2, "k.bin")
