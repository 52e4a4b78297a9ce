"""One sample's points: the keyframe plus its sweeps moved into the keyframe's sensor frame.

Every file can be checked against what the scan recorded of it (``Recorded``: its size and
``schemas.content_hash``, the samples' ``schemas.INTEGRITY_FIELDS``): a file of another size is refused
on its size before it is read (at most one byte more than the recorded size otherwise), so a huge
replacement is never read whole.

Pure numpy; imports neither Beam nor torch. Paths may be local or URIs (``gs://``, ``s3://``, ...):
every read goes through ``lidarshard.transforms.io.storage``. A file that is not there raises
``FileNotFoundError("not found: PATH")``; :func:`moved_hint` is the hint a reader appends when the data
moved (``transforms.paths.PathResolver`` turns stored paths into paths to open).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.readers import detect_format, read_points
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.base import FileTooLargeError
from lidarshard.transforms.layouts.geometry import sweep_matrices
from lidarshard.transforms.layouts.multisweep import DEFAULT_CLOSE_POINTS, aggregate, drop_non_finite_rows
from lidarshard.transforms.layouts.task import FRAMES_FORMAT

#: The largest file size a manifest may record (1 TiB): a larger number is a corrupt record.
MAX_RECORDED_BYTES = 1 << 40

__all__ = [
    "load_points",
    "Recorded",
    "FileChangedError",
    "read_recorded",
    "difference",
    "moved_hint",
    "bad_time_lag",
    "check_time_lags",
]


def moved_hint(
    path_root: str | None, root: str | None = None, path_map: Mapping[str, str] | None = None
) -> str:
    """What to tell a user whose manifest names a file that is not there (the data may have moved)."""
    if path_root is None:
        if path_map:
            return f"the manifest stores full paths, mapped by path_map={dict(path_map)}"
        return "the manifest stores full paths; pass path_map={'/old/prefix': '/new/prefix'} if the dataset moved"
    if root is not None:
        return f"looked under root={root}; the manifest's path_root is {path_root}"
    return f"the manifest's path_root is {path_root}; pass root= if the dataset moved"


@dataclass(frozen=True)
class Recorded:
    """What the scan recorded of one file: ``size`` in bytes and ``crc32`` (``schemas.content_hash``).
    None: not recorded (a table given to ``write_manifest``; the hash under ``--features stat``), or
    not to be checked. Checked where it is made, since a manifest's numbers are read from files: a
    size outside ``0..MAX_RECORDED_BYTES`` or a CRC-32 outside ``0..2**32-1`` raises ValueError, so
    nothing downstream is sized or bounded by it."""

    size: int | None
    crc32: int | None = None

    def __post_init__(self) -> None:
        for name, value, top in (("size", self.size, MAX_RECORDED_BYTES), ("crc32", self.crc32, 0xFFFFFFFF)):
            if value is not None and (type(value) is not int or not 0 <= value <= top):
                raise ValueError(f"a recorded file {name} must be an integer in 0..{top}, got {value!r}")


class FileChangedError(ValueError):
    """A file a manifest names is not the one the scan recorded (another size or content hash)."""


def difference(recorded: Recorded, size: int, crc32: int | None = None) -> str | None:
    """What differs between ``recorded`` and a file of ``size`` bytes and hash ``crc32`` (None: not
    computed), as a phrase; None when nothing recorded differs."""
    if recorded.size is not None and size != recorded.size:
        return f"{size} bytes, the scan recorded {recorded.size}"
    if recorded.crc32 is not None and crc32 is not None and crc32 != recorded.crc32:
        return (
            f"{schemas.CONTENT_HASH} {crc32:08x}, the scan recorded {recorded.crc32 & 0xFFFFFFFF:08x} "
            "(same size, other contents)"
        )
    return None


def _changed(path: str, what: str) -> FileChangedError:
    return FileChangedError(
        f"{path} is not the file the manifest was built from ({what}); restore it, or rescan the data"
    )


def _size_now(path: str, fallback: int) -> int:
    """The file's size for a message (``fallback``, a lower bound, when it cannot be stat'ed)."""
    try:
        return storage.size(path)
    except OSError:
        return fallback


def read_recorded(path: str, recorded: Recorded | None) -> bytes:
    """The bytes of ``path``, checked against ``recorded`` (None or ``size`` None: read unchecked).

    Never reads more than ``recorded.size + 1`` bytes.

    Raises:
        FileChangedError: the size, or the CRC-32 when one is recorded, differs (naming the path).
        FileNotFoundError: nothing at ``path`` ("not found: PATH").
        OSError: as ``storage.read_bytes``.
    """
    size = None if recorded is None else recorded.size
    try:
        data = storage.read_bytes(path, size)
    except FileNotFoundError:
        raise FileNotFoundError(f"not found: {path}") from None
    except FileTooLargeError as e:
        raise _changed(path, f"{_size_now(path, e.size)} bytes, the scan recorded {size}") from None
    if recorded is None or size is None:
        return data
    crc = schemas.content_hash(data) if recorded.crc32 is not None and len(data) == recorded.size else None
    what = difference(recorded, len(data), crc)
    if what:
        raise _changed(path, what)
    return data


def bad_time_lag(lags: Sequence[float] | NDArray[np.floating]) -> int | None:
    """The index of the first of ``lags`` (s, from a sweep to its keyframe) that is no finite number
    >= 0 (NaN, an infinity, a negative lag: a sweep after its keyframe), or None when all are."""
    values = np.asarray(lags, dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0)))
    return int(bad[0]) if len(bad) else None


def check_time_lags(table: pa.Table) -> None:
    """What a dataset that serves the time-lag channel checks of its samples (``sample_id``,
    ``sweep_paths``, ``sweep_time_lags`` columns): ValueError naming the first sample with sweeps but no
    recorded lags, or one with a lag that is no finite number >= 0 (``bad_time_lag``: NaN, an infinity,
    a negative lag of a sweep after its keyframe; a null lag)."""
    missing = pc.and_(
        pc.greater(pc.list_value_length(table["sweep_paths"]), 0), table["sweep_time_lags"].is_null()
    )
    count = pc.sum(missing).as_py() or 0
    if count:
        first = table["sample_id"].filter(missing)[0].as_py()
        raise ValueError(
            f"time_lag=True: {count} samples with sweeps record no sweep_time_lags (first: {first}; a manifest "
            "written before schema 4.3, or a table given to write_manifest); rescan to record them"
        )
    lags = table["sweep_time_lags"].combine_chunks() if table.num_rows else None
    if lags is None:
        return
    values = pc.list_flatten(lags).to_numpy(zero_copy_only=False)  # a null lag reads as NaN
    bad = bad_time_lag(values)
    if bad is not None:
        rows = pc.list_parent_indices(lags).to_numpy()
        sample = table["sample_id"][int(rows[bad])].as_py()
        raise ValueError(
            f"time_lag=True: sample {sample!r} records a sweep time lag of {float(values[bad])!r} s; a lag is the finite "
            "number of seconds >= 0 from a sweep to its keyframe: rebuild the manifest from the data"
        )


def load_points(
    path: str,
    fmt: str | None,
    sweep_paths: Sequence[str] = (),
    sweep_transforms: Sequence[float] | NDArray[np.float64] | None = None,
    point_dims: int | None = None,
    recorded: Sequence[Recorded | None] | None = None,
    read: Callable[[str, Recorded | None], bytes] | None = None,
    frames: Sequence[int] | None = None,
    close_points: str = DEFAULT_CLOSE_POINTS,
    time_lags: Sequence[float] | None = None,
    drop_nan: bool = True,
) -> NDArray[np.float32]:
    """One sample's points: the keyframe plus its sweeps moved into the keyframe's sensor frame.

    Args:
        path: keyframe path/URI.
        fmt: reader name from the samples' ``format`` (None: detect from ``path``); sweeps use it too.
        sweep_paths: S sweep paths/URIs, newest first.
        sweep_transforms: 16*S floats, row-major 4x4 sweep-sensor -> keyframe-sensor per sweep.
        point_dims: channels per point for raw ``bin`` files, passed to the reader.
        recorded: 1 + S ``Recorded`` (keyframe, then each sweep) each file is checked against
            (``read_recorded``); None: files are read unchecked.
        read: how a file's checked bytes are got (default ``read_recorded``); the dataset passes its
            ``loaders.fetch.Fetcher.read``, which serves prefetched and cached reads, checked alike.
        frames: 1 + S row keys (keyframe, then each sweep) when the files hold many frames (the
            samples' ``frame`` / ``sweep_frames``; format ``waymo_v2``): each frame is read by row
            group (``transforms.layouts.waymo_v2.read_frame``), each file checked on its size.
        close_points: which clouds lose their close points (``multisweep.CLOSE_POINTS``): the rule the
            scan recorded (``multisweep.recorded_close_points``), so the points are those it counted.
        time_lags: S lags (s, the samples' ``sweep_time_lags``, each a finite number >= 0): append the
            time-lag channel (0 on the keyframe's rows); None: no such column.
        drop_nan: drop the rows with a NaN or infinite x, y or z (``multisweep.drop_non_finite_rows``,
            open3d's ``remove_non_finite_points``: organised clouds' no-return pixels), which the scan's
            ``num_points`` does not count (``multisweep.NON_FINITE_RULE``); False: every row as read.

    Returns:
        (N' + sum M', C) float32, xyz first (the keyframe only when ``sweep_paths`` is empty); C + 1
        columns with ``time_lags``, the lag last.

    Raises:
        FileChangedError: a file is not the one recorded (naming it).
        ValueError: a time lag that is no finite number >= 0 (naming the keyframe and the sweep).
    """
    lags = None if time_lags is None else np.asarray(time_lags, dtype=np.float64)  # None reads as NaN
    bad = None if lags is None else bad_time_lag(lags)
    if bad is not None:
        assert lags is not None
        raise ValueError(
            f"{path}: time lag {float(lags[bad])!r} of sweep {bad} is no finite number of seconds >= 0; "
            "rebuild the manifest from the data"
        )
    points = _load(
        path, fmt, sweep_paths, sweep_transforms, point_dims, recorded, read, frames, close_points, time_lags
    )
    return drop_non_finite_rows(points) if drop_nan else points


def _load(
    path: str,
    fmt: str | None,
    sweep_paths: Sequence[str],
    sweep_transforms: Sequence[float] | NDArray[np.float64] | None,
    point_dims: int | None,
    recorded: Sequence[Recorded | None] | None,
    read: Callable[[str, Recorded | None], bytes] | None,
    frames: Sequence[int] | None,
    close_points: str,
    time_lags: Sequence[float] | None,
) -> NDArray[np.float32]:
    """``load_points`` with every row, finite or not."""
    files = [path, *sweep_paths]
    checks: list[Recorded | None] = list(recorded) if recorded is not None else [None] * len(files)
    if len(checks) != len(files):
        raise ValueError(f"{path}: {len(checks)} recorded files for a keyframe and {len(sweep_paths)} sweeps")
    if fmt == FRAMES_FORMAT:
        return _load_frames(files, frames, checks, sweep_transforms, close_points, time_lags)
    read = read or read_recorded
    fmt = fmt or detect_format(path)
    # With sweeps, aggregate copies each kept row once, into the one array it returns: the files'
    # points are only read there, so fixed-record files are decoded as views of their bytes.
    copy = not sweep_paths and close_points != "devkit" and time_lags is None
    keyframe = read_points(read(path, checks[0]), fmt, point_dims=point_dims, copy=copy)
    if copy:
        return np.ascontiguousarray(keyframe, dtype=np.float32)
    mats = sweep_matrices(sweep_transforms, len(sweep_paths), path)
    sweeps = [
        read_points(read(p, c), fmt, point_dims=point_dims, copy=copy)
        for p, c in zip(sweep_paths, checks[1:], strict=True)
    ]
    return aggregate(keyframe, sweeps, list(mats), close_points=close_points, time_lags=time_lags)


def _load_frames(
    files: list[str],
    frames: Sequence[int] | None,
    checks: list[Recorded | None],
    sweep_transforms: Sequence[float] | NDArray[np.float64] | None,
    close_points: str,
    time_lags: Sequence[float] | None,
) -> NDArray[np.float32]:
    """Points of a sample whose files hold many frames (Waymo v2): each file checked on its recorded
    size, each frame read by row group, sweeps moved into the keyframe's frame under ``close_points``
    (with ``time_lags``: the time-lag channel appended)."""
    from lidarshard.transforms.layouts.waymo_v2 import read_frame

    if frames is None or len(frames) != len(files):
        raise ValueError(f"{files[0]}: a {FRAMES_FORMAT} sample needs one frame per file, got {frames!r}")
    clouds = []
    for path, frame, check in zip(files, frames, checks, strict=True):
        try:
            size = storage.size(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"not found: {path}") from None
        what = difference(check, size) if check is not None else None
        if what:
            raise _changed(path, what)
        try:
            clouds.append(read_frame(storage.open_read, path, int(frame), _MAX_POINTS))
        except RejectError as e:
            raise ValueError(f"{path} frame {frame}: {e.reason}: {e.detail}") from None
    if len(clouds) == 1 and close_points != "devkit" and time_lags is None:
        return clouds[0]
    mats = sweep_matrices(sweep_transforms, len(clouds) - 1, files[0])
    return aggregate(clouds[0], clouds[1:], list(mats), close_points=close_points, time_lags=time_lags)


#: Most points one frame of a multi-frame file may hold when read for training (the scan's default cap).
_MAX_POINTS = 50_000_000
