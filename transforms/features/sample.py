"""Read one sample (keyframe + sweeps + labels) and compute its feature row. Pure: I/O is injected.

The Beam DoFn in ``lidarshard.transforms.beam.scan`` passes ``storage.read_bytes``/``storage.size``,
so the same code reads local paths, gs:// and s3:// URIs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features.size import DEFAULT_VOXEL_SIZE, MAX_ABS_COORD, compute_features
from lidarshard.transforms.formats import readers
from lidarshard.transforms.nuscenes.multisweep import aggregate
from lidarshard.transforms.nuscenes.tables import NuScenesTask, check_labels
from lidarshard.transforms.storage import FileTooLargeError
from lidarshard.transforms.storage import NotRegularFileError as NotRegularFile

__all__ = ["ScanConfig", "featurize", "file_task", "FEATURE_MODES"]

FEATURE_MODES = ("full", "stat")

ReadBytes = Callable[[str, int | None], bytes]  # (path, limit): at most limit + 1 bytes
SizeOf = Callable[[str], int]


@dataclass(frozen=True)
class ScanConfig:
    """What shapes a feature row. Every field is recorded in ``_scan.json``."""

    voxel_size: float = DEFAULT_VOXEL_SIZE  # m
    point_cloud_range: tuple[float, ...] | None = None  # (x0, y0, z0, x1, y1, z1) m
    point_dims: int | None = None  # float32 values per point for headerless .bin
    format: str | None = None  # override extension-based detection
    features: str = "full"  # "full" reads every point; "stat" sizes fixed-record files only
    max_file_bytes: int = 2 << 30
    max_points: int = 50_000_000
    max_abs_coord: float = MAX_ABS_COORD  # m
    backend: str = "numpy"  # or "open3d" for .pcd/.ply
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.features not in FEATURE_MODES:
            raise ValueError(f"--features must be one of {FEATURE_MODES}, got {self.features!r}")
        if self.voxel_size <= 0:
            raise ValueError(f"--voxel-size must be > 0, got {self.voxel_size}")
        if self.point_cloud_range is not None and len(self.point_cloud_range) != 6:
            raise ValueError("--point-cloud-range needs 6 numbers: x0,y0,z0,x1,y1,z1")


@dataclass(frozen=True)
class _FileTask(NuScenesTask):
    """A plain file found by listing INPUT (not named by tables): when it is gone, it is ``unreadable``
    rather than ``missing_file``."""


@dataclass(frozen=True)
class _BadName(_FileTask):
    """A file whose name is not valid UTF-8: Arrow/Beam strings cannot hold it, so it is rejected
    unread; ``path`` and ``sample_id`` hold the name with the bad bytes escaped (``\\xff``)."""

    detail: str = ""


def _escaped(name: str) -> str:
    try:  # undecodable bytes arrive as lone surrogates (surrogateescape): show them as \xNN
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def file_task(sample_id: str, path: str) -> NuScenesTask:
    """A task for a plain file (no sweeps, no labels); ``featurize`` rejects a non-UTF-8 name."""
    try:
        path.encode("utf-8")
        sample_id.encode("utf-8")
    except UnicodeEncodeError:
        shown = _escaped(path)
        detail = f"file name '{shown}' is not valid UTF-8; rename it to include it"
        return _BadName(sample_id=_escaped(sample_id), path=shown, sweeps=(), label_path=None, detail=detail)
    return _FileTask(sample_id=sample_id, path=path, sweeps=(), label_path=None)


def _size(path: str, size_of: SizeOf, missing: str) -> int:
    try:
        return size_of(path)
    except NotRegularFile as e:  # a FIFO, device or directory is there: never read it
        raise RejectError("unreadable", str(e)) from None
    except OSError as e:  # Beam raises BeamIOError, an IOError (= OSError)
        raise RejectError(missing, f"{path}: {e}") from None


def _read(path: str, read_bytes: ReadBytes, size_of: SizeOf, cfg: ScanConfig, missing: str) -> bytes:
    size = _size(path, size_of, missing)
    if size > cfg.max_file_bytes:
        raise RejectError("too_large", f"{size} bytes > --max-file-bytes {cfg.max_file_bytes}")
    try:
        data = read_bytes(path, cfg.max_file_bytes)  # capped whatever the size said
    except FileTooLargeError as e:
        raise RejectError("too_large", f"{e.size} bytes > --max-file-bytes {cfg.max_file_bytes}") from None
    except IsADirectoryError:
        raise RejectError("unreadable", f"{path} is a directory") from None
    except OSError as e:
        raise RejectError("unreadable", f"{path}: {e}") from None
    if len(data) > cfg.max_file_bytes:
        raise RejectError("too_large", f"{path}: more than --max-file-bytes {cfg.max_file_bytes} bytes")
    if len(data) != size:
        raise RejectError("unreadable", f"{path}: read {len(data)} bytes, file has {size}")
    return data


def _points(data: bytes, fmt: str, cfg: ScanConfig) -> np.ndarray:
    if cfg.backend == "open3d" and fmt in ("pcd", "ply"):
        from lidarshard.transforms.formats.open3d_backend import read_points_open3d

        return read_points_open3d(data, fmt)
    return readers.read_points(data, fmt, point_dims=cfg.point_dims, max_points=cfg.max_points)


def _missing(task: NuScenesTask) -> str:
    """Reject reason for a keyframe file that is not there."""
    return "unreadable" if isinstance(task, _FileTask) else "missing_file"


def _stat_row(task: NuScenesTask, fmt: str, size_of: SizeOf, cfg: ScanConfig) -> dict:
    total, n = 0, 0
    for p in (task.path, *(s.path for s in task.sweeps)):
        size = _size(p, size_of, "missing_sweep" if p != task.path else _missing(task))
        total += size
        n += readers.count_points_from_size(size, fmt, cfg.point_dims)
    return {"file_bytes": total, "num_points": n, "has_labels": task.label_path is not None}


def featurize(task: NuScenesTask, read_bytes: ReadBytes, size_of: SizeOf, cfg: ScanConfig) -> dict:
    """One row of ``lidarshard.schemas.SAMPLE_FIELDS`` for ``task``.

    Raises:
        RejectError: any bad input, with a reason from ``lidarshard.schemas.REJECT_REASONS``.
    """
    if isinstance(task, _BadName):
        raise RejectError("unreadable", task.detail)
    fmt = cfg.format or readers.detect_format(task.path)
    row: dict = {
        "sample_id": task.sample_id,
        "path": task.path,
        "sweep_paths": [s.path for s in task.sweeps],
        "sweep_transforms": [float(v) for s in task.sweeps for v in s.sensor_to_ref],
        "label_path": task.label_path,
        "format": fmt,
        "num_sweeps": len(task.sweeps),
    }
    if cfg.features == "stat":
        try:
            return row | _stat_row(task, fmt, size_of, cfg)
        except ValueError:
            raise RejectError("unsupported_format", f"--features stat cannot size {fmt} files") from None
    data = _read(task.path, read_bytes, size_of, cfg, _missing(task))
    file_bytes = len(data)
    key = _points(data, fmt, cfg)
    if task.label_path is not None:
        check_labels(_read(task.label_path, read_bytes, size_of, cfg, "label_mismatch"), len(key))
    sweeps, transforms = [], []
    for ref in task.sweeps:
        sweep_data = _read(ref.path, read_bytes, size_of, cfg, "missing_sweep")
        file_bytes += len(sweep_data)
        sweeps.append(_points(sweep_data, fmt, cfg))
        transforms.append(np.asarray(ref.sensor_to_ref, dtype=np.float64).reshape(4, 4))
    points = aggregate(key, sweeps, transforms) if sweeps else key
    if points.shape[0] > cfg.max_points:
        raise RejectError("too_large", f"{points.shape[0]} points > --max-points {cfg.max_points}")
    feats = compute_features(
        points,
        voxel_size=cfg.voxel_size,
        point_cloud_range=cfg.point_cloud_range,
        max_abs_coord=cfg.max_abs_coord,
    )
    return row | feats | {"file_bytes": file_bytes, "has_labels": task.label_path is not None}
