"""The Argoverse 2 sensor layout: ``<split>/<log_id>/sensors/lidar/<timestamp_ns>.feather``; one sample per sweep.

ROOT may be the download root (holding ``sensor/<split>/``), the dataset root (holding split folders), one
split (holding logs) or one log folder; all four are found by globbing ``sensors/lidar/*`` at depths 0, 1 and
2 below ROOT and below ``ROOT/sensor/*/*``.

Sample ids: ``<split>/<log_id>/<timestamp_ns>`` from a download or dataset root, ``<log_id>/<timestamp_ns>`` from a split
or a log folder (a log root contributes its own folder name), so a log scanned from its split or from itself
gets the same ids. Paths are ROOT + '/' + the path below it.

Sweeps: AV2 points are in the ego-vehicle frame, motion-compensated to the file name's timestamp, so a previous
sweep moves into the keyframe's frame through the city poses of ``<log>/city_SE3_egovehicle.feather``
(``timestamp_ns, qw, qx, qy, qz, tx_m, ty_m, tz_m``; quaternions (w, x, y, z), normalized):
``sensor_to_ref = inverse(city_SE3_ego(t_key)) @ city_SE3_ego(t_sweep)``. ``calibration/egovehicle_SE3_sensor``
is not needed (points are already in the ego frame) and is not read. ``--sweeps N`` takes the N previous
sweeps of the same log, newest first, fewer at the log's start; the pose table is read only when N > 0.

Rejects (the scan accounts for every file below ``sensors/lidar/``): a name that is not ``<timestamp_ns>.feather``
is ``unsupported_format``; with N > 0, a missing, oversized or malformed pose table rejects every sweep of its
log as ``bad_table``, and a timestamp (keyframe or previous sweep) without exactly one valid pose rejects the
samples that need it as ``bad_table`` naming the timestamp. No sweep file at all below ROOT is a ValueError.
"""

from __future__ import annotations

import posixpath
import re

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.layouts.geometry import pose_matrix, pose_record
from lidarshard.transforms.layouts.task import Found, LayoutIO, LayoutOptions, Reject, ScanTask, SweepRef

__all__ = ["NAME", "POSE_TABLE", "MAX_POSE_TABLE_BYTES", "describe", "load_tasks", "sweep_files"]

NAME = "av2"
#: A log's city poses of the ego vehicle, relative to the log folder.
POSE_TABLE = "city_SE3_egovehicle.feather"
#: Cap on one pose table read (a real one is ~0.2 MB for a 15 s log).
MAX_POSE_TABLE_BYTES = 256 << 20
_LIDAR = "sensors/lidar"
_DOWNLOAD = "sensor"  # the download root's folder of splits: ROOT/sensor/<split>/<log>/sensors/lidar
_POSE_COLUMNS = ("timestamp_ns", "qw", "qx", "qy", "qz", "tx_m", "ty_m", "tz_m")
_STEM = re.compile(r"(0|[1-9][0-9]{0,18})\.feather")
_INT64_MAX = 2**63 - 1


def sweep_files(root: str, io: LayoutIO, pattern: str = "*") -> list[str]:
    """Sorted full paths matching ``<root>[/*[/*]]/sensors/lidar/<pattern>`` (a log, split or dataset root)
    or ``<root>/sensor/*/*/sensors/lidar/<pattern>`` (the download root)."""
    base = root.rstrip("/")
    found: set[str] = set()
    for depth in range(3):
        found.update(io.glob("/".join([base, *["*"] * depth, _LIDAR, pattern])))
    found.update(io.glob("/".join([base, _DOWNLOAD, "*", "*", _LIDAR, pattern])))
    return sorted(found)


def _log_of(path: str, base: str) -> str:
    """The log folder's path below ``base`` ("" for a log root) of a sweep file found by ``sweep_files``."""
    rel = path[len(base) + 1 :] if path.startswith(base + "/") else path
    return rel[: -len(_LIDAR) - len(posixpath.basename(rel)) - 2]


def describe(root: str, io: LayoutIO) -> str | None:
    """``"Argoverse 2 sensor logs (1 log, 2 sweeps)"`` when ``root`` holds AV2 lidar sweeps, else None."""
    base = root.rstrip("/")
    files = sweep_files(root, io, "*.feather")
    if not files:
        return None
    logs = len({_log_of(p, base) for p in files})
    return f"Argoverse 2 sensor logs ({logs} log{'s' * (logs != 1)}, {len(files)} sweep{'s' * (len(files) != 1)})"


class _Poses:
    """City poses of one log: ``matrix(t)`` -> 4x4 float64 city_SE3_ego at timestamp ``t`` (ns)."""

    def __init__(self, path: str, io: LayoutIO) -> None:
        self.path = path
        table = _read_table(path, io)
        cols = []
        for name in _POSE_COLUMNS:
            idx = table.schema.get_all_field_indices(name)
            kind = table.schema.field(idx[0]).type if len(idx) == 1 else None
            if kind is None or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                what = "missing or duplicated" if kind is None else f"of type {kind}"
                raise RejectError("bad_table", f"{path}: column {name!r} is {what}")
            cols.append(table.column(idx[0]))
        stamps = cols[0]
        if not pa.types.is_integer(stamps.type) or stamps.null_count:
            raise RejectError("bad_table", f"{path}: timestamp_ns must be integers without nulls")
        self.values = np.column_stack([np.asarray(c.to_numpy(), dtype=np.float64) for c in cols[1:]])
        self.rows: dict[int, int] = {}
        self.duplicated: set[int] = set()
        for i, t in enumerate(stamps.to_pylist()):
            if self.rows.setdefault(t, i) != i:
                self.duplicated.add(t)
        self.cache: dict[tuple[int, bool], NDArray[np.float64]] = {}

    def matrix(self, t: int, inverse: bool = False) -> NDArray[np.float64]:
        """city_SE3_ego at ``t`` (``inverse``: ego_SE3_city, exact ``R.T``, ``-R.T t``); RejectError
        ``bad_table`` naming ``t`` when its pose is absent, duplicated or malformed."""
        if (t, inverse) not in self.cache:
            if t not in self.rows or t in self.duplicated:
                what = "no pose" if t not in self.rows else "more than one pose"
                raise RejectError("bad_table", f"{self.path} has {what} for timestamp_ns {t}")
            qw, qx, qy, qz, tx, ty, tz = self.values[self.rows[t]].tolist()
            try:
                mat = pose_matrix(pose_record([tx, ty, tz], [qw, qx, qy, qz]), inverse=inverse)
            except RejectError as err:
                raise RejectError("bad_table", f"{self.path} timestamp_ns {t}: {err.detail}") from None
            self.cache[(t, inverse)] = mat
        return self.cache[(t, inverse)]


def _read_table(path: str, io: LayoutIO) -> pa.Table:
    """The whole Arrow IPC (Feather v2) file at ``path``; RejectError ``bad_table`` for any failure."""
    try:
        data = io.read_bytes(path, MAX_POSE_TABLE_BYTES)
    except FileNotFoundError:
        raise RejectError("bad_table", f"{path} is missing (city poses are needed for --sweeps)") from None
    except OSError as e:  # FileTooLargeError included
        raise RejectError("bad_table", f"{path}: {type(e).__name__}: {str(e)[:200]}") from None
    try:
        table = ipc.open_file(pa.BufferReader(data)).read_all()
        table.validate(full=True)
    except (pa.ArrowException, OSError, ValueError, MemoryError) as e:
        detail = f"{path} is not a valid Arrow IPC (Feather v2) table: {type(e).__name__}: {str(e)[:200]}"
        raise RejectError("bad_table", detail) from None
    return table


def _log_tasks(
    log_dir: str, id_prefix: str, files: list[str], opts: LayoutOptions, io: LayoutIO
) -> tuple[list[ScanTask], list[Reject]]:
    """Tasks and rejects of one log's sweep files (full paths)."""
    rejects: list[Reject] = []
    stamped: list[tuple[int, str]] = []
    for path in files:
        name = posixpath.basename(path)
        m = _STEM.fullmatch(name)
        if m is None or int(m.group(1)) > _INT64_MAX:
            rejects.append(
                (path, "unsupported_format", f"AV2 sweep {name[:100]!r} is not <timestamp_ns>.feather")
            )
        else:
            stamped.append((int(m.group(1)), path))
    stamped.sort()
    poses: _Poses | RejectError | None = None
    if opts.sweeps > 0 and stamped:
        try:
            poses = _Poses(posixpath.join(log_dir, POSE_TABLE) if log_dir else POSE_TABLE, io)
        except RejectError as err:
            poses = err
    tasks = []
    for i, (t, path) in enumerate(stamped):
        refs: list[SweepRef] = []
        try:
            if isinstance(poses, RejectError):
                raise poses
            if poses is not None:
                ref_from_city = poses.matrix(t, inverse=True)
                for t_prev, prev in reversed(stamped[max(0, i - opts.sweeps) : i]):
                    mat = ref_from_city @ poses.matrix(t_prev)
                    refs.append(SweepRef(prev, tuple(mat.ravel().tolist()), (t - t_prev) / 1e9))
        except RejectError as err:
            rejects.append((path, err.reason, err.detail))
            continue
        tasks.append(ScanTask(f"{id_prefix}{t}", path, tuple(refs), None))
    return tasks, rejects


def load_tasks(root: str, opts: LayoutOptions, io: LayoutIO) -> Found:
    """One task per AV2 lidar sweep below ``root`` (a log, split or dataset root); see the module docstring.

    Raises:
        ValueError: no file below ``<root>[/*[/*]]/sensors/lidar/``, or ``opts.sweeps`` < 0.
    """
    if opts.sweeps < 0:
        raise ValueError(f"sweeps must be >= 0, got {opts.sweeps}")
    base = root.rstrip("/")
    files = sweep_files(root, io)
    if not files:
        raise ValueError(f"{root} holds no Argoverse 2 sweeps ([<split>/]<log>/sensors/lidar/*.feather)")
    by_log: dict[str, list[str]] = {}
    for path in files:
        by_log.setdefault(_log_of(path, base), []).append(path)
    own = posixpath.basename(base)
    tasks: list[ScanTask] = []
    rejects: list[Reject] = []
    for log, paths in sorted(by_log.items()):
        prefix = log or (own if own not in ("", ".", "..") else "")
        if log.count("/") == 2 and log.startswith(_DOWNLOAD + "/"):  # sensor/<split>/<log>: as from sensor/
            prefix = log[len(_DOWNLOAD) + 1 :]
        log_dir = f"{base}/{log}" if log else base
        got, bad = _log_tasks(log_dir, f"{prefix}/" if prefix else "", paths, opts, io)
        tasks += got
        rejects += bad
    tasks.sort(key=lambda task: task.sample_id)
    unique: list[ScanTask] = []
    for task in tasks:
        if unique and unique[-1].sample_id == task.sample_id:
            rejects.append(
                (task.path, "duplicate_id", f"sample {task.sample_id} already has {unique[-1].path}")
            )
        else:
            unique.append(task)
    return Found(unique, sorted(rejects))
