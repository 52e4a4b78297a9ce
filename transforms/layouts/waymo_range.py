"""Waymo Open v2 range images -> points, one frame at a time. Pure numpy/pyarrow (no Waymo, no TensorFlow).

A ``lidar/<segment>.parquet`` row is one laser of one frame: two range images (returns), each a flat
``values`` list of an ``(H, W, 4)`` float32 image (range m, intensity, elongation, no-label-zone) and its
``shape``. ``lidar_calibration/<segment>.parquet`` holds each laser's extrinsic (sensor -> vehicle, 4x4
row-major) and beam inclinations. The conversion is Waymo's: row ``h`` looks at inclination ``inc[h]``
(top beam first), column ``j`` at azimuth ``((W - j - 0.5) / W * 2 - 1) * pi - atan2(E[1,0], E[0,0])``.
Points land in the vehicle frame at the frame's timestamp; the top lidar's per-pixel poses
(``lidar_pose``, rolling-shutter motion) are not applied.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.io.arrow import parquet_file

__all__ = [
    "read_parquet",
    "KEY_SEGMENT",
    "KEY_FRAME",
    "KEY_LASER",
    "RETURNS",
    "CAL_EXTRINSIC",
    "CAL_INC_MIN",
    "CAL_INC_MAX",
    "CAL_INC_VALUES",
    "PIXELS_PER_POINT",
    "calibration_path",
    "beam_inclinations",
    "range_image_points",
    "read_frame",
]

KEY_SEGMENT = "key.segment_context_name"
KEY_FRAME = "key.frame_timestamp_micros"
KEY_LASER = "key.laser_name"
_LIDAR = "[LiDARComponent]"
#: (values column, shape column) of return 1 and return 2.
RETURNS = tuple(
    (f"{_LIDAR}.range_image_return{r}.values", f"{_LIDAR}.range_image_return{r}.shape") for r in (1, 2)
)
_CAL = "[LiDARCalibrationComponent]"
CAL_EXTRINSIC = f"{_CAL}.extrinsic.transform"
CAL_INC_MIN = f"{_CAL}.beam_inclination.min"
CAL_INC_MAX = f"{_CAL}.beam_inclination.max"
CAL_INC_VALUES = f"{_CAL}.beam_inclination.values"
#: Range image channels: range (m), intensity, elongation, no-label-zone.
_CHANNELS = 4
#: A frame's range images may claim at most this many pixels per allowed point before their values are
#: read (a real frame: ~1.3M pixels over 5 lasers x 2 returns for ~170k-300k points).
PIXELS_PER_POINT = 16
#: A calibration file holds one row per laser (5 in Waymo); more rows than this is not a calibration.
_MAX_CALIBRATION_ROWS = 256

OpenRead = Callable[[str], BinaryIO]


_T = TypeVar("_T")


def calibration_path(lidar_path: str) -> str:
    """``<root>/lidar_calibration/<segment>.parquet`` for ``<root>/lidar/<segment>.parquet``."""
    folder, name = posixpath.split(lidar_path.replace("\\", "/"))
    return posixpath.join(posixpath.dirname(folder), "lidar_calibration", name)


def beam_inclinations(calib_row: Mapping[str, Any], height: int) -> NDArray[np.float64]:
    """Inclination (rad) of each range-image row, row 0 the top beam: (height,) float64.

    Args:
        calib_row: one calibration row keyed by column name (``CAL_INC_VALUES``, ``CAL_INC_MIN``,
            ``CAL_INC_MAX``); ``values`` (ascending, bottom beam first) when present and non-empty,
            else ``height`` beams spread uniformly between min and max (pixel centres).
        height: H of the range image.

    Raises:
        RejectError: ``bad_table`` when the values do not match ``height`` or are not finite.
    """
    values = calib_row.get(CAL_INC_VALUES)
    if values is not None and len(values) > 0:
        if len(values) != height:
            raise RejectError(
                "bad_table", f"{len(values)} beam inclinations for a range image of {height} rows"
            )
        inc = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    else:
        lo, hi = calib_row.get(CAL_INC_MIN), calib_row.get(CAL_INC_MAX)
        if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
            raise RejectError("bad_table", "calibration has neither beam_inclination values nor min/max")
        inc = lo + (np.arange(height, dtype=np.float64) + 0.5) / height * (hi - lo)
    if not np.isfinite(inc).all():
        raise RejectError("bad_table", "beam inclinations are not finite")
    return np.ascontiguousarray(inc[::-1])


def range_image_points(
    range_image: NDArray[np.float32],
    extrinsic: NDArray[np.float64],
    inclinations: NDArray[np.float64],
) -> NDArray[np.float32]:
    """The valid pixels (range > 0) of one range image as points, in row-major pixel order.

    Args:
        range_image: (H, W, C >= 3) range (m), intensity, elongation[, ...].
        extrinsic: (4, 4) sensor -> vehicle.
        inclinations: (H,) rad, row 0 the top beam (``beam_inclinations``).

    Returns:
        (N, 5) float32: x, y, z (vehicle frame, m), intensity, elongation.
    """
    height, width = range_image.shape[:2]
    e = np.asarray(extrinsic, dtype=np.float64)
    rows, cols = np.nonzero(range_image[..., 0] > 0)
    r = range_image[rows, cols, 0].astype(np.float64)
    # trig per column and per row (W + H values), then gathered per point
    az = ((width - np.arange(width) - 0.5) / width * 2.0 - 1.0) * math.pi - math.atan2(e[1, 0], e[0, 0])
    inc = np.asarray(inclinations, dtype=np.float64)
    r_cos_inc = r * np.cos(inc)[rows]
    sensor = np.stack(
        [r_cos_inc * np.cos(az)[cols], r_cos_inc * np.sin(az)[cols], r * np.sin(inc)[rows]], axis=1
    )
    out = np.empty((len(r), 5), dtype=np.float32)
    out[:, :3] = sensor @ e[:3, :3].T + e[:3, 3]
    out[:, 3:] = range_image[rows, cols, 1:3]
    return out


def _frame_groups(file: pq.ParquetFile, frame: int) -> list[int]:
    """Row groups whose ``KEY_FRAME`` statistics can hold ``frame`` (all of them without statistics)."""
    meta = file.metadata
    groups = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        stats = None
        for c in range(rg.num_columns):
            if rg.column(c).path_in_schema == KEY_FRAME:
                stats = rg.column(c).statistics
                break
        if (
            stats is not None
            and stats.has_min_max
            and isinstance(stats.min, int)
            and isinstance(stats.max, int)
        ):
            if not stats.min <= frame <= stats.max:
                continue
        if rg.num_rows > 0:
            groups.append(g)
    return groups


def _shape(value: object, what: str) -> tuple[int, int, int]:
    """A range image's ``shape`` as (H, W, C), checked: 3 ints >= 0, C == 4."""
    if not isinstance(value, list) or len(value) != 3 or not all(type(v) is int for v in value):
        raise RejectError("bad_header", f"{what}: shape {str(value)[:80]} is not 3 integers")
    h, w, c = value
    if h < 0 or w < 0 or c != _CHANNELS:
        raise RejectError("bad_header", f"{what}: shape {value} is not (H >= 0, W >= 0, {_CHANNELS})")
    return h, w, c


def read_parquet(open_read: OpenRead, path: str, what: str, read: Callable[[pq.ParquetFile], _T]) -> _T:
    """``read(file)`` of the Parquet file at ``path`` (``what`` it is, for messages), every failure a
    reject: ``missing_file`` (not there), ``unreadable`` (I/O), ``bad_header`` (not Parquet, columns or
    values ``read`` refuses with a ValueError/TypeError/IndexError); a ``RejectError`` passes through."""
    try:
        with open_read(path) as f:
            return read(parquet_file(f))
    except FileNotFoundError:
        raise RejectError("missing_file", f"no {what} {path}") from None
    except RejectError:
        raise
    except OSError as err:
        raise RejectError("unreadable", f"{path}: {type(err).__name__}: {str(err)[:200]}") from None
    except (pa.ArrowException, ValueError, TypeError, IndexError, OverflowError) as err:
        raise RejectError("bad_header", f"{path}: {type(err).__name__}: {str(err)[:200]}") from None


def _columns(file: pq.ParquetFile, path: str, cols: list[str]) -> None:
    """``file`` has every one of ``cols`` (else ``bad_header`` naming those it lacks)."""
    missing = [c for c in cols if c not in file.schema_arrow.names]
    if missing:
        raise RejectError("bad_header", f"{path} lacks columns {missing}")


def _calibration(open_read: OpenRead, path: str) -> dict[int, dict[str, Any]]:
    """``{laser_name: calibration row}`` of one segment, extrinsic checked (16 finite floats)."""
    cols = [KEY_LASER, CAL_EXTRINSIC, CAL_INC_MIN, CAL_INC_MAX, CAL_INC_VALUES]

    def read(file: pq.ParquetFile) -> list[dict[str, Any]]:
        if file.metadata.num_rows > _MAX_CALIBRATION_ROWS:
            raise RejectError("bad_table", f"{path}: {file.metadata.num_rows} calibration rows")
        _columns(file, path, cols)
        return file.read(columns=cols, use_threads=False).to_pylist()

    rows = read_parquet(open_read, path, "calibration", read)
    out: dict[int, dict[str, Any]] = {}
    for row in rows:
        laser, ext = row[KEY_LASER], row[CAL_EXTRINSIC]
        if laser is None or laser in out:
            raise RejectError(
                "bad_table",
                f"{path}: laser {laser} calibrated {'without a name' if laser is None else 'twice'}",
            )
        ok = isinstance(ext, list) and len(ext) == 16 and all(isinstance(v, float) for v in ext)
        if not ok or not np.isfinite(np.asarray(ext, dtype=np.float64)).all():
            raise RejectError("bad_table", f"{path}: laser {laser} extrinsic is not 16 finite numbers")
        out[laser] = row
    return out


def _frame_rows(table: pa.Table, frame: int) -> NDArray[np.int64]:
    """Positions of the rows of ``frame`` in ``table``, in laser_name order."""
    frames = table.column(KEY_FRAME).to_numpy()
    index = np.flatnonzero(frames == frame)
    lasers = table.column(KEY_LASER).to_numpy()[index]
    return index[np.argsort(lasers, kind="stable")]


def _is_list_of(t: pa.DataType, item: Callable[[pa.DataType], bool]) -> bool:
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    return any(f(t) for f in lists) and item(t.value_type)


def _check_schema(schema: pa.Schema, path: str) -> None:
    """The lidar columns read are present with the types SCHEMA.txt declares (any int/float width)."""
    wanted: dict[str, Callable[[pa.DataType], bool]] = {
        KEY_FRAME: pa.types.is_integer,
        KEY_LASER: pa.types.is_integer,
    }
    for values, shape in RETURNS:
        wanted[values] = lambda t: _is_list_of(t, pa.types.is_floating)
        wanted[shape] = lambda t: _is_list_of(t, pa.types.is_integer)
    missing = [c for c in wanted if c not in schema.names]
    if missing:
        raise RejectError("bad_header", f"{path} lacks columns {missing}")
    bad = [f"{c}: {schema.field(c).type}" for c, ok in wanted.items() if not ok(schema.field(c).type)]
    if bad:
        raise RejectError("bad_header", f"{path} has mistyped columns {bad}")


def _read_images(
    file: pq.ParquetFile, path: str, frame: int, max_points: int
) -> list[tuple[int, list[NDArray[np.float32]]]]:
    """``[(laser_name, [return1 (H, W, 4), return2])]`` of ``frame`` in laser_name order, shapes checked
    and the claimed pixels bounded before any values column is read."""
    _check_schema(file.schema_arrow, path)
    groups = _frame_groups(file, frame)
    if not groups:
        raise RejectError("missing_file", f"frame {frame} not in {path}")
    head_cols = [KEY_FRAME, KEY_LASER, *(shape for _, shape in RETURNS)]
    head = file.read_row_groups(groups, columns=head_cols, use_threads=False)
    head = head.take(pa.array(_frame_rows(head, frame), pa.int64()))
    if head.num_rows == 0:
        raise RejectError("missing_file", f"frame {frame} not in {path}")
    lasers = head.column(KEY_LASER).to_pylist()
    if None in lasers or len(set(lasers)) != len(lasers):
        raise RejectError("bad_table", f"{path} frame {frame}: laser names {lasers} are not unique")
    per_return = [head.column(shape).to_pylist() for _, shape in RETURNS]
    shapes = [
        [_shape(per_return[k][i], f"laser {laser} return {k + 1}") for k in range(len(RETURNS))]
        for i, laser in enumerate(lasers)
    ]
    pixels = sum(h * w for row in shapes for h, w, _ in row)
    if pixels > PIXELS_PER_POINT * max_points:
        raise RejectError(
            "too_large",
            f"{path} frame {frame}: {pixels} range-image pixels (limit {PIXELS_PER_POINT} x {max_points})",
        )
    value_cols = [KEY_FRAME, KEY_LASER, *(values for values, _ in RETURNS)]
    body = file.read_row_groups(groups, columns=value_cols, use_threads=False)
    index = _frame_rows(body, frame)  # positions, no copy of the values
    if body.column(KEY_LASER).take(pa.array(index, pa.int64())).to_pylist() != lasers:
        raise RejectError("bad_header", f"{path} frame {frame}: rows changed between reads")
    out = []
    for i, laser in enumerate(lasers):
        images = []
        for k, (values_col, _) in enumerate(RETURNS):
            h, w, c = shapes[i][k]
            cell = body.column(values_col)[int(index[i])]
            if not cell.is_valid:
                raise RejectError(
                    "bad_header", f"{path} frame {frame} laser {laser} return {k + 1}: no values"
                )
            values = cell.values
            if len(values) != h * w * c:
                raise RejectError(
                    "bad_header",
                    f"{path} frame {frame} laser {laser} return {k + 1}: shape {[h, w, c]} but {len(values)} values",
                )
            arr = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            images.append(arr.reshape(h, w, c))
        out.append((laser, images))
    return out


def read_frame(open_read: OpenRead, lidar_path: str, frame: int, max_points: int) -> NDArray[np.float32]:
    """All valid pixels (range > 0) of both returns of all lasers of one frame, as points.

    Reads only the row groups of ``lidar_path`` whose ``key.frame_timestamp_micros`` statistics can hold
    ``frame`` (first their key and shape columns, then their values columns), and the segment's
    calibration file.

    Args:
        open_read: path -> seekable binary stream (``storage.open_read``).
        lidar_path: ``<root>/lidar/<segment>.parquet``.
        frame: ``key.frame_timestamp_micros`` of the frame.
        max_points: at most this many points (and ``PIXELS_PER_POINT`` x this many pixels claimed).

    Returns:
        (N, 5) float32: x, y, z (vehicle frame, m), intensity, elongation; lasers in laser_name order,
        each return 1 then return 2, pixels row-major.

    Raises:
        RejectError: ``missing_file`` (no such frame, no calibration), ``bad_header`` (columns, shapes,
            values inconsistent, not Parquet), ``bad_table`` (calibration), ``too_large``, ``unreadable``.
    """
    images = read_parquet(
        open_read,
        lidar_path,
        "lidar file",
        lambda file: _read_images(file, lidar_path, int(frame), max_points),
    )
    valid = sum(int(np.count_nonzero(img[..., 0] > 0)) for _, imgs in images for img in imgs)
    if valid > max_points:
        raise RejectError("too_large", f"{lidar_path} frame {frame}: {valid} points (limit {max_points})")
    calib = _calibration(open_read, calibration_path(lidar_path))
    parts: list[NDArray[np.float32]] = []
    for laser, imgs in images:
        row = calib.get(laser)
        if row is None:
            raise RejectError("bad_table", f"{lidar_path}: laser {laser} has no calibration")
        extrinsic = np.asarray(row[CAL_EXTRINSIC], dtype=np.float64).reshape(4, 4)
        for img in imgs:
            if img.shape[0] * img.shape[1]:
                parts.append(range_image_points(img, extrinsic, beam_inclinations(row, img.shape[0])))
    return np.concatenate(parts) if parts else np.empty((0, 5), dtype=np.float32)
