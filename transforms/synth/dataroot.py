"""A nuScenes-style synthetic dataroot, one scene at a time (pure numpy, no Beam).

``scene_files`` yields every file of one scene (keyframes under ``samples/LIDAR_TOP``, sweeps under
``sweeps/LIDAR_TOP``, lidarseg labels) and ``scene_tables`` its table records; both depend only on
``(config, scene index)``, so scenes can be generated in any order on any worker with identical
bytes. Scene ``i`` draws everything from ``np.random.default_rng([seed, i])`` (frames from
``[seed, i, 1, frame]``). Kinds cycle urban/suburban/open (5:3:2) and every 4th scene (0, 4, ...)
is stopped; moving scenes drive at 1-8 m/s.

Every lidar file is one 20 Hz turn of ``LIDAR_TOP``, the nuScenes Velodyne HDL-32E described as a
``beams.Lidar`` and cast by ``beams.scan`` like every other synthetic sensor: 32 rings from -30.67
to +10.67 deg, 1,084 columns, sensor frame x right, y forward, z up (yaw -90 deg on the ego), rows
in firing order (column by column, ring 0..31), 34,688 points. Each column fires from the sensor
pose at its own time and points are motion-compensated to the sweep timestamp, so the no-return
placeholders lie on a short line behind a moving sensor as in real nuScenes files. Roof hits
(rings 0-7 mostly) and placeholders stay within 1 m of the sensor and are labelled ``vehicle.ego``.

``multisweep`` and ``count_voxels`` measure the result the way training code sees it (the
devkit's ``LidarPointCloud.from_file_multisweep``, then occupied voxels); ``sample_sizes`` applies
them per sample. The measured size table is in ``pipelines/synth.py`` (``lidarshard synth --help``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.declare import Switch, option
from lidarshard.transforms.features.size import count_occupied_voxels
from lidarshard.transforms.layouts.geometry import pose_record, sweep_transform
from lidarshard.transforms.layouts.multisweep import aggregate
from lidarshard.transforms.synth import beams
from lidarshard.transforms.synth import nuscenes_tables as tb
from lidarshard.transforms.synth import scene as sc
from lidarshard.transforms.value_checks import int_in

__all__ = [
    "LIDAR_TRANSLATION",
    "LIDAR_ROTATION",
    "LIDAR_TOP",
    "POINTS_PER_SWEEP",
    "sweep",
    "SynthConfig",
    "Scene",
    "build_scene",
    "scene_files",
    "scene_tables",
    "static_tables",
    "multisweep",
    "count_voxels",
    "sample_sizes",
]

_KIND_CYCLE = (
    "urban",
    "suburban",
    "open",
    "urban",
    "suburban",
    "urban",
    "open",
    "urban",
    "suburban",
    "urban",
)
_EPOCH_US = 1_533_000_000_000_000  # 2018-07-31 UTC, the nuScenes era
_SCENE_GAP_US = 3_600_000_000  # scenes start an hour apart, so log names are unique
_JITTER_US = 200  # lidar timestamps wander +-200 us around the 50 ms grid
#: lidar-to-ego extrinsics (nuScenes LIDAR_TOP, tilt dropped): metres; quaternion w, x, y, z (yaw -90 deg).
LIDAR_TRANSLATION = (0.944, 0.0, 1.84)
LIDAR_ROTATION = (float(np.sqrt(0.5)), 0.0, 0.0, -float(np.sqrt(0.5)))
#: The LIDAR_TOP HDL-32E: ring r at ``elevations_deg[r]``, range +-1.5 cm, returns to 105 m; the
#: roof 0.28 m below it spans x -0.6..0.6 m, y -0.5..0.3 m of the sensor frame.
LIDAR_TOP = beams.Lidar(
    elevations_deg=tuple(float(v) for v in np.linspace(-30.67, 10.67, 32)), columns=1084,
    height_m=LIDAR_TRANSLATION[2], forward_m=LIDAR_TRANSLATION[0], left_m=LIDAR_TRANSLATION[1],
    yaw=-np.pi / 2, period_s=sc.SWEEP_PERIOD_S, max_range_m=105.0,
    roof=(0.28, -0.60, 0.60, -0.50, 0.30), placeholders=True,
)  # fmt: skip
POINTS_PER_SWEEP = len(LIDAR_TOP.elevations_deg) * LIDAR_TOP.columns  # 34,688


@dataclass(frozen=True)
class SynthConfig:
    """Dataset shape (``lidarshard synth``'s options). ``frames_per_scene = (keyframes - 1) * (sweeps + 1) + 1``
    (ends on a keyframe)."""

    scenes: int = option("number of scenes", 4, check=int_in(1, 100_000), metavar="N")
    keyframes_per_scene: int = option(
        "keyframes (samples) per scene", 10, check=int_in(1, 10_000), metavar="N"
    )
    sweeps_per_keyframe: int = option("sweeps between two keyframes", 9, check=int_in(0, 100), metavar="N")
    seed: int = option("dataset seed", 0, check=int_in(0, 2**63 - 1), metavar="S")
    version: str = option("table folder name, v1.0-<name>", "v1.0-synth", flag="--nuscenes-version",
                          metavar="V1.0-XXX")  # fmt: skip
    labels: bool = option("also write lidarseg labels", False,
                          switches=(Switch("--labels", True, "also write lidarseg labels", "off"),))  # fmt: skip

    def __post_init__(self) -> None:
        if self.seed < 0 or self.scenes < 1 or self.keyframes_per_scene < 1 or self.sweeps_per_keyframe < 0:
            raise ValueError(f"need seed >= 0, scenes >= 1, keyframes >= 1, sweeps >= 0: {self}")
        if not self.version or "/" in self.version or self.version in (".", ".."):
            raise ValueError(
                f"--nuscenes-version {self.version!r}: the table folder must be a plain folder name"
            )

    @property
    def frames_per_scene(self) -> int:
        return (self.keyframes_per_scene - 1) * (self.sweeps_per_keyframe + 1) + 1


@dataclass(frozen=True)
class Scene:
    """A scene's spec, layout (road frame) and timeline (tables), all drawn from its own generator."""

    spec: sc.SceneSpec
    boxes: sc.Boxes
    info: tb.SceneInfo

    @cached_property
    def times(self) -> NDArray[np.float64]:
        """(F,) seconds since the first frame."""
        t = np.asarray(self.info.timestamps, dtype=np.int64)
        return (t - t[0]) / 1e6


def _quat_yaw(yaw: NDArray[np.float64]) -> NDArray[np.float64]:
    """(F, 4) quaternions w, x, y, z of rotations by ``yaw`` (rad) about z."""
    return np.stack([np.cos(yaw / 2), np.zeros_like(yaw), np.zeros_like(yaw), np.sin(yaw / 2)], axis=1)


def build_scene(cfg: SynthConfig, index: int) -> Scene:
    """Scene ``index``: kind from a fixed urban/suburban/open cycle, stopped if ``index % 4 == 0``,
    else 1-8 m/s; layout, timestamps and world placement from ``default_rng([seed, index])``."""
    rng = np.random.default_rng([cfg.seed, index])
    kind = _KIND_CYCLE[index % len(_KIND_CYCLE)]
    speed = 0.0 if index % 4 == 0 else float(np.round(rng.uniform(1.0, 8.0), 2))
    spec = sc.SceneSpec(cfg.seed, index, kind, speed, cfg.frames_per_scene)
    boxes = sc.scene_layout(spec, rng)
    n = cfg.frames_per_scene
    jitter = rng.integers(-_JITTER_US, _JITTER_US + 1, n)
    jitter[0] = 0
    start = _EPOCH_US + index * _SCENE_GAP_US + int(rng.integers(0, 1_000_000))
    stamps = start + np.arange(n, dtype=np.int64) * int(sc.SWEEP_PERIOD_S * 1e6) + jitter
    theta, offset = rng.uniform(-np.pi, np.pi), rng.uniform(300.0, 2000.0, 2)
    x, y, yaw = sc.ego_pose(spec, (stamps - start) / 1e6)
    c, s = np.cos(theta), np.sin(theta)
    trans = np.stack([offset[0] + c * x - s * y, offset[1] + s * x + c * y, np.zeros(n)], axis=1)
    info = tb.SceneInfo(
        seed=cfg.seed, index=index, kind=kind, speed=speed,
        timestamps=tuple(int(v) for v in stamps),
        translations=tuple((float(a), float(b), float(c)) for a, b, c in trans),
        rotations=tuple((float(w), float(i), float(j), float(k)) for w, i, j, k in _quat_yaw(theta + yaw)),
        keyframe_every=cfg.sweeps_per_keyframe + 1,
        lidar_translation=LIDAR_TRANSLATION, lidar_rotation=LIDAR_ROTATION,
    )  # fmt: skip
    return Scene(spec=spec, boxes=boxes, info=info)


def sweep(
    spec: sc.SceneSpec, boxes: sc.Boxes, t_frame: float, rng: np.random.Generator
) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
    """One ``LIDAR_TOP`` sweep ending at scene time ``t_frame`` (s), drawn from ``rng``.

    Returns:
        (points, labels): (34688, 5) float32 x, y, z (m, sensor frame at ``t_frame``), intensity
        (integer 0..255), ring (0..31), rows in firing order; (34688,) uint8 lidarseg class ids.
    """
    ret = beams.scan(spec, boxes, t_frame, rng, LIDAR_TOP).first
    rings, columns = len(LIDAR_TOP.elevations_deg), LIDAR_TOP.columns
    firing = np.arange(rings * columns).reshape(rings, columns).T.ravel()  # beams' rays are (ring, column)
    points = np.empty((rings * columns, 5), dtype=np.float32)
    points[:, :3] = ret.xyz[firing]
    points[:, 3] = ret.intensity[firing]
    points[:, 4] = np.tile(np.arange(rings, dtype=np.float32), columns)
    return points, ret.label[firing]


def scene_files(cfg: SynthConfig, index: int) -> Iterator[tuple[str, bytes]]:
    """Every file of scene ``index`` as (path relative to the dataroot, bytes), frame by frame.

    Lidar files hold (34688, 5) little-endian float32 rows x, y, z, intensity, ring; with
    ``cfg.labels`` each keyframe is followed by its (34688,) uint8 lidarseg file.
    """
    scene = build_scene(cfg, index)
    info = scene.info
    for frame in range(cfg.frames_per_scene):
        rng = np.random.default_rng([cfg.seed, index, 1, frame])
        points, labels = sweep(scene.spec, scene.boxes, float(scene.times[frame]), rng)
        yield info.filename(frame), points.astype("<f4").tobytes()
        if cfg.labels and info.is_key_frame(frame):
            yield tb.lidarseg_filename(cfg.version, info.sample_data_token(frame)), labels.tobytes()


def scene_tables(cfg: SynthConfig, index: int) -> dict[str, list[tb.Record]]:
    """Table records of scene ``index`` (see ``synth_tables.scene_records``)."""
    return tb.scene_records(build_scene(cfg, index).info, cfg.version, cfg.labels)


def static_tables(cfg: SynthConfig) -> dict[str, list[tb.Record]]:
    """Tables shared by all scenes, plus an empty list for every table no scene fills."""
    tables: dict[str, list[tb.Record]] = {name: [] for name in tb.TABLES}
    tables.update(tb.static_records(cfg.labels))
    if cfg.labels:
        tables["lidarseg"] = []
    return tables


def multisweep(
    clouds: Sequence[NDArray[np.float32]],
    poses: Sequence[tuple[Sequence[float], Sequence[float]]],
    calib: tuple[Sequence[float], Sequence[float]],
) -> NDArray[np.float32]:
    """Aggregate sweeps into the first one's sensor frame, like the devkit's ``from_file_multisweep``:
    the scanner's ``aggregate`` with ``close_points="devkit"`` (every cloud loses its close points).

    Args:
        clouds: (N_i, >=3) point arrays in their own sensor frame, reference (keyframe) first.
        poses: per cloud, the ego pose (translation m, quaternion w, x, y, z).
        calib: LIDAR_TOP calibration (translation, quaternion) in the ego frame.

    Returns:
        (sum N_i', 3) float32 x, y, z in the reference sensor frame, m.
    """
    cs, ref = pose_record(*calib), pose_record(*poses[0])
    tfs = [sweep_transform(cs, ref, cs, pose_record(*pose)) for pose in poses[1:]]
    key = np.asarray(clouds[0], dtype=np.float32)[:, :3]
    sweeps = [np.asarray(c, dtype=np.float32)[:, :3] for c in clouds[1:]]
    return aggregate(key, sweeps, tfs, close_points="devkit")


def count_voxels(xyz: NDArray[np.floating], size: float = 0.05) -> int:
    """Occupied cubic voxels of edge ``size`` (m) of the finite rows of ``xyz`` (N, >=3): the scanner's
    own ``count_occupied_voxels``, so synth's size table and ``lidarshard scan`` count alike."""
    xyz = np.asarray(xyz[:, :3])
    return count_occupied_voxels(xyz[np.isfinite(xyz).all(axis=1)], size)


def sample_sizes(cfg: SynthConfig, index: int, voxel: float = 0.05) -> Iterator[dict[str, str | float]]:
    """Size features of every sample of scene ``index``, measured on the bytes ``scene_files`` yields.

    Yields per keyframe: ``kind``, ``speed`` (m/s), ``keyframe_voxels`` (all points), ``frames``
    aggregated, ``points`` and ``voxels`` of the keyframe + up to ``sweeps_per_keyframe`` previous
    sweeps (remove_close(1 m), ego poses from the tables), and ``near`` (fraction of keyframe points
    within 1 m of the sensor).
    """
    scene = build_scene(cfg, index)
    info, spec = scene.info, scene.spec
    calib = (info.lidar_translation, info.lidar_rotation)
    history: list[tuple[NDArray[np.float32], tuple]] = []
    frame = -1
    for rel, data in scene_files(cfg, index):
        if rel.startswith("lidarseg/"):
            continue
        frame += 1
        cloud = np.frombuffer(data, dtype="<f4").reshape(-1, 5)
        history = [(cloud, (info.translations[frame], info.rotations[frame]))] + history[
            : cfg.sweeps_per_keyframe
        ]
        if not info.is_key_frame(frame):
            continue
        agg = multisweep([c for c, _ in history], [p for _, p in history], calib)
        yield {
            "kind": spec.kind, "speed": spec.speed, "frames": len(history), "points": len(agg),
            "keyframe_voxels": count_voxels(cloud, voxel), "voxels": count_voxels(agg, voxel),
            "near": float(np.mean(np.linalg.norm(cloud[:, :3], axis=1) < 1.0)),
        }  # fmt: skip
