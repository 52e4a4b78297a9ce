"""Synthetic Waymo Open v2 segments (pure numpy/pyarrow): the writer of ``synth --layout waymo_v2``.

One segment per unit, component files as in Waymo Open v2 (paths relative to the output root)::

    lidar/<segment>.parquet               one row per (frame, laser); ONE ROW GROUP PER FRAME
    lidar_calibration/<segment>.parquet   one row per laser: extrinsic, beam inclinations
    vehicle_pose/<segment>.parquet        one row per frame: world_from_vehicle

Columns and types are those the v2 code declares (``realdata/waymo_v2/SCHEMA.txt``); ``lidar_pose``
(per-pixel poses of the top lidar) is not written. Frames at 10 Hz; five lasers
(``key.laser_name`` TOP 1, FRONT 2, SIDE_LEFT 3, SIDE_RIGHT 4, REAR 5). TOP: 64 x 2650 range image,
75 m, inclinations -17.6..+2.4 deg stored as ``beam_inclination.values`` (ascending); the others:
200 x 600, 20 m, -90..+30 deg as min/max only (``values`` null), seeing the half turn away from
the car body and firing one pixel in 12. A range image is (H, W, 4) float32 flattened row-major:
range (m, 0 = no return), intensity, elongation, no-label-zone (-1 = outside any zone, 0 where no
return). Pixel (i, j) is the ray of inclination ``inc[i]`` (row 0 = the top beam) at sensor
azimuth ``((W - j - 0.5) / W * 2 - 1) * pi - atan2(E[1,0], E[0,0])``, so Waymo's conversion gives
back the cast points exactly (points are in the sensor frame at their firing time; no
rolling-shutter correction). Return 2 holds returns behind foliage (sparse). ~170k points a frame
over both returns of all lasers.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from lidarshard.transforms.synth import beams
from lidarshard.transforms.synth import scene as sc

__all__ = ["NAME", "LASERS", "LIDAR_SCHEMA", "CALIBRATION_SCHEMA", "VEHICLE_POSE_SCHEMA", "segment_name"]
__all__ += ["Laser", "laser_setup", "unit_scans", "unit_files", "static_files"]

NAME = "waymo_v2"
_SALT = 4
_EPOCH_US = 1_550_000_000_000_000  # 2019, the Waymo Open era
_SEGMENT_GAP_US = 3_600_000_000
_PERIOD_US = 100_000
_SR_EVERY = 12  # a short-range lidar fires one pixel in 12 (a diagonal pattern)

_KEY = [("key.segment_context_name", pa.string()), ("key.frame_timestamp_micros", pa.int64())]
_LASER_KEY = ("key.laser_name", pa.int8())
_RI = "[LiDARComponent].range_image_return"
LIDAR_SCHEMA = pa.schema(
    [*_KEY, _LASER_KEY]
    + [
        field
        for r in (1, 2)
        for field in (
            (f"{_RI}{r}.values", pa.list_(pa.float32())),
            (f"{_RI}{r}.shape", pa.list_(pa.int32(), 3)),
        )
    ]
)
_CAL = "[LiDARCalibrationComponent]"
CALIBRATION_SCHEMA = pa.schema(
    [
        _KEY[0],
        _LASER_KEY,
        (f"{_CAL}.extrinsic.transform", pa.list_(pa.float64(), 16)),
        (f"{_CAL}.beam_inclination.min", pa.float64()),
        (f"{_CAL}.beam_inclination.max", pa.float64()),
        (f"{_CAL}.beam_inclination.values", pa.list_(pa.float64())),
    ]
)
VEHICLE_POSE_SCHEMA = pa.schema(
    [*_KEY, ("[VehiclePoseComponent].world_from_vehicle.transform", pa.list_(pa.float64(), 16))]
)

#: laser name -> (id, rows, columns, mount x, y, z (m, vehicle frame), yaw (rad), max range (m)).
LASERS: dict[str, tuple[int, int, int, float, float, float, float, float]] = {
    "TOP": (1, 64, 2650, 1.43, 0.0, 2.184, 0.0, 75.0),
    "FRONT": (2, 200, 600, 4.07, 0.0, 0.69, 0.0, 20.0),
    "SIDE_LEFT": (3, 200, 600, 3.24, 1.03, 0.98, np.pi / 2, 20.0),
    "SIDE_RIGHT": (4, 200, 600, 3.24, -1.03, 0.98, -np.pi / 2, 20.0),
    "REAR": (5, 200, 600, -1.15, 0.0, 0.46, np.pi, 20.0),
}


@dataclass(frozen=True)
class Laser:
    """One laser of a segment: name id, extrinsic (4x4 sensor -> vehicle), inclinations, the caster."""

    laser_id: int
    extrinsic: NDArray[np.float64]
    inc_ascending: NDArray[np.float64]  # rad, bottom beam first
    inc_range: tuple[float, float]  # beam_inclination min, max (rad): FOV edges for uniform beams
    stored_values: bool
    lidar: beams.Lidar


def segment_name(seed: int, index: int) -> str:
    """A Waymo-style segment context name (``<20 digits>_<start>_000_<end>_000``) for unit ``index``."""
    rng = np.random.default_rng([seed, index, _SALT, 7])
    digits = f"{int(rng.integers(10**9, 10**10))}{int(rng.integers(0, 10**10)):010d}"
    start = int(rng.integers(0, 800)) * 10
    return f"{digits}_{start}_000_{start + 20}_000"


def laser_setup(rng: np.random.Generator) -> list[Laser]:
    """The five lasers of a segment; the top lidar's yaw and inclinations vary a little per segment."""
    out = []
    for name, (lid, rows, cols, x, y, z, yaw, max_range) in LASERS.items():
        if name == "TOP":
            yaw = float(rng.uniform(-np.pi, np.pi))  # a calibrated yaw far from 0 exercises the azimuth term
            u = np.linspace(0.0, 1.0, rows)
            inc = np.radians(2.4 - 20.0 * u**1.35)[::-1] + rng.normal(0, 1e-4, rows)
            inc = np.sort(inc)
            bounds = (float(inc[0]), float(inc[-1]))
        else:
            lo, hi = np.radians(-90.0), np.radians(30.0)
            inc = lo + (np.arange(rows, dtype=np.float64) + 0.5) / rows * (hi - lo)  # Waymo's pixel centres
            bounds = (float(lo), float(hi))
        c, s = np.cos(yaw), np.sin(yaw)
        ext = np.array([[c, -s, 0, x], [s, c, 0, y], [0, 0, 1, z], [0, 0, 0, 1]], dtype=np.float64)
        yaw_e = float(np.arctan2(ext[1, 0], ext[0, 0]))
        lidar = beams.Lidar(
            elevations_deg=tuple(float(v) for v in np.degrees(inc[::-1])), columns=cols, height_m=z,
            forward_m=x, left_m=y, yaw=yaw_e, phase=np.pi - np.pi / cols - yaw_e, start=-0.5,
            min_range_m=0.5, max_range_m=max_range, half_fov_deg=180.0 if name == "TOP" else 90.0,
            deskew=False, dual=True,
        )  # fmt: skip
        out.append(Laser(lid, ext, inc, bounds, name == "TOP", lidar))
    return out


def _image(
    ret: beams.Returns, rows: int, cols: int, fire: NDArray[np.bool_], rng: np.random.Generator
) -> NDArray[np.float32]:
    """(rows, cols, 4) float32 range image of one return (pixels not fired or missed are all 0)."""
    img = np.zeros((rows, cols, 4), dtype=np.float32)
    hit = (ret.range.reshape(rows, cols) > 0) & fire
    img[..., 0] = np.where(hit, ret.range.reshape(rows, cols), 0.0)
    img[..., 1] = np.where(hit, ret.intensity.reshape(rows, cols) / 100.0, 0.0)
    img[..., 2] = np.where(hit, np.abs(rng.normal(0.0, 0.05, (rows, cols))), 0.0)
    img[..., 3] = np.where(hit, -1.0, 0.0)
    return img


def _fired(laser: Laser) -> NDArray[np.bool_]:
    """(H, W) pixels the laser fires: all for the top lidar, one in ``_SR_EVERY`` for the others."""
    h, w = len(laser.lidar.elevations_deg), laser.lidar.columns
    if laser.laser_id == 1:
        return np.ones((h, w), dtype=bool)
    i, j = np.indices((h, w))
    return np.asarray((i + 5 * j) % _SR_EVERY == 0)


def _frame_table(
    segment: str, stamp: int, lasers: list[Laser], scans: list[beams.Scan], rng: np.random.Generator
) -> pa.Table:
    rows: dict[str, list] = {name: [] for name in LIDAR_SCHEMA.names}
    for laser, scan in zip(lasers, scans, strict=True):
        h, w = len(laser.lidar.elevations_deg), laser.lidar.columns
        fire = _fired(laser)
        rows["key.segment_context_name"].append(segment)
        rows["key.frame_timestamp_micros"].append(stamp)
        rows["key.laser_name"].append(laser.laser_id)
        for r, ret in ((1, scan.first), (2, scan.second)):
            img = _image(ret, h, w, fire, rng)
            rows[f"{_RI}{r}.values"].append(pa.array(img.ravel()))
            rows[f"{_RI}{r}.shape"].append([h, w, 4])
    cols = []
    for field in LIDAR_SCHEMA:
        values = rows[field.name]
        if field.name.endswith(".values"):
            offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
            cols.append(pa.ListArray.from_arrays(pa.array(offsets), pa.concat_arrays(values)))
        else:
            cols.append(pa.array(values, field.type))
    return pa.Table.from_arrays(cols, schema=LIDAR_SCHEMA)


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, use_compliant_nested_type=False)  # list children named 'item', as Waymo's
    return buf.getvalue()


def _unit(seed: int, index: int, frames: int) -> tuple:
    """(rng, spec, boxes, segment, lasers, frame timestamps in us) of segment ``index``."""
    rng, spec, boxes = beams.street(seed, index, frames, _SALT)
    lasers = laser_setup(rng)
    start = _EPOCH_US + index * _SEGMENT_GAP_US + int(rng.integers(0, 10**6))
    jitter = rng.integers(-30, 31, frames)
    jitter[0] = 0
    stamps = start + np.arange(frames, dtype=np.int64) * _PERIOD_US + jitter
    return rng, spec, boxes, segment_name(seed, index), lasers, stamps


def _scans(seed: int, index: int, unit: tuple, frame: int) -> list[beams.Scan]:
    _, spec, boxes, _, lasers, stamps = unit
    t = (int(stamps[frame]) - int(stamps[0])) / 1e6
    rng = np.random.default_rng([seed, index, _SALT, 1, frame])
    return [beams.scan(spec, boxes, t, rng, laser.lidar) for laser in lasers]


def unit_scans(seed: int, index: int, frames: int, frame: int) -> list[tuple[Laser, beams.Scan]]:
    """The cast behind frame ``frame`` of segment ``index``, laser by laser (what ``unit_files`` writes;
    only the pixels of ``_fired`` are written for the short-range lasers)."""
    unit = _unit(seed, index, frames)
    return list(zip(unit[4], _scans(seed, index, unit, frame), strict=True))


def unit_files(seed: int, index: int, frames: int) -> Iterator[tuple[str, bytes]]:
    """The lidar, lidar_calibration and vehicle_pose files of segment ``index``.

    Deterministic from ``(seed, index, frames)``; frame ``f`` casts from ``default_rng([seed, index, 4, 1, f])``.
    """
    unit = _unit(seed, index, frames)
    rng, spec, _, segment, lasers, stamps = unit
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, LIDAR_SCHEMA, use_compliant_nested_type=False) as writer:
        for f, stamp in enumerate(stamps):
            scans = _scans(seed, index, unit, f)
            image_rng = np.random.default_rng([seed, index, _SALT, 2, f])
            table = _frame_table(segment, int(stamp), lasers, scans, image_rng)
            writer.write_table(table, row_group_size=len(lasers))
    yield f"lidar/{segment}.parquet", buf.getvalue()
    cal = {
        "key.segment_context_name": [segment] * len(lasers),
        "key.laser_name": [la.laser_id for la in lasers],
        f"{_CAL}.extrinsic.transform": [la.extrinsic.ravel().tolist() for la in lasers],
        f"{_CAL}.beam_inclination.min": [la.inc_range[0] for la in lasers],
        f"{_CAL}.beam_inclination.max": [la.inc_range[1] for la in lasers],
        f"{_CAL}.beam_inclination.values": [
            la.inc_ascending.tolist() if la.stored_values else None for la in lasers
        ],
    }
    yield f"lidar_calibration/{segment}.parquet", _parquet(pa.table(cal, schema=CALIBRATION_SCHEMA))
    theta = rng.uniform(-np.pi, np.pi)
    origin = np.array([rng.uniform(-20000, 20000), rng.uniform(-20000, 20000), rng.uniform(-700, 300)])
    x, y, yaw = sc.ego_pose(spec, (stamps - stamps[0]) / 1e6)
    c, s = np.cos(theta), np.sin(theta)
    poses = []
    for xi, yi, yawi in zip(x, y, yaw, strict=True):
        cy, sy = np.cos(theta + yawi), np.sin(theta + yawi)
        tx, ty = origin[0] + c * xi - s * yi, origin[1] + s * xi + c * yi
        poses.append([cy, -sy, 0.0, tx, sy, cy, 0.0, ty, 0.0, 0.0, 1.0, origin[2], 0.0, 0.0, 0.0, 1.0])
    pose = {
        "key.segment_context_name": [segment] * frames,
        "key.frame_timestamp_micros": stamps.tolist(),
        "[VehiclePoseComponent].world_from_vehicle.transform": [[float(v) for v in p] for p in poses],
    }
    yield f"vehicle_pose/{segment}.parquet", _parquet(pa.table(pose, schema=VEHICLE_POSE_SCHEMA))


def static_files(seed: int) -> Iterator[tuple[str, bytes]]:
    """Waymo v2 has no files shared between segments."""
    return iter(())
