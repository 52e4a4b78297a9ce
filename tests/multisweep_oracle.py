"""The multi-sweep aggregation as it was before the fast point path (issue 29 item 1), kept only as a
test oracle: ``aggregate`` and ``load_points`` must give exactly these arrays (same dtype, same rows,
same bits) and raise the same errors for every input. Copied verbatim from
``transforms/layouts/multisweep.py`` and ``loaders/points.py`` as of lidarshard 0.3.0."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.loaders.points import Recorded, read_recorded
from lidarshard.transforms.errors import RejectValueError
from lidarshard.transforms.formats.readers import detect_format, read_points
from lidarshard.transforms.layouts.geometry import sweep_matrices

_F32_MAX = float(np.finfo(np.float32).max)


def _check_points(points: NDArray[np.float32], what: str) -> None:
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"{what} must be (N, C>=3) with x, y, z first, got shape {points.shape}")


def remove_close(points: NDArray[np.float32], radius: float = 1.0) -> NDArray[np.float32]:
    """The old ``multisweep.remove_close``."""
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
    """The old ``multisweep.aggregate``."""
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
    with np.errstate(over="ignore", invalid="ignore"):
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


def load_points(
    path: str,
    fmt: str | None,
    sweep_paths: Sequence[str] = (),
    sweep_transforms: Sequence[float] | NDArray[np.float64] | None = None,
    point_dims: int | None = None,
    recorded: Sequence[Recorded | None] | None = None,
) -> NDArray[np.float32]:
    """The old ``loaders.points.load_points`` (over the old ``aggregate``)."""
    files = [path, *sweep_paths]
    checks = list(recorded) if recorded is not None else [None] * len(files)
    if len(checks) != len(files):
        raise ValueError(f"{path}: {len(checks)} recorded files for a keyframe and {len(sweep_paths)} sweeps")
    fmt = fmt or detect_format(path)
    keyframe = read_points(read_recorded(path, checks[0]), fmt, point_dims=point_dims)
    if not sweep_paths:
        return np.ascontiguousarray(keyframe, dtype=np.float32)
    mats = sweep_matrices(sweep_transforms, len(sweep_paths), path)
    sweeps = [
        read_points(read_recorded(p, c), fmt, point_dims=point_dims)
        for p, c in zip(sweep_paths, checks[1:], strict=True)
    ]
    return aggregate(keyframe, sweeps, list(mats))
