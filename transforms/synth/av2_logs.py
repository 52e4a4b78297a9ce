"""Synthetic Argoverse 2 sensor logs (pure numpy/pyarrow): the writer of ``synth --layout av2``.

One log per unit, files as in the AV2 sensor dataset (paths relative to the output root)::

    train/<log_id>/sensors/lidar/<timestamp_ns>.feather      one sweep, 10 Hz
    train/<log_id>/city_SE3_egovehicle.feather               ego poses (every sweep + 4 between)
    train/<log_id>/calibration/egovehicle_SE3_sensor.feather up_lidar, down_lidar

A sweep stacks two VLP-32C-like lidars spinning at 10 Hz, 1,800 columns each: ``up_lidar``
(laser_number 0-31, upright, 1.64 m) and ``down_lidar`` (32-63, mounted upside down, 1.525 m),
their lasers numbered in the sensor's native order with the elevations measured in a real AV2
sweep. Columns are as in the real files: x, y, z float16 in the EGO frame, motion-compensated to
the file's timestamp (the sweep start); intensity uint8; laser_number uint8; offset_ns int32 (ns
after the timestamp), rows sorted by offset_ns; Feather v2, LZ4. Misses and returns closer than
1.5 m are dropped (AV2 removes ego-body returns), leaving ~100k points a sweep.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather

from lidarshard.transforms.synth import beams
from lidarshard.transforms.synth import scene as sc

__all__ = ["NAME", "VLP32C_ELEVATION_DEG", "LIDARS", "log_id", "unit_files", "static_files"]

NAME = "av2"
_SALT = 2
#: Elevation (deg) of VLP-32C laser 0..31 in firing-channel order (as measured in a real AV2 sweep).
VLP32C_ELEVATION_DEG = (
    7.0, -1.667, 1.667, -0.667, 15.0, -0.333, 3.333, 0.667, 1.333, 0.0, 1.0, 2.333, 0.333, -1.0, 4.667, 10.333,
    -6.148, -15.639, -3.0, -2.0, -4.0, -8.843, -4.667, -3.333, -2.667, -5.333, -1.333, -7.254, -3.667, -11.31,
    -2.333, -25.0,
)  # fmt: skip
_COLUMNS = 1800  # 0.2 deg at 10 Hz
_FIRE_NS = 2304  # lasers fire in pairs, 2.304 us apart
_EPOCH_NS = 315_966_000_000_000_000  # 2020-01-06 GPS era, like AV2
_LOG_GAP_NS = 3_600_000_000_000
_PERIOD_NS = 100_000_000
_JITTER_NS = 200_000
_POSES_PER_SWEEP = 5
#: sensor name -> (mount x, y, z in the ego frame (m), quaternion w, x, y, z of sensor -> ego).
LIDARS = {
    "up_lidar": ((1.35, 0.0, 1.64), (1.0, 0.0, 0.0, 0.0)),
    "down_lidar": ((1.35, 0.0, 1.525), (0.0, 1.0, 0.0, 0.0)),  # upside down: 180 deg about x
}
_LIDAR_SCHEMA = pa.schema(
    [
        ("x", pa.float16()),
        ("y", pa.float16()),
        ("z", pa.float16()),
        ("intensity", pa.uint8()),
        ("laser_number", pa.uint8()),
        ("offset_ns", pa.int32()),
    ]
)
_POSE = [("qw", pa.float64()), ("qx", pa.float64()), ("qy", pa.float64()), ("qz", pa.float64())]
_POSE += [("tx_m", pa.float64()), ("ty_m", pa.float64()), ("tz_m", pa.float64())]
_CITY_SCHEMA = pa.schema([("timestamp_ns", pa.int64()), *_POSE])
_CALIB_SCHEMA = pa.schema([("sensor_name", pa.string()), *_POSE])


def _feather(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    feather.write_feather(table, buf, compression="lz4")
    return buf.getvalue()


def log_id(seed: int, index: int) -> str:
    """A stable UUID-like log id (version-4 layout) for log ``index`` of dataset ``seed``."""
    raw = np.random.default_rng([seed, index, _SALT, 7]).bytes(16)
    return str(uuid.UUID(bytes=raw, version=4))


def _lidar(name: str, phase: float) -> beams.Lidar:
    (x, y, z), _ = LIDARS[name]
    sign = 1.0 if name == "up_lidar" else -1.0  # the flipped lidar's lasers look the other way
    return beams.Lidar(
        elevations_deg=tuple(sign * e for e in VLP32C_ELEVATION_DEG),
        columns=_COLUMNS, height_m=z, forward_m=x, left_m=y, phase=phase,
        start=0.0, min_range_m=1.5, max_range_m=200.0,
    )  # fmt: skip


def _sweep(spec: sc.SceneSpec, boxes: sc.Boxes, t: float, rng: np.random.Generator) -> bytes:
    """One sweep's Feather bytes: both lidars cast at scene time ``t`` (s), ego frame, sorted by offset."""
    parts = []
    for base, name in ((0, "up_lidar"), (32, "down_lidar")):
        lidar = _lidar(name, float(rng.uniform(-np.pi, np.pi)))
        ret = beams.scan(spec, boxes, t, rng, lidar).first
        mount = np.asarray(LIDARS[name][0])
        ring = np.repeat(np.arange(32), _COLUMNS)
        col = np.tile(np.arange(_COLUMNS), 32)
        offset = np.round(col * (_PERIOD_NS / _COLUMNS)).astype(np.int64) + (ring // 2) * _FIRE_NS
        keep = ret.range > 0
        parts.append((ret.xyz[keep] + mount, ret.intensity[keep], ring[keep] + base, offset[keep]))
    xyz, intensity, laser, offset = (np.concatenate(a) for a in zip(*parts, strict=True))
    order = np.argsort(offset, kind="stable")
    table = pa.table(
        [
            pa.array(xyz[order, 0].astype(np.float16)),
            pa.array(xyz[order, 1].astype(np.float16)),
            pa.array(xyz[order, 2].astype(np.float16)),
            pa.array(intensity[order].astype(np.uint8)),
            pa.array(laser[order].astype(np.uint8)),
            pa.array((offset[order] + int(rng.integers(0, 50_000))).astype(np.int32)),
        ],
        schema=_LIDAR_SCHEMA,
    )
    return _feather(table)


def _yaw_quat(yaw: np.ndarray) -> np.ndarray:
    """(N, 4) quaternions w, x, y, z of rotations by ``yaw`` (rad) about z."""
    return np.stack([np.cos(yaw / 2), np.zeros_like(yaw), np.zeros_like(yaw), np.sin(yaw / 2)], axis=1)


def _city_poses(spec: sc.SceneSpec, rng: np.random.Generator, stamps: np.ndarray) -> bytes:
    """city_SE3_egovehicle at every sweep timestamp and ``_POSES_PER_SWEEP - 1`` times between (ns)."""
    jitter = rng.integers(-500_000, 500_001, (len(stamps), _POSES_PER_SWEEP))
    jitter[:, 0] = 0  # exactly at the sweep timestamp
    steps = np.arange(_POSES_PER_SWEEP) * (_PERIOD_NS // _POSES_PER_SWEEP)
    t_ns = (stamps[:, None] + steps + jitter).ravel()
    theta = rng.uniform(-np.pi, np.pi)
    origin = np.array([rng.uniform(-3000, 3000), rng.uniform(-3000, 3000), rng.uniform(10, 80)])
    x, y, yaw = sc.ego_pose(spec, (t_ns - stamps[0]) / 1e9)
    c, s = np.cos(theta), np.sin(theta)
    q = _yaw_quat(theta + yaw)
    cols = [
        pa.array(t_ns.astype(np.int64)),
        *(pa.array(q[:, k]) for k in range(4)),
        pa.array(origin[0] + c * x - s * y),
        pa.array(origin[1] + s * x + c * y),
        pa.array(np.full(t_ns.size, origin[2])),
    ]
    return _feather(pa.table(cols, schema=_CITY_SCHEMA))


def _calibration() -> bytes:
    names = sorted(LIDARS)
    rows = [LIDARS[n] for n in names]
    cols = [pa.array(names, pa.string())]
    cols += [pa.array([float(r[1][k]) for r in rows]) for k in range(4)]
    cols += [pa.array([float(r[0][k]) for r in rows]) for k in range(3)]
    return _feather(pa.table(cols, schema=_CALIB_SCHEMA))


def unit_files(seed: int, index: int, frames: int) -> Iterator[tuple[str, bytes]]:
    """Every file of log ``index``: ``frames`` sweeps, then the city poses and the calibration.

    Deterministic from ``(seed, index, frames)``; sweep ``f`` draws from ``default_rng([seed, index, 2, 1, f])``.
    """
    rng, spec, boxes = beams.street(seed, index, frames, _SALT)
    start = _EPOCH_NS + index * _LOG_GAP_NS + int(rng.integers(0, 10**9))
    jitter = rng.integers(-_JITTER_NS, _JITTER_NS + 1, frames)
    jitter[0] = 0
    stamps = start + np.arange(frames, dtype=np.int64) * _PERIOD_NS + jitter
    log = f"train/{log_id(seed, index)}"
    for f, stamp in enumerate(stamps):
        frame_rng = np.random.default_rng([seed, index, _SALT, 1, f])
        t = (int(stamp) - int(stamps[0])) / 1e9
        yield f"{log}/sensors/lidar/{int(stamp)}.feather", _sweep(spec, boxes, t, frame_rng)
    yield f"{log}/city_SE3_egovehicle.feather", _city_poses(spec, rng, stamps)
    yield f"{log}/calibration/egovehicle_SE3_sensor.feather", _calibration()


def static_files(seed: int) -> Iterator[tuple[str, bytes]]:
    """AV2 has no files shared between logs."""
    return iter(())
