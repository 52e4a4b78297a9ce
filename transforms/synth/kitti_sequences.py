"""Synthetic SemanticKITTI sequences (pure numpy): the writer of ``synth --layout semantickitti``.

One sequence per unit, files as in SemanticKITTI / KITTI odometry (paths relative to the output root)::

    semantic-kitti.yaml                              label config: labels, learning_map(_inv), learning_ignore
    sequences/NN/velodyne/NNNNNN.bin         float32 x, y, z, remission per point (velodyne frame)
    sequences/NN/labels/NNNNNN.label         uint32 per point: semantic id (low 16 bits) | instance << 16
    sequences/NN/poses.txt                   scan i's pose: 12 floats, 3x4 row-major, camera-0 frame
    sequences/NN/calib.txt                   P0..P3 (3x4 projections) and Tr (velodyne -> camera 0)
    sequences/NN/times.txt                   scan i's time, s

Scans come from a 64-beam HDL-64E-like lidar at 1.73 m spinning at 10 Hz (2,000 columns; upper
block +2 to -8.33 deg in 1/3 deg steps, lower block -8.83 to -24.8 deg), motion-compensated to
the scan time (the forward-looking column), misses dropped: ~105-125k points a scan, rows ring by
ring from the top beam. Raw semantic ids (SemanticKITTI's): car 10 / moving-car 252, person 30 /
moving-person 254, road 40, lane-marking 60, sidewalk 48, building 50, fence 51, vegetation 70,
trunk 71, terrain 72, pole 80; cars and persons carry their box's instance id. ``poses.txt``
follows KITTI: ``pose_i = Tr @ inv(V_0) @ V_i @ inv(Tr)`` with ``V_i`` the velodyne's world pose.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.synth import beams
from lidarshard.transforms.synth import scene as sc

__all__ = ["NAME", "ELEVATION_DEG", "RAW_CLASSES", "LEARNING_MAP", "unit_files", "static_files", "label_yaml"]

NAME = "semantickitti"
_SALT = 3
ELEVATION_DEG = tuple(
    np.round(np.concatenate([np.linspace(2.0, -8.333, 32), np.linspace(-8.833, -24.8, 32)]), 3)
)
_COLUMNS = 2000
_HEIGHT = 1.73
_PERIOD = 0.1
#: raw id -> (name, train id). Train ids follow SemanticKITTI's 19-class convention (0 = ignored).
RAW_CLASSES: dict[int, tuple[str, int]] = {
    0: ("unlabeled", 0),
    10: ("car", 1),
    30: ("person", 6),
    40: ("road", 9),
    48: ("sidewalk", 11),
    50: ("building", 13),
    51: ("fence", 14),
    60: ("lane-marking", 9),
    70: ("vegetation", 15),
    71: ("trunk", 16),
    72: ("terrain", 17),
    80: ("pole", 18),
    252: ("moving-car", 1),
    254: ("moving-person", 6),
}
LEARNING_MAP = {raw: train for raw, (_, train) in RAW_CLASSES.items()}
_TRAIN_NAMES = {0: "unlabeled", 1: "car", 6: "person", 9: "road", 11: "sidewalk", 13: "building", 14: "fence"}
_TRAIN_NAMES.update({15: "vegetation", 16: "trunk", 17: "terrain", 18: "pole"})
#: velodyne -> camera 0: camera x right, y down, z forward; velodyne x forward, y left, z up.
_TR = np.array([[0.0, -1.0, 0.0, -0.004], [0.0, 0.0, -1.0, -0.076], [1.0, 0.0, 0.0, -0.272], [0, 0, 0, 1]])
_FOCAL, _CX, _CY, _BASELINE = 718.0, 607.0, 185.0, 0.54


def label_yaml() -> str:
    """The label config text: ``labels``, ``learning_map``, ``learning_map_inv``, ``learning_ignore``."""
    lines = ["# lidarshard synthetic SemanticKITTI label config (raw ids emitted -> train ids)", "labels:"]
    lines += [f"  {raw}: {name}" for raw, (name, _) in RAW_CLASSES.items()]
    lines += ["learning_map:"] + [f"  {raw}: {train}" for raw, train in LEARNING_MAP.items()]
    inv = {
        train: min(r for r, t in LEARNING_MAP.items() if t == train)
        for train in sorted(set(LEARNING_MAP.values()))
    }
    lines += ["learning_map_inv:"] + [f"  {train}: {raw}" for train, raw in inv.items()]
    lines += ["learning_ignore:"] + [f"  {train}: {'true' if train == 0 else 'false'}" for train in inv]
    lines += ["train_names:"] + [f"  {train}: {_TRAIN_NAMES[train]}" for train in inv]
    return "\n".join(lines) + "\n"


def _raw_ids(
    label: NDArray[np.uint8], box: NDArray[np.int64], boxes: sc.Boxes, road_marking: NDArray[np.bool_]
) -> NDArray[np.uint32]:
    """SemanticKITTI raw ids (| instance << 16) of returns, from their scene classes and box shapes."""
    b = np.maximum(box, 0)
    size = boxes.hi[b] - boxes.lo[b]
    thin = np.minimum(size[:, 0], size[:, 1])
    moving = np.abs(boxes.vx[b]) > 0.05
    raw = np.zeros(len(label), dtype=np.uint32)
    raw[label == sc.CAR] = 10
    raw[(label == sc.CAR) & moving] = 252
    raw[label == sc.ADULT] = 30
    raw[(label == sc.ADULT) & moving] = 254
    raw[label == sc.ROAD] = 40
    raw[(label == sc.ROAD) & road_marking] = 60
    raw[label == sc.SIDEWALK] = 48
    raw[label == sc.TERRAIN] = 72
    raw[label == sc.BARRIER] = 51
    manmade = label == sc.MANMADE
    raw[manmade] = 50
    raw[manmade & (thin <= 0.1)] = 51  # fences
    raw[manmade & (np.maximum(size[:, 0], size[:, 1]) <= 0.3)] = 80  # poles
    veg = label == sc.VEGETATION
    raw[veg] = 70
    raw[veg & ~boxes.porous[b] & (np.maximum(size[:, 0], size[:, 1]) <= 0.45)] = 71  # trunks
    thing = np.isin(label, (sc.CAR, sc.ADULT)) & (box >= 0)
    raw[thing] |= ((box[thing] + 1).astype(np.uint32) & 0xFFFF) << 16
    return raw


def _velodyne_pose(spec: sc.SceneSpec, t: float) -> NDArray[np.float64]:
    """4x4 world (road frame) pose of the velodyne at scene time ``t``."""
    x, y, yaw = (float(v[0]) for v in sc.ego_pose(spec, np.array([t])))
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0, x], [s, c, 0, y], [0, 0, 1, _HEIGHT], [0, 0, 0, 1]])


def _rows(matrices: list[NDArray[np.float64]]) -> bytes:
    """KITTI text rows: the top 3x4 of each matrix, row-major, ``%e``-formatted."""
    return "".join(" ".join(f"{v:e}" for v in m[:3].ravel()) + "\n" for m in matrices).encode()


def _calib() -> bytes:
    lines = []
    for i, shift in enumerate((0.0, -_BASELINE, 0.06, -_BASELINE - 0.0047)):
        p = np.array([[_FOCAL, 0, _CX, _FOCAL * shift], [0, _FOCAL, _CY, 0], [0, 0, 1, 0]])
        lines.append(f"P{i}: " + " ".join(f"{v:.12e}" for v in p.ravel()))
    lines.append("Tr: " + " ".join(f"{v:.12e}" for v in _TR[:3].ravel()))
    return ("\n".join(lines) + "\n").encode()


def unit_files(seed: int, index: int, frames: int) -> Iterator[tuple[str, bytes]]:
    """Every file of sequence ``index`` (NN = ``index`` zero-padded to 2 digits): scans and labels
    frame by frame, then poses.txt, calib.txt, times.txt. Deterministic from ``(seed, index, frames)``."""
    rng, spec, boxes = beams.street(seed, index, frames, _SALT)
    times = np.arange(frames) * _PERIOD + np.concatenate([[0.0], rng.uniform(-4e-4, 4e-4, frames - 1)])
    lidar = beams.Lidar(
        elevations_deg=ELEVATION_DEG, columns=_COLUMNS, height_m=_HEIGHT, phase=np.pi,
        start=-0.5, period_s=_PERIOD, min_range_m=1.0, max_range_m=120.0,
    )  # fmt: skip
    seq = f"sequences/{index:02d}"
    for f, t in enumerate(times):
        ret = beams.scan(
            spec, boxes, float(t), np.random.default_rng([seed, index, _SALT, 1, f]), lidar
        ).first
        keep = ret.range > 0
        pts = np.empty((int(keep.sum()), 4), dtype="<f4")
        pts[:, :3] = ret.xyz[keep]
        pts[:, 3] = np.round(ret.intensity[keep] / 255.0 * 100.0) / 100.0
        pose = _velodyne_pose(spec, float(t))
        world = ret.xyz[keep, :2] @ pose[:2, :2].T + pose[:2, 3]
        raw = _raw_ids(ret.label[keep], ret.box[keep], boxes, sc._on_marking(world[:, 0], world[:, 1]))
        yield f"{seq}/velodyne/{f:06d}.bin", pts.tobytes()
        yield f"{seq}/labels/{f:06d}.label", raw.astype("<u4").tobytes()
    v0_inv = np.linalg.inv(_velodyne_pose(spec, 0.0))
    tr_inv = np.linalg.inv(_TR)
    poses = [_TR @ v0_inv @ _velodyne_pose(spec, float(t)) @ tr_inv for t in times]
    yield f"{seq}/poses.txt", _rows(poses)
    yield f"{seq}/calib.txt", _calib()
    yield f"{seq}/times.txt", "".join(f"{t:e}\n" for t in times).encode()


def static_files(seed: int) -> Iterator[tuple[str, bytes]]:
    """``semantic-kitti.yaml`` (the same for every seed)."""
    yield "semantic-kitti.yaml", label_yaml().encode()
