"""The Waymo Open Dataset v2 layout: per-segment Parquet files in component folders under ROOT,
``lidar/<segment>.parquet``, ``lidar_calibration/<segment>.parquet`` and (for sweeps)
``vehicle_pose/<segment>.parquet``; one sample per (segment, frame). Pure numpy/pyarrow.

A task's ``path`` is the segment's lidar file and its ``frame`` the ``key.frame_timestamp_micros``:
``read_frame`` (``waymo_range``) reads that frame's row groups alone and returns its points in the
vehicle frame. Sweeps are the segment's previous frames, moved into the keyframe's vehicle frame
through the vehicle poses (``world_from_vehicle``).
"""

from __future__ import annotations

import posixpath

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.io.arrow import parquet_file
from lidarshard.transforms.layouts.geometry import MAX_TRANSLATION_M
from lidarshard.transforms.layouts.task import Found, LayoutIO, LayoutOptions, Reject, ScanTask, SweepRef
from lidarshard.transforms.layouts.waymo_range import (
    KEY_FRAME,
    beam_inclinations,
    calibration_path,
    range_image_points,
    read_frame,
    read_parquet,
)

__all__ = [
    "NAME",
    "COMPONENTS",
    "POSE_TRANSFORM",
    "describe",
    "load_tasks",
    "calibration_path",
    "beam_inclinations",
    "range_image_points",
    "read_frame",
    "read_poses",
]

NAME = "waymo_v2"
#: The component folders this layout reads (every file in them is a task's input or a reject).
COMPONENTS = ("lidar", "lidar_calibration", "vehicle_pose")
POSE_TRANSFORM = "[VehiclePoseComponent].world_from_vehicle.transform"
#: A pose's rotation must be orthonormal within this (poses are stored as float32).
_ROTATION_TOL = 1e-3


def _files(root: str, component: str, io: LayoutIO) -> list[str]:
    return io.glob(posixpath.join(root.rstrip("/"), component, "*.parquet"))


def describe(root: str, io: LayoutIO) -> str | None:
    """``"Waymo Open v2 components (3 segments)"`` when ROOT holds ``lidar/*.parquet`` and
    ``lidar_calibration/*.parquet``, else None (globs only)."""
    lidar = _files(root, "lidar", io)
    if not lidar or not _files(root, "lidar_calibration", io):
        return None
    return f"Waymo Open v2 components ({len(lidar)} segment{'s' if len(lidar) != 1 else ''})"


def incomplete(root: str, io: LayoutIO) -> str | None:
    """What ROOT lacks to be read as a Waymo Open v2 split when it holds ``lidar/*.parquet`` but no
    ``lidar_calibration/*.parquet`` (``describe`` then finds nothing), else None (globs only)."""
    if not _files(root, "lidar", io) or _files(root, "lidar_calibration", io):
        return None
    return (
        "has Waymo Open v2 lidar/*.parquet but no lidar_calibration/*.parquet: a split folder holds "
        "lidar/ and lidar_calibration/ of the same segments (and vehicle_pose/ for --sweeps); download "
        "the lidar_calibration component beside lidar/"
    )


def _segment(path: str) -> str:
    return posixpath.basename(path.replace("\\", "/"))[: -len(".parquet")]


def _read_frames(path: str, io: LayoutIO) -> list[int]:
    """The distinct ``key.frame_timestamp_micros`` of a lidar file, ascending (only that column read)."""
    with io.open_read(path) as f:
        file = parquet_file(f)
        if KEY_FRAME not in file.schema_arrow.names:
            raise RejectError("bad_header", f"{path} lacks column {KEY_FRAME}")
        column = file.read(columns=[KEY_FRAME], use_threads=False).column(KEY_FRAME)
    if not pa.types.is_integer(column.type):
        raise RejectError("bad_header", f"{path}: {KEY_FRAME} is {column.type}, not an integer")
    if column.null_count:
        raise RejectError("bad_table", f"{path}: {column.null_count} rows without {KEY_FRAME}")
    return sorted({int(v) for v in column.unique().to_pylist()})


def _pose(values: object) -> NDArray[np.float64] | None:
    """A 16-float row-major world_from_vehicle as (4, 4), or None when not a rigid transform."""
    if not isinstance(values, list) or len(values) != 16 or any(not isinstance(v, float) for v in values):
        return None
    m = np.asarray(values, dtype=np.float64).reshape(4, 4)
    if not np.isfinite(m).all() or np.abs(m[:3, 3]).max() > MAX_TRANSLATION_M:
        return None
    r = m[:3, :3]
    if not np.allclose(r @ r.T, np.eye(3), atol=_ROTATION_TOL) or not np.allclose(m[3], [0, 0, 0, 1]):
        return None
    return m


def read_poses(path: str, io: LayoutIO) -> dict[int, NDArray[np.float64] | None]:
    """``{frame_timestamp_micros: world_from_vehicle (4, 4) float64}`` of a ``vehicle_pose`` file; a
    frame whose pose is not a rigid transform, or appears twice, maps to None.

    Raises:
        RejectError: ``missing_file``, ``unreadable``, ``bad_header`` (not Parquet, columns missing).
    """
    cols = [KEY_FRAME, POSE_TRANSFORM]

    def read(file: pq.ParquetFile) -> pa.Table:
        missing = [c for c in cols if c not in file.schema_arrow.names]
        if missing:
            raise RejectError("bad_header", f"{path} lacks columns {missing}")
        return file.read(columns=cols, use_threads=False)

    table = read_parquet(io.open_read, path, "vehicle pose file", read)
    poses: dict[int, NDArray[np.float64] | None] = {}
    for ts, values in zip(
        table.column(KEY_FRAME).to_pylist(), table.column(POSE_TRANSFORM).to_pylist(), strict=True
    ):
        if isinstance(ts, int):
            poses[ts] = None if ts in poses else _pose(values)
    return poses


def _sweeps(
    frames: list[int], i: int, n: int, path: str, poses: dict[int, NDArray[np.float64] | None]
) -> tuple[SweepRef, ...]:
    """The ``n`` frames before ``frames[i]``, newest first, as sweeps into its vehicle frame."""
    previous = frames[max(0, i - n) : i][::-1]
    if not previous:
        return ()
    key = frames[i]
    world: dict[int, NDArray[np.float64]] = {}
    for ts in (key, *previous):
        pose = poses.get(ts)
        if pose is None:
            raise RejectError("bad_table", f"frame {ts} has no valid vehicle pose (sweeps of frame {key})")
        world[ts] = pose
    rot, trans = world[key][:3, :3], world[key][:3, 3]
    key_from_world = np.eye(4)
    key_from_world[:3, :3], key_from_world[:3, 3] = rot.T, -rot.T @ trans  # rigid inverse
    out = []
    for ts in previous:
        moved = key_from_world @ world[ts]
        out.append(SweepRef(path, tuple(float(v) for v in moved.reshape(-1)), (key - ts) / 1e6, ts))
    return tuple(out)


def _segment_tasks(
    root: str, path: str, opts: LayoutOptions, io: LayoutIO, calibrated: set[str]
) -> tuple[list[ScanTask], list[Reject]]:
    """One lidar file's tasks and rejects."""
    segment = _segment(path)
    try:
        frames = _read_frames(path, io)
    except FileNotFoundError:
        return [], [(path, "missing_file", "the lidar file vanished while listing")]
    except RejectError as err:
        return [], [(path, err.reason, err.detail)]
    except OSError as err:
        return [], [(path, "unreadable", f"{type(err).__name__}: {str(err)[:200]}")]
    except (pa.ArrowException, ValueError, TypeError) as err:
        return [], [(path, "bad_header", f"{type(err).__name__}: {str(err)[:200]}")]
    if not frames:
        return [], [(path, "empty", "the lidar file holds no frames")]
    if segment not in calibrated:
        detail = f"segment {segment} has no {calibration_path(path)}"
        return [], [(f"{path}#{ts}", "missing_file", detail) for ts in frames]
    poses: dict[int, NDArray[np.float64] | None] = {}
    pose_error: RejectError | None = None
    if opts.sweeps > 0 and len(frames) > 1:
        try:
            poses = read_poses(posixpath.join(root, "vehicle_pose", f"{segment}.parquet"), io)
        except RejectError as err:
            pose_error = err
    tasks: list[ScanTask] = []
    rejects: list[Reject] = []
    for i, ts in enumerate(frames):
        try:
            if pose_error is not None and i > 0:
                raise pose_error
            sweeps = _sweeps(frames, i, opts.sweeps, path, poses)
        except RejectError as err:
            rejects.append((f"{path}#{ts}", err.reason, err.detail))
            continue
        tasks.append(ScanTask(f"{segment}/{ts}", path, sweeps, None, ts))
    return tasks, rejects


def load_tasks(root: str, opts: LayoutOptions, io: LayoutIO) -> Found:
    """One task per (segment, frame) of the ``lidar/*.parquet`` files under ``root``.

    Reads only ``key.frame_timestamp_micros`` of each lidar file, and with ``opts.sweeps`` the
    segment's vehicle poses. Files in the component folders not named ``<segment>.parquet`` are
    ``unsupported_format``; a segment without calibration is ``missing_file`` for each of its frames; a
    frame or sweep without a valid vehicle pose is ``bad_table``.

    Raises:
        ValueError: ``root`` holds no ``lidar/*.parquet`` (not a Waymo v2 root), or bad ``opts.sweeps``.
    """
    if isinstance(opts.sweeps, bool) or not isinstance(opts.sweeps, int) or opts.sweeps < 0:
        raise ValueError(f"sweeps must be an int >= 0, got {opts.sweeps!r}")
    base = root.rstrip("/")
    rejects: list[Reject] = []
    parquet: dict[str, list[str]] = {}
    for component in COMPONENTS:
        folder = posixpath.join(base, component)
        found = []
        for p in io.glob(posixpath.join(folder, "**")):
            rel = p.replace("\\", "/")[len(folder) + 1 :]
            if "/" not in rel and rel.endswith(".parquet") and len(rel) > len(".parquet"):
                found.append(p)
            else:
                rejects.append((p, "unsupported_format", f"not a <segment>.parquet file of {component}/"))
        parquet[component] = sorted(found)
    if not parquet["lidar"]:
        raise ValueError(
            f"{root} holds no lidar/*.parquet: not a Waymo Open v2 root (lidar/, lidar_calibration/)"
        )
    calibrated = {_segment(p) for p in parquet["lidar_calibration"]}
    tasks: list[ScanTask] = []
    for path in parquet["lidar"]:
        got, bad = _segment_tasks(base, path, opts, io, calibrated)
        tasks += got
        rejects += bad
    tasks.sort(key=lambda t: t.sample_id)
    return Found(tasks, sorted(rejects))
