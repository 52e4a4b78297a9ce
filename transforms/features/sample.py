"""Read one sample (keyframe + sweeps + labels) and compute its feature row. Pure: I/O is injected.

The Beam DoFn in ``lidarshard.transforms.beam.scan_transform`` passes ``storage.read_bytes``/``storage.size``,
so the same code reads local paths, gs:// and s3:// URIs.

The row records what was read of every file it names (``schemas.INTEGRITY_FIELDS``): the size and the
``schemas.content_hash`` of the keyframe, of each sweep and of the label file, hashed from the bytes
already read for the features (nothing is read twice). ``--features stat`` reads no file: sizes only
(from the stat it already makes), the hash columns null.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.declare import option
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features.size import DEFAULT_VOXEL_SIZE, MAX_ABS_COORD, compute_features
from lidarshard.transforms.formats import readers
from lidarshard.transforms.formats.labels import label_format, read_labels
from lidarshard.transforms.formats.open3d_backend import read_points_open3d
from lidarshard.transforms.io.storage import FileTooLargeError
from lidarshard.transforms.io.storage import NotRegularFileError as NotRegularFile
from lidarshard.transforms.layouts.multisweep import (
    CLOSE_POINTS,
    DEFAULT_CLOSE_POINTS,
    aggregate,
    check_close_points,
)
from lidarshard.transforms.layouts.task import FRAMES_FORMAT, ScanTask
from lidarshard.transforms.layouts.waymo_v2 import read_frame
from lidarshard.transforms.value_checks import choice, float_in, float_list, int_in

__all__ = ["ScanConfig", "featurize", "file_task", "FEATURE_MODES"]

FEATURE_MODES = ("full", "stat")
VOXEL_RANGE = (1e-3, 1e3)  # m: below 1 mm the int64 voxel grid of a 100 km cloud overflows

ReadBytes = Callable[[str, int | None], bytes]  # (path, limit): at most limit + 1 bytes
SizeOf = Callable[[str], int]
OpenRead = Callable[[str], BinaryIO]


@dataclass(frozen=True)
class ScanConfig:
    """What shapes a feature row. Every field is recorded in ``_scan.json``; those a user sets are options of
    ``scan`` and ``build``."""

    voxel_size: float = option(f"occupancy voxel edge, metres, in [{VOXEL_RANGE[0]:g}, {VOXEL_RANGE[1]:g}]",
                               DEFAULT_VOXEL_SIZE, check=float_in(*VOXEL_RANGE), metavar="M")  # fmt: skip
    point_cloud_range: tuple[float, ...] | None = option(
        "x0,y0,z0,x1,y1,z1 metres: points outside are ignored", None, check=float_list(6), shown="all points",
        metavar="X0,Y0,Z0,X1,Y1,Z1")  # fmt: skip
    point_dims: int | None = option("float32 values per point of headerless .bin files", None, check=int_in(3, 64),
                                    shown="by format", metavar="N")  # fmt: skip
    format: str | None = option("override extension-based format detection", None,
                                check=choice(*readers.FORMATS), shown="by extension")  # fmt: skip
    features: str = option("'stat' sizes fixed-record files from their byte count, unread", "full",
                           check=choice(*FEATURE_MODES))  # fmt: skip
    max_file_bytes: int = option("larger files are rejected as too_large before reading", 2 << 30,
                                 check=int_in(1), shown="2 GiB", metavar="BYTES")  # fmt: skip
    max_points: int = option("larger clouds are rejected as too_large before allocation", 50_000_000,
                             check=int_in(1), shown="50M", metavar="N")  # fmt: skip
    max_abs_coord: float = MAX_ABS_COORD  # m
    backend: str = option("reader for .pcd/.ply", "numpy", check=choice("numpy", "open3d"))
    #: Which clouds lose their close points (``multisweep.CLOSE_POINTS``); the loaders apply the same rule.
    close_points: str = option(
        "which clouds lose their points within 1 m of the sensor (|x|, |y| < 1 m): 'sweeps' (mmdet3d), 'devkit' "
        "(every cloud, the keyframe too: nuScenes from_file_multisweep), 'none'; size features and loaders use "
        "the same rule", DEFAULT_CLOSE_POINTS, check=choice(*CLOSE_POINTS))  # fmt: skip
    extra: dict[str, str] = field(default_factory=dict)
    #: The algorithm of the rows' ``*_crc32`` columns (``schemas.CONTENT_HASH``); None under
    #: ``--features stat``, which reads no file and records sizes only. Derived, not a flag.
    content_hash: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.features not in FEATURE_MODES:
            raise ValueError(f"--features must be one of {FEATURE_MODES}, got {self.features!r}")
        object.__setattr__(self, "content_hash", None if self.features == "stat" else schemas.CONTENT_HASH)
        if self.voxel_size <= 0:
            raise ValueError(f"--voxel-size must be > 0, got {self.voxel_size}")
        box = self.point_cloud_range
        if box is not None and len(box) != 6:
            raise ValueError("--point-cloud-range needs 6 numbers: x0,y0,z0,x1,y1,z1")
        if box is not None and not all(box[i] < box[i + 3] for i in range(3)):
            shown = ",".join(f"{v:g}" for v in box)
            raise ValueError(f"--point-cloud-range {shown}: needs x0 < x1, y0 < y1, z0 < z1")
        check_close_points(self.close_points)


@dataclass(frozen=True)
class _FileTask(ScanTask):
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


def file_task(sample_id: str, path: str) -> ScanTask:
    """A task for a plain file (no sweeps, no labels); ``featurize`` rejects a non-UTF-8 name."""
    try:
        path.encode("utf-8")
        sample_id.encode("utf-8")
    except UnicodeEncodeError:
        shown = _escaped(path)
        detail = f"file name '{shown}' is not valid UTF-8; rename it to include it"
        return _BadName(sample_id=_escaped(sample_id), path=shown, sweeps=(), label_path=None, detail=detail)
    return _FileTask(sample_id=sample_id, path=path, sweeps=(), label_path=None)


def _why(e: OSError) -> str:
    """What went wrong, without the path (the reject row holds it): ``strerror`` when the OS gave one."""
    return e.strerror or str(e)


def _size(path: str, size_of: SizeOf, missing: str) -> int:
    try:
        return size_of(path)
    except NotRegularFile as e:  # a FIFO, device or directory is there: never read it
        raise RejectError("unreadable", str(e)) from None
    except OSError as e:  # Beam raises BeamIOError, an IOError (= OSError)
        raise RejectError(missing, _why(e)) from None


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
        raise RejectError("unreadable", _why(e)) from None
    if len(data) > cfg.max_file_bytes:
        raise RejectError("too_large", f"{path}: more than --max-file-bytes {cfg.max_file_bytes} bytes")
    if len(data) != size:
        raise RejectError("unreadable", f"{path}: read {len(data)} bytes, file has {size}")
    return data


def _points(data: bytes, fmt: str, cfg: ScanConfig) -> np.ndarray:
    if cfg.backend == "open3d" and fmt in ("pcd", "ply"):
        return read_points_open3d(data, fmt)
    # A read-only view of the file's bytes where the format allows: features only read the points, and
    # ``aggregate`` copies what it keeps.
    return readers.read_points(data, fmt, point_dims=cfg.point_dims, max_points=cfg.max_points, copy=False)


def _missing(task: ScanTask) -> str:
    """Reject reason for a keyframe file that is not there."""
    return "unreadable" if isinstance(task, _FileTask) else "missing_file"


def _stat_row(task: ScanTask, fmt: str, size_of: SizeOf, cfg: ScanConfig) -> dict:
    """Sizes only: points from each file's size, the label file's size against the keyframe's points."""
    key = _size(task.path, size_of, _missing(task))
    sweeps = [_size(s.path, size_of, "missing_sweep") for s in task.sweeps]
    n = [readers.count_points_from_size(size, fmt, cfg.point_dims) for size in (key, *sweeps)]
    label = None
    if task.label_path is not None:
        label = _size(task.label_path, size_of, "label_mismatch")
        per_point = 4 if label_format(task.label_path) == "semantickitti" else 1
        if label != n[0] * per_point:  # read_labels' rule on the size alone: one record per keyframe point
            raise RejectError(
                "label_mismatch",
                f"label file holds {label} bytes, {per_point} a label, but the keyframe has {n[0]} points",
            )
    return {
        "file_bytes": key + sum(sweeps),
        "num_points": sum(n),
        "has_labels": task.label_path is not None,
        "path_bytes": key,
        "sweep_bytes": sweeps,
        "label_bytes": label,
    }


def _recorded(data: bytes) -> tuple[int, int]:
    """(size, content hash) of one file's bytes: what the loaders and ``validate --data`` check."""
    return len(data), schemas.content_hash(data)


def _frame_points(
    task: ScanTask, open_read: OpenRead | None, size_of: SizeOf, cfg: ScanConfig
) -> tuple[NDArray[np.float32], list[NDArray[np.float32]], dict]:
    """Keyframe and sweep points of a sample whose files hold many frames (Waymo v2), and what is
    recorded of the files: their sizes (the frames are read by row group, so no whole-file hash)."""
    if open_read is None:
        raise ValueError("featurize needs open_read for a multi-frame sample")
    assert task.frame is not None
    size = _size(task.path, size_of, _missing(task))
    key = read_frame(open_read, task.path, task.frame, cfg.max_points)
    sweeps, sizes = [], []
    for ref in task.sweeps:
        sizes.append(_size(ref.path, size_of, "missing_sweep"))
        if ref.frame is None:
            raise RejectError("bad_table", f"sweep of {task.sample_id} in {ref.path} names no frame")
        sweeps.append(read_frame(open_read, ref.path, ref.frame, cfg.max_points))
    recorded = {"path_bytes": size, "sweep_bytes": sizes, "file_bytes": size + sum(sizes)}
    return key, sweeps, recorded


def _check_labels(
    task: ScanTask,
    key: NDArray[np.float32],
    read_bytes: ReadBytes,
    size_of: SizeOf,
    cfg: ScanConfig,
    label_map: Mapping[int, int] | None,
    row: dict,
) -> None:
    """The keyframe's label file holds one valid label per point (``formats.labels.read_labels``);
    records its size and hash in ``row``."""
    if task.label_path is None:
        return
    label = _read(task.label_path, read_bytes, size_of, cfg, "label_mismatch")
    read_labels(label, label_format(task.label_path), len(key), label_map)
    row["label_bytes"], row["label_crc32"] = _recorded(label)


def featurize(
    task: ScanTask,
    read_bytes: ReadBytes,
    size_of: SizeOf,
    cfg: ScanConfig,
    open_read: OpenRead | None = None,
    label_map: Mapping[int, int] | None = None,
) -> dict:
    """One row of ``lidarshard.schemas.SAMPLE_FIELDS`` for ``task``.

    ``open_read`` reads the row groups of a multi-frame file (a task with ``frame``); ``label_map``
    maps the layout's raw label ids to class ids (``formats.labels.read_labels``).

    Raises:
        RejectError: any bad input, with a reason from ``lidarshard.schemas.REJECT_REASONS``.
    """
    if isinstance(task, _BadName):
        raise RejectError("unreadable", task.detail)
    frames = task.frame is not None
    fmt = FRAMES_FORMAT if frames else cfg.format or task.format or readers.detect_format(task.path)
    row: dict = {
        "sample_id": task.sample_id,
        "dataset": task.dataset,
        "path": task.path,
        "sweep_paths": [s.path for s in task.sweeps],
        "sweep_transforms": [float(v) for s in task.sweeps for v in s.sensor_to_ref],
        "frame": task.frame,
        "sweep_frames": [s.frame for s in task.sweeps] if frames else None,
        "sweep_time_lags": [float(s.time_lag_s) for s in task.sweeps],
        "label_path": task.label_path,
        "format": fmt,
        "num_sweeps": len(task.sweeps),
    }
    if cfg.features == "stat":
        try:
            if frames:
                raise ValueError(fmt)
            return row | _stat_row(task, fmt, size_of, cfg)
        except ValueError:
            raise RejectError("unsupported_format", f"--features stat cannot size {fmt} files") from None
    if frames:
        key, sweeps, recorded = _frame_points(task, open_read, size_of, cfg)
        row |= recorded
        _check_labels(task, key, read_bytes, size_of, cfg, label_map, row)
        transforms = [np.asarray(ref.sensor_to_ref, dtype=np.float64).reshape(4, 4) for ref in task.sweeps]
    else:
        data = _read(task.path, read_bytes, size_of, cfg, _missing(task))
        row["path_bytes"], row["path_crc32"] = _recorded(data)
        key = _points(data, fmt, cfg)
        _check_labels(task, key, read_bytes, size_of, cfg, label_map, row)
        sweeps, transforms, sizes, hashes = [], [], [], []
        for ref in task.sweeps:
            sweep_data = _read(ref.path, read_bytes, size_of, cfg, "missing_sweep")
            size, digest = _recorded(sweep_data)
            sizes.append(size)
            hashes.append(digest)
            sweeps.append(_points(sweep_data, fmt, cfg))
            transforms.append(np.asarray(ref.sensor_to_ref, dtype=np.float64).reshape(4, 4))
        row |= {"file_bytes": row["path_bytes"] + sum(sizes), "sweep_bytes": sizes, "sweep_crc32": hashes}
    rule = cfg.close_points
    points = aggregate(key, sweeps, transforms, close_points=rule) if sweeps or rule == "devkit" else key
    if points.shape[0] > cfg.max_points:
        raise RejectError("too_large", f"{points.shape[0]} points > --max-points {cfg.max_points}")
    feats = compute_features(
        points,
        voxel_size=cfg.voxel_size,
        point_cloud_range=cfg.point_cloud_range,
        max_abs_coord=cfg.max_abs_coord,
    )
    return row | feats | {"has_labels": task.label_path is not None}
