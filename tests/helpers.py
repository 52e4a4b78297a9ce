"""Helpers shared by the tests (the one module tests import from each other)."""

from __future__ import annotations

import math

import numpy as np

IDENTITY_Q = [1.0, 0.0, 0.0, 0.0]


def yaw_q(theta: float) -> list[float]:
    return [math.cos(theta / 2), 0.0, 0.0, math.sin(theta / 2)]


def yaw_tf(theta: float, t: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """Independent 4x4 (cos/sin, no quaternion) for a yaw about z then a translation."""
    c, s = math.cos(theta), math.sin(theta)
    tf = np.eye(4)
    tf[:2, :2] = [[c, -s], [s, c]]
    tf[:3, 3] = t
    return tf
