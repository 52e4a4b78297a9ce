"""nuScenes tables for a synthetic dataroot: tokens, names, records, JSON (pure Python, no Beam).

Records follow the nuScenes v1.0 schema (https://www.nuscenes.org/nuscenes#data-format) for the
one sensor generated, LIDAR_TOP. Tokens are 32-hex blake2b digests of the seed, table and position,
so they are stable across processes and runners (never Python ``hash()``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHANNEL",
    "TABLES",
    "SceneInfo",
    "scene_records",
    "LIDARSEG_CATEGORIES",
    "token",
    "log_name",
    "lidar_filename",
    "lidarseg_filename",
    "map_token",
    "static_records",
    "merge_map_records",
    "table_json",
    "blank_png",
]

Record = dict[str, Any]

CHANNEL = "LIDAR_TOP"
#: Every table ``NuScenes(version, dataroot)`` loads; lidarseg.json is added with labels.
TABLES = (
    "attribute",
    "calibrated_sensor",
    "category",
    "ego_pose",
    "instance",
    "log",
    "map",
    "sample",
    "sample_annotation",
    "sample_data",
    "scene",
    "sensor",
    "visibility",
)
#: nuScenes-lidarseg category names in ``index`` order 0..31 (as the devkit's colormap).
LIDARSEG_CATEGORIES = (
    "noise",
    "animal",
    "human.pedestrian.adult",
    "human.pedestrian.child",
    "human.pedestrian.construction_worker",
    "human.pedestrian.personal_mobility",
    "human.pedestrian.police_officer",
    "human.pedestrian.stroller",
    "human.pedestrian.wheelchair",
    "movable_object.barrier",
    "movable_object.debris",
    "movable_object.pushable_pullable",
    "movable_object.trafficcone",
    "static_object.bicycle_rack",
    "vehicle.bicycle",
    "vehicle.bus.bendy",
    "vehicle.bus.rigid",
    "vehicle.car",
    "vehicle.construction",
    "vehicle.emergency.ambulance",
    "vehicle.emergency.police",
    "vehicle.motorcycle",
    "vehicle.trailer",
    "vehicle.truck",
    "flat.driveable_surface",
    "flat.other",
    "flat.sidewalk",
    "flat.terrain",
    "static.manmade",
    "static.other",
    "static.vegetation",
    "vehicle.ego",
)
_ATTRIBUTES = (
    "vehicle.moving",
    "vehicle.stopped",
    "vehicle.parked",
    "cycle.with_rider",
    "cycle.without_rider",
    "pedestrian.sitting_lying_down",
    "pedestrian.standing",
    "pedestrian.moving",
)
_VISIBILITY = (("v0-40", "1"), ("v40-60", "2"), ("v60-80", "3"), ("v80-100", "4"))


def token(*parts: object) -> str:
    """A 32-hex token: blake2b-128 of the parts joined by '/' (deterministic everywhere)."""
    return hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=16).hexdigest()


def _utc(timestamp_us: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(timestamp_us // 1_000_000, tz=dt.timezone.utc)


def log_name(seed: int, start_us: int) -> str:
    """nuScenes-style log name from the scene's first timestamp, e.g. ``s007-2018-08-01-10-00-00+0000``."""
    return f"s{seed % 1000:03d}-{_utc(start_us):%Y-%m-%d-%H-%M-%S}+0000"


def lidar_filename(log: str, timestamp_us: int, key_frame: bool) -> str:
    """Path relative to the dataroot: ``samples/`` for keyframes, ``sweeps/`` otherwise."""
    folder = "samples" if key_frame else "sweeps"
    return f"{folder}/{CHANNEL}/{log}__{CHANNEL}__{timestamp_us}.pcd.bin"


def lidarseg_filename(version: str, sample_data_token: str) -> str:
    """``lidarseg/<version>/<token>_lidarseg.bin`` (one uint8 per keyframe point)."""
    return f"lidarseg/{version}/{sample_data_token}_lidarseg.bin"


def map_token(kind: str) -> str:
    """One map (location) per scene kind."""
    return token("map", kind)


@dataclass(frozen=True)
class SceneInfo:
    """Everything the tables need to know about one generated scene.

    Attributes:
        seed, index: dataset seed and scene index (they key every token).
        kind, speed: scene kind and ego speed (m/s), for the description.
        timestamps: (F,) lidar timestamps, int microseconds, ~50 ms apart.
        translations: (F, 3) ego origin in the world frame, m.
        rotations: (F, 4) ego orientation quaternions w, x, y, z.
        keyframe_every: frames per keyframe (sweeps_per_keyframe + 1); frame 0 is a keyframe.
        lidar_translation, lidar_rotation: LIDAR_TOP extrinsics in the ego frame (m; w, x, y, z).
    """

    seed: int
    index: int
    kind: str
    speed: float
    timestamps: tuple[int, ...]
    translations: tuple[tuple[float, float, float], ...]
    rotations: tuple[tuple[float, float, float, float], ...]
    keyframe_every: int
    lidar_translation: tuple[float, float, float]
    lidar_rotation: tuple[float, float, float, float]

    @property
    def log(self) -> str:
        return log_name(self.seed, self.timestamps[0])

    @property
    def log_token(self) -> str:
        return token(self.seed, "log", self.index)

    @property
    def calibrated_sensor_token(self) -> str:
        return token(self.seed, "calibrated_sensor", self.index)

    @property
    def scene_token(self) -> str:
        return token(self.seed, "scene", self.index)

    def sample_data_token(self, frame: int) -> str:
        return token(self.seed, "sample_data", self.index, frame)

    def sample_token(self, keyframe: int) -> str:
        return token(self.seed, "sample", self.index, keyframe)

    def is_key_frame(self, frame: int) -> bool:
        return frame % self.keyframe_every == 0

    def filename(self, frame: int) -> str:
        return lidar_filename(self.log, self.timestamps[frame], self.is_key_frame(frame))


def _frame_records(info: SceneInfo, frame: int) -> tuple[Record, Record]:
    """(sample_data, ego_pose) of one frame; the ego pose shares the sample_data token."""
    n, sd = len(info.timestamps), info.sample_data_token(frame)
    sample_data = {
        "token": sd,
        "sample_token": info.sample_token(-(-frame // info.keyframe_every)),  # this or the next keyframe
        "ego_pose_token": sd,
        "calibrated_sensor_token": info.calibrated_sensor_token,
        "timestamp": info.timestamps[frame],
        "fileformat": "pcd",
        "is_key_frame": info.is_key_frame(frame),
        "height": 0,
        "width": 0,
        "filename": info.filename(frame),
        "prev": info.sample_data_token(frame - 1) if frame > 0 else "",
        "next": info.sample_data_token(frame + 1) if frame < n - 1 else "",
    }
    pose = {
        "token": sd,
        "timestamp": info.timestamps[frame],
        "rotation": list(info.rotations[frame]),
        "translation": list(info.translations[frame]),
    }
    return sample_data, pose


def _header_records(info: SceneInfo, n_samples: int) -> dict[str, list[Record]]:
    """The scene's log, its share of the location's map, its LIDAR_TOP calibration, the scene."""
    log = {
        "token": info.log_token,
        "logfile": info.log,
        "vehicle": f"s{info.seed % 1000:03d}",
        "date_captured": f"{_utc(info.timestamps[0]):%Y-%m-%d}",
        "location": f"synth-{info.kind}",
    }
    mask = {
        "category": "semantic_prior",
        "token": map_token(info.kind),
        "filename": f"maps/{map_token(info.kind)}.png",
        "log_tokens": [info.log_token],
    }
    calib = {
        "token": info.calibrated_sensor_token,
        "sensor_token": token("sensor", CHANNEL),
        "translation": list(info.lidar_translation),
        "rotation": list(info.lidar_rotation),
        "camera_intrinsic": [],
    }
    scene = {
        "token": info.scene_token,
        "log_token": info.log_token,
        "nbr_samples": n_samples,
        "first_sample_token": info.sample_token(0),
        "last_sample_token": info.sample_token(n_samples - 1),
        "name": f"scene-{info.index:04d}",
        "description": f"synthetic {info.kind}, ego {info.speed:.1f} m/s",
    }
    return {"log": [log], "map": [mask], "calibrated_sensor": [calib], "scene": [scene]}  # fmt: skip


def scene_records(info: SceneInfo, version: str, labels: bool) -> dict[str, list[Record]]:
    """All table records of one scene, each list in frame order: log, map (this scene's share),
    calibrated_sensor, scene, sample, sample_data, ego_pose and, with ``labels``, lidarseg."""
    keys = list(range(0, len(info.timestamps), info.keyframe_every))
    out = _header_records(info, len(keys))
    out["sample"] = [
        {"token": info.sample_token(k), "timestamp": info.timestamps[f],
         "prev": info.sample_token(k - 1) if k > 0 else "",
         "next": info.sample_token(k + 1) if k < len(keys) - 1 else "", "scene_token": info.scene_token}
        for k, f in enumerate(keys)
    ]  # fmt: skip
    frames = [_frame_records(info, f) for f in range(len(info.timestamps))]
    out["sample_data"] = [sd for sd, _ in frames]
    out["ego_pose"] = [pose for _, pose in frames]
    if labels:
        out["lidarseg"] = [
            {"token": sd, "sample_data_token": sd, "filename": lidarseg_filename(version, sd)}
            for sd in map(info.sample_data_token, keys)
        ]
    return out


def static_records(labels: bool) -> dict[str, list[Record]]:
    """Records that do not depend on the scenes: sensor, category, attribute, visibility.

    ``category`` is the 32-class nuScenes-lidarseg table (with ``index``) in both modes, which the
    devkit accepts with or without lidarseg; ``instance``/``sample_annotation`` stay empty.
    """
    desc = "synthetic lidarseg class" if labels else "synthetic class"
    return {
        "sensor": [{"token": token("sensor", CHANNEL), "channel": CHANNEL, "modality": "lidar"}],
        "category": [
            {"token": token("category", name), "name": name, "description": desc, "index": i}
            for i, name in enumerate(LIDARSEG_CATEGORIES)
        ],
        "attribute": [{"token": token("attribute", a), "name": a, "description": a} for a in _ATTRIBUTES],
        "visibility": [
            {"token": t, "level": lvl, "description": f"visibility {lvl}"} for lvl, t in _VISIBILITY
        ],
    }


def merge_map_records(records: Iterable[Record]) -> list[Record]:
    """Merge per-scene map records that share a token into one, ``log_tokens`` in input order."""
    merged: dict[str, Record] = {}
    for rec in records:
        if rec["token"] in merged:
            merged[rec["token"]]["log_tokens"].extend(rec["log_tokens"])
        else:
            merged[rec["token"]] = {**rec, "log_tokens": list(rec["log_tokens"])}
    return list(merged.values())


def table_json(records: Iterable[Record]) -> bytes:
    """A JSON array with one record per line (deterministic bytes, UTF-8)."""
    body = ",\n".join(json.dumps(r, separators=(", ", ": ")) for r in records)
    return (f"[\n{body}\n]\n" if body else "[]\n").encode()


def blank_png(size: int = 16) -> bytes:
    """A ``size`` x ``size`` 8-bit grayscale PNG of zeros (the map mask the devkit opens lazily)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(size) for _ in range(size))
    ihdr = struct.pack(">IIBBBBB", size, size, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
