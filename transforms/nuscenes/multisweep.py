"""Multi-sweep aggregation of nuScenes LiDAR frames and the lidarseg label check (pure numpy).

``lidarshard scan --sweeps N`` aggregates the LIDAR_TOP keyframe with its N **previous** sweeps (found by
``lidarshard.transforms.nuscenes.tables.load_tasks``), so ``--sweeps 9`` gives 10 frames: the devkit's
``LidarPointCloud.from_file_multisweep(..., nsweeps=10)``.

Difference from the devkit (nuscenes-devkit ``PointCloud.from_file_multisweep``): the devkit calls
``remove_close(min_distance)`` on every frame it aggregates, the keyframe included. lidarshard removes
close points from the previous sweeps only and keeps the keyframe whole by default. The keyframe's point
count then equals the length of its lidarseg label file, and ``num_points`` counts exactly the points a
labelled model sees. ``filter_keyframe=True`` gives the devkit's rule (the synthetic generator's size
table uses it). As in the devkit, the filter runs in each sweep's own sensor frame, before the transform.
The devkit also drops the ring column and returns a time-lag row; here extra columns pass through
untouched and time lags live in ``SweepRef.time_lag_s``.

This module never imports ``apache_beam``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError, RejectValueError

__all__ = ["CLOSE_RADIUS_M", "remove_close", "aggregate", "check_labels"]

#: Half-width (m) of the box around the sensor that ``remove_close`` empties (devkit ``min_distance``).
CLOSE_RADIUS_M = 1.0
_F32_MAX = float(np.finfo(np.float32).max)


def _check_points(points: NDArray[np.float32], what: str) -> None:
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"{what} must be (N, C>=3) with x, y, z first, got shape {points.shape}")


def remove_close(points: NDArray[np.float32], radius: float = CLOSE_RADIUS_M) -> NDArray[np.float32]:
    """Drop points inside the sensor-centred box ``|x| < radius and |y| < radius``.

    Devkit semantics: a square box in the x/y plane (any z), not a radius. Rows keep their order;
    NaN coordinates are never "close" and are kept.

    Args:
        points: (N, C) float32, x, y, z (m, sensor frame) in the first three columns.
        radius: half-width of the box, m.

    Returns:
        (M, C) float32, M <= N: the rows outside the box.
    """
    _check_points(points, "points")
    close = (np.abs(points[:, 0]) < radius) & (np.abs(points[:, 1]) < radius)
    return points[~close]


def aggregate(
    keyframe: NDArray[np.float32],
    sweeps: Sequence[NDArray[np.float32]],
    transforms: Sequence[NDArray[np.float64]],
    *,
    filter_keyframe: bool = False,
) -> NDArray[np.float32]:
    """Stack a keyframe and its previous sweeps in the keyframe's sensor frame.

    The keyframe is kept as is (``filter_keyframe``: it loses its close points too, as in the devkit).
    Each sweep first loses its close points (``remove_close``, in its own
    sensor frame), then its x, y, z go through its 4x4 transform. The maths runs in float64 and is cast
    back to float32, as in the devkit. Columns past z (intensity, ring, ...) pass through untouched.

    Args:
        keyframe: (N, C) float32, keyframe sensor frame.
        sweeps: M_i x C float32 arrays, newest first, each in its own sensor frame.
        transforms: one (4, 4) float64 per sweep, sweep sensor frame -> keyframe sensor frame
            (``SweepRef.sensor_to_ref`` reshaped).
        filter_keyframe: also ``remove_close`` the keyframe.

    Returns:
        (N + sum M_i', C) float32: keyframe rows first, then each filtered sweep in the given order.

    Raises:
        RejectValueError: ``sweep_columns`` when a sweep's column count differs from the keyframe's (bad
            input: mixed files or headers); ``absurd_coordinates`` when a sweep point with finite x, y, z
            would leave float32 range (or become NaN) in the keyframe frame: it is refused rather than
            cast to inf and dropped later without a word.
        ValueError: on mismatched counts or transform shapes (a caller bug, not bad input).
    """
    _check_points(keyframe, "keyframe")
    if filter_keyframe:
        keyframe = remove_close(keyframe)
    if len(sweeps) != len(transforms):
        raise ValueError(f"{len(sweeps)} sweeps but {len(transforms)} transforms")
    kept = []
    for i, (sweep, tf) in enumerate(zip(sweeps, transforms, strict=True)):
        _check_points(sweep, f"sweep {i}")
        if sweep.shape[1] != keyframe.shape[1]:
            detail = f"sweep {i} has {sweep.shape[1]} columns per point, its keyframe {keyframe.shape[1]}"
            raise RejectValueError("sweep_columns", detail)
        tf = np.asarray(tf, dtype=np.float64)
        if tf.shape != (4, 4):
            raise ValueError(f"transform {i} must be (4, 4), got {tf.shape}")
        kept.append((remove_close(sweep), tf))
    out = np.empty((keyframe.shape[0] + sum(s.shape[0] for s, _ in kept), keyframe.shape[1]), np.float32)
    out[: keyframe.shape[0]] = keyframe
    row = keyframe.shape[0]
    for i, (sweep, tf) in enumerate(kept):
        end = row + sweep.shape[0]
        out[row:end] = sweep
        out[row:end, :3] = _moved(sweep[:, :3], tf, i)
        row = end
    return out


def _moved(xyz: NDArray[np.float32], tf: NDArray[np.float64], i: int) -> NDArray[np.float64]:
    """(M, 3) float64 ``xyz`` through ``tf``, every finite input row still within float32 range.

    Raises:
        RejectValueError: ``absurd_coordinates`` naming sweep ``i`` and the largest magnitude reached.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # checked below, never a RuntimeWarning
        moved = xyz.astype(np.float64) @ tf[:3, :3].T + tf[:3, 3]
        lost = np.isfinite(xyz).all(axis=1) & ~(np.abs(moved) <= _F32_MAX).all(axis=1)
    if lost.any():
        peak = float(np.nanmax(np.abs(moved[lost]), initial=0.0))
        raise RejectValueError(
            "absurd_coordinates",
            f"{int(lost.sum())} points of sweep {i} land beyond float32 range in the keyframe frame "
            f"(|coordinate| up to {peak:.3g} m): a corrupt sweep pose or point",
        )
    return moved


def check_labels(label_bytes: bytes, num_points: int) -> None:
    """Check that a lidarseg label file holds exactly one uint8 per keyframe point.

    Args:
        label_bytes: the whole ``*_lidarseg.bin`` file (uint8 class indices, pcd.bin point order).
        num_points: points in the keyframe .pcd.bin (before any filtering; the keyframe is never filtered).

    Raises:
        RejectError: ``label_mismatch`` with both counts in the detail.
    """
    if len(label_bytes) != num_points:
        raise RejectError(
            "label_mismatch",
            f"label file holds {len(label_bytes)} uint8 labels but the keyframe has {num_points} points",
        )
