"""Size features of one point cloud: counts, extents, percentiles and occupied voxels. Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError

__all__ = [
    "compute_features",
    "count_occupied_voxels",
    "FEATURE_NAMES",
    "DEFAULT_VOXEL_SIZE",
    "MAX_ABS_COORD",
]

DEFAULT_VOXEL_SIZE = 0.05  # m
MAX_ABS_COORD = 1.0e5  # m; beyond this a "point" is garbage (often a wrong --point-dims)

_AXES = ("x", "y", "z")
FEATURE_NAMES: tuple[str, ...] = (
    "num_points",
    "num_finite",
    "num_in_range",
    *(f"{a}_{s}" for a in _AXES for s in ("min", "max")),
    *(f"{a}_{s}" for a in _AXES for s in ("p01", "p99")),
    "occupied_voxels",
)


def count_occupied_voxels(xyz: NDArray[np.float32], voxel_size: float) -> int:
    """Number of distinct cubic voxels of edge ``voxel_size`` (m) holding at least one point.

    Args:
        xyz: (N, 3) finite coordinates in metres.
        voxel_size: voxel edge in metres, > 0.

    Uses a raveled int64 key + ``np.sort`` + count of changes (``np.unique`` is far slower on
    numpy >= 2.3); falls back to a lexicographic sort when the grid would overflow int64.
    """
    if len(xyz) == 0:
        return 0
    idx = np.floor(xyz.astype(np.float64) / voxel_size).astype(np.int64)  # grid anchored at the origin
    idx -= idx.min(axis=0)
    dims = idx.max(axis=0) + 1
    if float(dims[0]) * float(dims[1]) * float(dims[2]) < 2.0**62:
        key = (idx[:, 0] * dims[1] + idx[:, 1]) * dims[2] + idx[:, 2]
        key.sort()
        return int(np.count_nonzero(key[1:] != key[:-1]) + 1)
    order = np.lexsort((idx[:, 2], idx[:, 1], idx[:, 0]))
    s = idx[order]
    return int(np.count_nonzero(np.any(s[1:] != s[:-1], axis=1)) + 1)


def compute_features(
    points: NDArray[np.float32],
    *,
    voxel_size: float = DEFAULT_VOXEL_SIZE,
    point_cloud_range: Sequence[float] | None = None,
    max_abs_coord: float = MAX_ABS_COORD,
) -> dict[str, int | float]:
    """Size features of one (possibly aggregated) cloud.

    Args:
        points: (N, C>=3) float32, columns 0..2 are x, y, z in metres; NaN/inf allowed (rows that are
            no points: ``num_points`` and every other feature leave them out).
        voxel_size: edge of the occupancy voxels, metres.
        point_cloud_range: (x_min, y_min, z_min, x_max, y_max, z_max) in metres, or None for all
            finite points. Extents, percentiles and voxels are computed over in-range points.
        max_abs_coord: finite coordinates beyond this magnitude reject the cloud.

    Returns:
        ``{name: value}`` for every name in ``FEATURE_NAMES``.

    Raises:
        RejectError: ``empty`` (no points), ``non_finite`` (no finite point),
            ``absurd_coordinates``, ``empty_after_filter`` (nothing inside the range).
    """
    n = int(points.shape[0])
    if n == 0:
        raise RejectError("empty", "the cloud holds no points")
    xyz = points[:, :3]
    finite = np.isfinite(xyz).all(axis=1)
    num_finite = int(np.count_nonzero(finite))
    if num_finite == 0:
        raise RejectError("non_finite", f"none of {n} points has finite x, y, z")
    xyz = xyz[finite] if num_finite < n else xyz
    peak = float(np.abs(xyz).max())
    if peak > max_abs_coord:
        raise RejectError(
            "absurd_coordinates",
            f"|coordinate| up to {peak:.3g} m > {max_abs_coord:g} m (wrong --point-dims or corrupt file?)",
        )
    if point_cloud_range is not None:
        lo = np.asarray(point_cloud_range[:3], dtype=np.float32)
        hi = np.asarray(point_cloud_range[3:], dtype=np.float32)
        xyz = xyz[((xyz >= lo) & (xyz < hi)).all(axis=1)]
        if len(xyz) == 0:
            raise RejectError(
                "empty_after_filter", f"0 of {num_finite} finite points inside {list(point_cloud_range)}"
            )
    # A row with a non-finite x, y or z is no point (multisweep.NON_FINITE_RULE): the loaders drop it.
    out: dict[str, int | float] = {
        "num_points": num_finite,
        "num_finite": num_finite,
        "num_in_range": int(len(xyz)),
    }
    mins, maxs = xyz.min(axis=0), xyz.max(axis=0)
    pcts = np.percentile(xyz, [1.0, 99.0], axis=0)
    for i, a in enumerate(_AXES):
        out[f"{a}_min"], out[f"{a}_max"] = float(mins[i]), float(maxs[i])
        out[f"{a}_p01"], out[f"{a}_p99"] = float(pcts[0, i]), float(pcts[1, i])
    out["occupied_voxels"] = count_occupied_voxels(xyz, voxel_size)
    return out
