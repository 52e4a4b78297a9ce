"""Multi-sweep aggregation of nuScenes LiDAR frames and the lidarseg label check (pure numpy).

``lidarshard scan --sweeps N`` aggregates the LIDAR_TOP keyframe with its N **previous** sweeps (found by
``lidarshard.transforms.layouts.nuscenes_tasks.load_tasks``), so ``--sweeps 9`` gives 10 frames: the devkit's
``LidarPointCloud.from_file_multisweep(..., nsweeps=10)``.

Close points (returns from the ego vehicle, inside the box |x| < 1 m and |y| < 1 m of each cloud's own
sensor frame, before the transform) are removed by a named rule, ``close_points`` (``CLOSE_POINTS``):

- ``"sweeps"`` (default): from the previous sweeps only, as mmdet3d's
  ``LoadPointsFromMultiSweeps(remove_close=True)``; the keyframe stays whole, so its point count equals
  the length of its lidarseg label file.
- ``"devkit"``: from every cloud, the keyframe included (also a sample without sweeps), as the nuScenes
  devkit's ``LidarPointCloud.from_file_multisweep(nsweeps=N+1, min_distance=1.0)``.
- ``"none"``: from no cloud.

The scan computes ``num_points`` and the other size features under the rule it records
(``scan_config.close_points``) and the loaders apply that same rule. The devkit also drops the ring
column and returns a time-lag row; here extra columns pass through untouched and time lags live in
``SweepRef.time_lag_s`` (appended as a column with ``time_lags``).

Rows with a NaN or an infinite x, y or z (the no-return pixels of organised PCDs, AV2 nulls, a driver's
+inf for "no return", ``nan``/``inf`` words of an ASCII file) are not points, by one rule everywhere
(``NON_FINITE_RULE``): the loaders drop them (``drop_non_finite_rows``, open3d's
``remove_non_finite_points``), and the scan's ``num_points`` and size features (hence the cost) do not
count them. A sweep's row that becomes non-finite only through its transform is refused instead
(``absurd_coordinates``, see ``aggregate``).

This module never imports ``apache_beam``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError, RejectValueError

__all__ = [
    "CLOSE_RADIUS_M",
    "CLOSE_POINTS",
    "DEFAULT_CLOSE_POINTS",
    "check_close_points",
    "recorded_close_points",
    "remove_close",
    "NON_FINITE_RULE",
    "non_finite_rows",
    "drop_non_finite_rows",
    "aggregate",
    "check_labels",
]

#: Half-width (m) of the box around the sensor that ``remove_close`` empties (devkit ``min_distance``).
CLOSE_RADIUS_M = 1.0
#: The close-point rules: which clouds of a sample lose the points inside the ``CLOSE_RADIUS_M`` box.
CLOSE_POINTS = ("sweeps", "devkit", "none")
DEFAULT_CLOSE_POINTS = "sweeps"
#: The rule for rows that are no points, in the words the build summary prints.
NON_FINITE_RULE = (
    "a row with a NaN or infinite x, y or z is no point: not counted, not costed, not served to training"
)
_F32_MAX = float(np.finfo(np.float32).max)
#: Largest float64 scratch (bytes, 2 x 3 x 8 a point) ``aggregate`` keeps per thread between calls.
_SCRATCH_KEEP_BYTES = 16 << 20
_SCRATCH = threading.local()


def _check_points(points: NDArray[np.float32], what: str) -> None:
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"{what} must be (N, C>=3) with x, y, z first, got shape {points.shape}")


def check_close_points(rule: object) -> str:
    """``rule`` if it names a close-point rule (``CLOSE_POINTS``), else ValueError in one line."""
    if rule not in CLOSE_POINTS:
        raise ValueError(f"close_points must be one of {', '.join(CLOSE_POINTS)}, got {rule!r}")
    return str(rule)


def recorded_close_points(provenance: Mapping[str, Any]) -> str:
    """The close-point rule a scan recorded in its provenance (``_scan.json`` / ``_manifest.json``:
    ``scan_config.close_points``); ``"sweeps"`` when none is recorded (the only rule before it was named).

    Raises:
        ValueError: a recorded value that names no rule.
    """
    config = provenance.get("scan_config")
    rule = config.get("close_points", DEFAULT_CLOSE_POINTS) if isinstance(config, Mapping) else None
    try:
        return check_close_points(rule or DEFAULT_CLOSE_POINTS)
    except ValueError as e:
        raise ValueError(f"scan_config.close_points: {e}") from None


def remove_close(points: NDArray[np.float32], radius: float = CLOSE_RADIUS_M) -> NDArray[np.float32]:
    """Drop points inside the sensor-centred box ``|x| < radius and |y| < radius``.

    Devkit semantics: a square box in the x/y plane (any z), not a radius. Rows keep their order;
    NaN and infinite coordinates are never "close" and are kept.

    Args:
        points: (N, C) float32, x, y, z (m, sensor frame) in the first three columns.
        radius: half-width of the box, m.

    Returns:
        (M, C) float32, M <= N: the rows outside the box (a new array).
    """
    _check_points(points, "points")
    keep = _outside(points, radius)
    out = np.empty((int(np.count_nonzero(keep)), points.shape[1]), points.dtype)
    _take_rows(points, keep, out)
    return out


def non_finite_rows(points: NDArray[np.floating]) -> NDArray[np.bool_]:
    """(N,) bool: the rows of (N, >=3) ``points`` with a NaN or an infinite x, y or z (no points)."""
    finite = np.isfinite(points[:, 0])
    finite &= np.isfinite(points[:, 1])
    finite &= np.isfinite(points[:, 2])
    return np.logical_not(finite, out=finite)


def drop_non_finite_rows(points: NDArray[np.float32]) -> NDArray[np.float32]:
    """(M, C) ``points`` without the rows that have a NaN or an infinite x, y or z (open3d's
    ``remove_non_finite_points``; the other columns may hold anything); ``points`` itself when there
    is none."""
    _check_points(points, "points")
    bad = non_finite_rows(points)
    return points[~bad] if bad.any() else points


def _outside(points: NDArray[np.float32], radius: float) -> NDArray[np.bool_]:
    """(N,) bool: the rows of (N, >=2) ``points`` outside the box ``|x| < radius and |y| < radius``."""
    close = np.abs(points[:, 0]) < radius
    close &= np.abs(points[:, 1]) < radius
    return np.logical_not(close, out=close)


def _take_rows(points: NDArray, keep: NDArray[np.bool_], out: NDArray) -> NDArray:
    """Copy the rows of ``points`` where ``keep`` into ``out`` ((count of keep, C), C-contiguous rows),
    cast to its dtype. Returns the kept rows in ``points``' own dtype: ``out`` itself when the dtypes
    match, else a new array (so a float64 cloud's xyz is transformed as read, not as float32)."""
    if points.dtype == out.dtype and points.flags.c_contiguous and points.shape[1] and len(out):
        # One row = one opaque item: 1-D boolean indexing copies whole rows at memcpy speed, about
        # 4x faster than points[keep] on a 2-D array.
        row = np.dtype((np.void, points.dtype.itemsize * points.shape[1]))
        out.view(row)[:, 0] = points.view(row)[:, 0][keep]
        return out
    kept = points[keep]
    out[...] = kept
    return out if kept.dtype == out.dtype else kept


def aggregate(
    keyframe: NDArray[np.float32],
    sweeps: Sequence[NDArray[np.float32]],
    transforms: Sequence[NDArray[np.float64]],
    *,
    close_points: str = DEFAULT_CLOSE_POINTS,
    time_lags: Sequence[float] | None = None,
) -> NDArray[np.float32]:
    """Stack a keyframe and its previous sweeps in the keyframe's sensor frame.

    Each cloud the ``close_points`` rule names first loses its close points (``remove_close``, in its
    own sensor frame: the keyframe under ``"devkit"``, the sweeps under ``"devkit"`` and ``"sweeps"``),
    then each sweep's x, y, z go through its 4x4 transform. The maths runs in float64 and is cast
    back to float32, as in the devkit. Columns past z (intensity, ring, ...) pass through untouched.

    One pass sizes the result (a close-point mask per sweep), then each sweep's kept rows are copied
    straight into their slice of the one output array and their x, y, z moved there through a
    float64 scratch shared by all sweeps: float32 columns are never converted, nothing is
    concatenated. Inputs are only read (read-only views of file bytes are fine).

    Args:
        keyframe: (N, C) float32, keyframe sensor frame.
        sweeps: M_i x C float32 arrays, newest first, each in its own sensor frame.
        transforms: one (4, 4) float64 per sweep, sweep sensor frame -> keyframe sensor frame
            (``SweepRef.sensor_to_ref`` reshaped).
        close_points: the close-point rule, one of ``CLOSE_POINTS``.
        time_lags: one lag per sweep (s, t_keyframe - t_sweep): append the time-lag channel, 0 on the
            keyframe's rows, as the devkit's ``from_file_multisweep`` times and mmdet3d's
            ``LoadPointsFromMultiSweeps`` (``ts - sweep_ts``); None: no such column.

    Returns:
        (N' + sum M_i', C) float32: keyframe rows first, then each filtered sweep in the given order;
        (N' + sum M_i', C + 1) with ``time_lags``, the lag (float32 s) last.

    Raises:
        RejectValueError: ``sweep_columns`` when a sweep's column count differs from the keyframe's (bad
            input: mixed files or headers); ``absurd_coordinates`` when a sweep point with finite x, y, z
            would leave float32 range (or become NaN) in the keyframe frame: it is refused rather than
            cast to inf and dropped later without a word.
        ValueError: on mismatched counts or transform shapes, or an unknown rule (a caller bug, not bad
            input).
    """
    _check_points(keyframe, "keyframe")
    check_close_points(close_points)
    if len(sweeps) != len(transforms):
        raise ValueError(f"{len(sweeps)} sweeps but {len(transforms)} transforms")
    if time_lags is not None and len(time_lags) != len(sweeps):
        raise ValueError(f"{len(sweeps)} sweeps but {len(time_lags)} time lags")
    mats = []
    for i, (sweep, tf) in enumerate(zip(sweeps, transforms, strict=True)):
        _check_points(sweep, f"sweep {i}")
        if sweep.shape[1] != keyframe.shape[1]:
            detail = f"sweep {i} has {sweep.shape[1]} columns per point, its keyframe {keyframe.shape[1]}"
            raise RejectValueError("sweep_columns", detail)
        tf = np.asarray(tf, dtype=np.float64)
        if tf.shape != (4, 4):
            raise ValueError(f"transform {i} must be (4, 4), got {tf.shape}")
        mats.append(tf)
    key_keep = _outside(keyframe, CLOSE_RADIUS_M) if close_points == "devkit" else None
    keeps = [
        _outside(sweep, CLOSE_RADIUS_M) if close_points != "none" else np.ones(len(sweep), np.bool_)
        for sweep in sweeps
    ]
    counts = [int(np.count_nonzero(keep)) for keep in keeps]
    n_key = keyframe.shape[0] if key_keep is None else int(np.count_nonzero(key_keep))
    out = np.empty((n_key + sum(counts), keyframe.shape[1]), np.float32)
    if key_keep is None:
        out[:n_key] = keyframe
    else:
        _take_rows(keyframe, key_keep, out[:n_key])
    scratch = _scratch(max(counts, default=0))
    row = n_key
    for i, (sweep, keep, count, tf) in enumerate(zip(sweeps, keeps, counts, mats, strict=True)):
        rows = out[row : row + count]
        _move(_take_rows(sweep, keep, rows), tf, i, rows, scratch[:, :count])
        row += count
    if time_lags is None:
        return out
    lags = np.repeat(np.asarray([0.0, *time_lags], np.float64), [n_key, *counts]).astype(np.float32)
    return np.concatenate([out, lags[:, None]], axis=1)


def _scratch(rows: int) -> NDArray[np.float64]:
    """(2, rows, 3) float64 work space for ``_move``, C-contiguous rows; one buffer per thread is kept
    between calls (up to ``_SCRATCH_KEEP_BYTES``): a fresh one a sample costs page faults, and freeing it
    lets the allocator return memory that the next sample's reads fault in again (measured: 100 ->
    165 samples/s, 2,340 -> 0 page faults a sample, keyframe + 9 nuScenes sweeps)."""
    buf: NDArray[np.float64] | None = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.shape[1] < rows:
        buf = np.empty((2, rows, 3), np.float64)
        if buf.nbytes <= _SCRATCH_KEEP_BYTES:
            _SCRATCH.buf = buf
    return buf[:, :rows]


def _move(
    kept: NDArray, tf: NDArray[np.float64], i: int, out: NDArray[np.float32], scratch: NDArray[np.float64]
) -> None:
    """Write ``kept``'s (M, >=3) x, y, z through ``tf`` into ``out[:, :3]`` (M, C) float32.

    Exactly the arithmetic of ``(xyz.astype(float64) @ tf[:3, :3].T + tf[:3, 3]).astype(float32)``:
    the same BLAS product on a C-contiguous (M, 3) float64 operand of the same shape, the same float64
    additions, the same rounding to float32 (``tests/multisweep_oracle.py`` holds that formula and the
    tests compare bit for bit); column by column because numpy runs long strided loops far faster than
    M inner loops of 3 (a NaN translation takes the old (M, 3) + (3,) addition: NaN + NaN is the one
    case where operand order shows, in the sign and payload of the NaN). ``scratch``: (2, M, 3)
    float64, overwritten.

    Raises:
        RejectValueError: ``absurd_coordinates`` naming sweep ``i`` when a row of finite x, y, z lands
            beyond float32 range (or NaN), with the largest magnitude reached.
    """
    xyz, moved = scratch[0], scratch[1]
    for c in range(3):
        xyz[:, c] = kept[:, c]
    with np.errstate(over="ignore", invalid="ignore"):  # checked below, never a RuntimeWarning
        np.matmul(xyz, tf[:3, :3].T, out=moved)
        if np.isnan(tf[:3, 3]).any():  # NaN + NaN keeps one operand's sign and payload, as the loop
            np.add(moved, tf[:3, 3], out=moved)  # orders them: the (M, 3) + (3,) loop, as before
        else:
            for c in range(3):
                moved[:, c] += tf[c, 3]
        # min/max (NaN propagates) clear the usual cloud in two reductions; anything else gets the
        # row-wise rule: only rows whose input x, y, z are all finite count as lost.
        if len(moved) and not (-_F32_MAX <= moved.min() and moved.max() <= _F32_MAX):
            lost = np.isfinite(kept[:, :3]).all(axis=1) & ~(np.abs(moved) <= _F32_MAX).all(axis=1)
            if lost.any():
                peak = float(np.nanmax(np.abs(moved[lost]), initial=0.0))
                raise RejectValueError(
                    "absurd_coordinates",
                    f"{int(lost.sum())} points of sweep {i} land beyond float32 range in the keyframe frame "
                    f"(|coordinate| up to {peak:.3g} m): a corrupt sweep pose or point",
                )
    for c in range(3):
        out[:, c] = moved[:, c]


def check_labels(label_bytes: bytes, num_points: int) -> None:
    """Check that a lidarseg label file holds exactly one uint8 per keyframe point.

    Args:
        label_bytes: the whole ``*_lidarseg.bin`` file (uint8 class indices, pcd.bin point order).
        num_points: points in the keyframe .pcd.bin as read (before any close-point removal).

    Raises:
        RejectError: ``label_mismatch`` with both counts in the detail.
    """
    if len(label_bytes) != num_points:
        raise RejectError(
            "label_mismatch",
            f"label file holds {len(label_bytes)} uint8 labels but the keyframe has {num_points} points",
        )
