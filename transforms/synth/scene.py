"""Synthetic street scenes and a ray-cast 32-beam LiDAR (pure numpy, no Beam).

A scene is a straight road along the world x axis lined with axis-aligned boxes (buildings,
sidewalks, parked and moving cars, pedestrians, poles, trees with porous canopies, fences,
guard rails). The ego drives along the road (or stands still) and a LIDAR_TOP modelled on the
nuScenes Velodyne HDL-32E spins at 20 Hz: 32 rings from -30.67 to +10.67 deg, 1,084 columns per
turn, rows in firing order (ring 0..31 cyclic), 34,688 points per sweep. Each column fires from
the sensor pose at its own time; points are then motion-compensated to the sweep timestamp,
which is why no-return placeholders lie on a short line behind a moving sensor as in real
nuScenes files. Rays that hit the roof (rings 0-7 mostly) or return nothing stay within 1 m of
the sensor and are labelled ``vehicle.ego``.

Frames: sensor frame x right, y forward, z up (nuScenes LIDAR_TOP); road/world frame x along the
road, y left, z up, ground z = 0. Units: metres, seconds, radians.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "N_RINGS", "N_COLUMNS", "POINTS_PER_SWEEP", "RING_ELEVATION_DEG", "LIDAR_TRANSLATION", "LIDAR_ROTATION",
    "SWEEP_PERIOD_S", "SCENE_KINDS", "EGO_LANE", "Boxes", "SceneSpec", "scene_layout", "ego_pose", "scan_frame",
    "EGO", "CAR", "ADULT", "BARRIER", "ROAD", "SIDEWALK", "TERRAIN", "MANMADE", "VEGETATION",
]  # fmt: skip

N_RINGS = 32
N_COLUMNS = 1084
POINTS_PER_SWEEP = N_RINGS * N_COLUMNS  # 34,688
RING_ELEVATION_DEG: NDArray[np.float64] = np.linspace(-30.67, 10.67, N_RINGS)
#: lidar-to-ego extrinsics (nuScenes LIDAR_TOP, tilt dropped): metres; quaternion w, x, y, z (yaw -90 deg).
LIDAR_TRANSLATION = (0.944, 0.0, 1.84)
LIDAR_ROTATION = (float(np.sqrt(0.5)), 0.0, 0.0, -float(np.sqrt(0.5)))
SWEEP_PERIOD_S = 0.05
SCENE_KINDS = ("urban", "suburban", "open")

_MAX_RANGE = 105.0  # m; beyond this a ray returns nothing
_RANGE_SIGMA = 0.015  # m, range noise (HDL-32E: +-2 cm)
_ROOF_DROP = 0.28  # m, roof plane below the sensor
_ROOF_BOX = (-0.60, 0.60, -0.50, 0.30)  # roof footprint in the sensor frame: x0, x1, y0, y1 (m)
_LANE = 3.5  # m
_LANES = {"urban": 2, "suburban": 1, "open": 2}  # per direction; urban/suburban add a parking strip
EGO_LANE = -_LANE / 2  # road-frame y of the ego's lane centre (drives toward +x)
_ROAD_HALF = {"urban": 9.0, "suburban": 5.5, "open": 7.5}  # m, road axis to kerb (lanes + parking)

# lidarseg class ids (nuScenes-lidarseg category.json ``index``).
EGO, CAR, ADULT, BARRIER, ROAD, SIDEWALK, TERRAIN, MANMADE, VEGETATION = 31, 17, 2, 9, 24, 26, 27, 28, 30
#: median intensity per class (0..255), lognormal around it
_REFLECT = {
    EGO: 25,
    CAR: 10,
    ADULT: 8,
    BARRIER: 30,
    ROAD: 6,
    SIDEWALK: 14,
    TERRAIN: 10,
    MANMADE: 18,
    VEGETATION: 12,
}


@dataclass(frozen=True)
class SceneSpec:
    """What one scene looks like: its kind, ego motion and length.

    Attributes:
        seed: dataset seed.
        index: scene index within the dataset.
        kind: one of ``SCENE_KINDS``.
        speed: ego cruise speed, m/s (0 = stopped for the whole scene).
        n_frames: lidar sweeps in the scene (keyframes and sweeps), 20 Hz.
    """

    seed: int
    index: int
    kind: str
    speed: float
    n_frames: int

    @property
    def duration(self) -> float:
        """Seconds from the first to the last sweep."""
        return (self.n_frames - 1) * SWEEP_PERIOD_S


@dataclass(frozen=True)
class Boxes:
    """Axis-aligned boxes in the road frame, M of them.

    Attributes:
        lo, hi: (M, 3) corners, m, at scene time 0.
        label: (M,) lidarseg class id.
        vx: (M,) speed along the road, m/s (0 = static).
        porous: (M,) True for foliage: rays penetrate a random depth or pass through.
    """

    lo: NDArray[np.float64]
    hi: NDArray[np.float64]
    label: NDArray[np.uint8]
    vx: NDArray[np.float64]
    porous: NDArray[np.bool_]


def ego_pose(spec: SceneSpec, t: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
    """Ego position and heading at scene times ``t`` (s, any shape).

    Returns:
        (x, y, yaw): road-frame ego origin (m) and heading (rad), each shaped like ``t``.
        Moving scenes weave gently within the lane (0.3 m, 8 s period) so that yaw varies.
    """
    t = np.asarray(t, dtype=np.float64)
    w = 2 * np.pi / 8.0
    amp = 0.3 if spec.speed > 0 else 0.0
    x = spec.speed * t
    y = EGO_LANE + amp * np.sin(w * t)
    yaw = np.arctan2(amp * w * np.cos(w * t), spec.speed) if spec.speed > 0 else np.zeros_like(t)
    return x, y, yaw


def _box_rows(
    rng: np.random.Generator, s0: float, s1: float, gap: tuple[float, float], length: tuple[float, float]
) -> NDArray[np.float64]:
    """(n, 2) intervals [start, end) along the road from ``s0`` to ``s1`` with random gaps."""
    n = int((s1 - s0) / (gap[0] + length[0])) + 2
    lens = rng.uniform(*length, n)
    gaps = rng.uniform(*gap, n)
    start = s0 + np.cumsum(gaps + lens) - lens
    keep = start < s1
    return np.stack([start[keep], start[keep] + lens[keep]], axis=1)


def _add(
    parts: list,
    seg: NDArray[np.float64],
    across: tuple,
    z: tuple,
    label: int,
    vx: object = 0.0,
    porous: bool = False,
) -> None:
    """Append boxes spanning ``seg`` (n, 2) along the road, ``across`` (lo, hi) and ``z`` (lo, hi)."""
    n = len(seg)
    lo = np.stack([seg[:, 0], np.broadcast_to(across[0], n), np.broadcast_to(z[0], n)], axis=1)
    hi = np.stack([seg[:, 1], np.broadcast_to(across[1], n), np.broadcast_to(z[1], n)], axis=1)
    vx = np.broadcast_to(np.asarray(vx, dtype=np.float64), n)
    parts.append((lo, hi, np.full(n, label, np.uint8), vx, np.full(n, porous)))


def _both_sides(parts: list, rng: np.random.Generator, s: tuple[float, float], row: _Row) -> None:
    """Boxes of one ``_ROWS`` entry on both sides of the road over ``s`` (start, end) m."""
    near, depth, z, gap, length, label, porous = row
    for side in (-1.0, 1.0):
        seg = _box_rows(rng, s[0], s[1], gap, length)
        inner = side * rng.uniform(*near, len(seg))
        outer = inner + side * rng.uniform(*depth, len(seg))
        zz = (0.0, 4 + 36 * rng.beta(1.3, 3.0, len(seg))) if z is None else z  # mostly low-rise
        _add(parts, seg, (np.minimum(inner, outer), np.maximum(inner, outer)), zz, label, porous=porous)


def _trees(
    parts: list, rng: np.random.Generator, s: tuple[float, float], near: float, spacing: tuple[float, float]
) -> None:
    """Trees on both sides: a trunk box and a porous canopy box each."""
    for side in (-1.0, 1.0):
        seg = _box_rows(rng, s[0], s[1], spacing, (0.4, 0.4))
        lc = side * (near + rng.uniform(0, 1.5, len(seg)))
        _add(parts, seg, (lc - 0.2, lc + 0.2), (0.0, 3.0), VEGETATION)
        r = rng.uniform(1.2, 2.8, len(seg))
        canopy = seg.mean(axis=1)[:, None] + np.stack([-r, r], axis=1)
        _add(parts, canopy, (lc - r, lc + r), (2.5, 2.5 + 1.6 * r), VEGETATION, porous=True)


def _traffic(parts: list, rng: np.random.Generator, spec: SceneSpec, s: tuple[float, float]) -> None:
    """Cars in the lanes (right-hand traffic), parked cars and pedestrians unless the road is open."""
    half = _ROAD_HALF[spec.kind]
    vx: float | NDArray[np.float64]
    for i in range(_LANES[spec.kind]):
        for side in (-1.0, 1.0):
            lane = side * (i + 0.5) * _LANE
            seg = _box_rows(rng, s[0] - 150, s[1] + 150, (8.0, 60.0), (4.2, 5.5))
            if lane == EGO_LANE:  # same-lane traffic keeps its gap, clear of the ego
                seg, vx = seg[(seg[:, 1] < -6.0) | (seg[:, 0] > 8.0)], spec.speed
            else:
                vx = -side * rng.uniform(6.0 if spec.speed > 0 else 0.0, 14.0, len(seg))
            _add(parts, seg, (lane - 0.95, lane + 0.95), (0.15, 1.6), CAR, vx=vx)
    if spec.kind == "open":
        return
    for side in (-1.0, 1.0):
        seg = _box_rows(rng, s[0], s[1], (1.0, 25.0), (4.2, 5.0))
        _add(parts, seg, (side * (half - 1.0) - 0.95, side * (half - 1.0) + 0.95), (0.15, 1.55), CAR)
        seg = _box_rows(rng, s[0], s[1], (4.0, 40.0), (0.5, 0.6))
        walk = side * (half + rng.uniform(0.5, 2.5, len(seg)))
        _add(parts, seg, (walk - 0.3, walk + 0.3), (0.15, 1.75), ADULT, vx=rng.normal(0, 1.0, len(seg)))


_Span = tuple[float, float]
#: One ``_ROWS`` entry (its fields are described there).
_Row = tuple[_Span, _Span, _Span | None, _Span, _Span, int, bool]
#: Rows of boxes along both road sides per scene kind: inner face distance from the road axis
#: (min, max), depth across, z (bottom, top; None = building heights), gap and length along the
#: road (min, max), class, porous. All metres.
_ROWS: dict[str, list[_Row]] = {
    "urban": [
        ((9.0, 9.0), (3.0, 3.0), (0.0, 0.15), (0.0, 0.0), (60.0, 60.0), SIDEWALK, False),
        ((12.0, 14.0), (10.0, 30.0), None, (0.5, 12.0), (8.0, 40.0), MANMADE, False),  # buildings
        ((9.6, 9.6), (0.25, 0.25), (0.0, 7.0), (15.0, 30.0), (0.25, 0.25), MANMADE, False),  # poles
    ],
    "suburban": [
        ((5.5, 5.5), (2.0, 2.0), (0.0, 0.12), (0.0, 0.0), (60.0, 60.0), SIDEWALK, False),
        ((11.0, 11.0), (0.08, 0.08), (0.0, 1.3), (1.0, 15.0), (6.0, 30.0), MANMADE, False),  # fences
        ((16.0, 24.0), (8.0, 14.0), (0.0, 7.5), (6.0, 25.0), (8.0, 18.0), MANMADE, False),  # houses
    ],
    "open": [
        ((7.5, 7.5), (0.1, 0.1), (0.3, 0.9), (0.0, 2.0), (30.0, 80.0), BARRIER, False),  # guard rails
        ((9.0, 18.0), (1.0, 4.0), (0.0, 1.8), (1.0, 10.0), (3.0, 25.0), VEGETATION, True),  # bushes
        ((25.0, 60.0), (5.0, 20.0), (0.0, 9.0), (20.0, 120.0), (20.0, 80.0), VEGETATION, True),  # woods
        ((40.0, 80.0), (10.0, 40.0), (0.0, 12.0), (20.0, 120.0), (10.0, 60.0), MANMADE, False),  # sheds
    ],
}
#: Trees per kind: distance of the trunk line from the road axis (m), spacing (min, max) (m).
_TREES = {"urban": (10.0, (8.0, 30.0)), "suburban": (8.5, (3.0, 15.0)), "open": (12.0, (1.0, 15.0))}


def scene_layout(spec: SceneSpec, rng: np.random.Generator) -> Boxes:
    """All boxes of a scene, covering the ego path plus the lidar range on either end.

    Args:
        spec: the scene.
        rng: the scene's generator (``np.random.default_rng([seed, index])``).

    Returns:
        Boxes in the road frame at scene time 0.
    """
    s = (-_MAX_RANGE - 20.0, spec.speed * spec.duration + _MAX_RANGE + 20.0)
    parts: list = []
    for row in _ROWS[spec.kind]:
        _both_sides(parts, rng, s, row)
    _trees(parts, rng, s, *_TREES[spec.kind])
    _traffic(parts, rng, spec, s)
    lo, hi, label, vx, porous = (np.concatenate(a) for a in zip(*parts, strict=True))
    return Boxes(lo=lo, hi=hi, label=label, vx=vx, porous=porous)


def _column_rays(spec: SceneSpec, t_frame: float, phase: float) -> tuple[NDArray[np.float64], ...]:
    """Per-column sensor origin (road frame) and horizontal ray direction.

    Column k fires at ``t_frame - (N_COLUMNS-1-k)/N_COLUMNS * SWEEP_PERIOD_S`` from the sensor pose
    at that time; azimuth (sensor frame, from +x toward +y) decreases by 360/1084 deg per column.

    Returns:
        (ox, oy, ux, uy, az): each (N_COLUMNS,); m, m, unit vector, sensor azimuth rad.
    """
    k = np.arange(N_COLUMNS, dtype=np.float64)
    t = t_frame - (N_COLUMNS - 1 - k) / N_COLUMNS * SWEEP_PERIOD_S
    ex, ey, yaw = ego_pose(spec, t)
    ox = ex + LIDAR_TRANSLATION[0] * np.cos(yaw)
    oy = ey + LIDAR_TRANSLATION[0] * np.sin(yaw)
    az = phase - k * (2 * np.pi / N_COLUMNS)
    world = az + yaw - np.pi / 2
    return ox, oy, np.cos(world), np.sin(world), az


def _safe_inv(u: NDArray[np.float64]) -> NDArray[np.float64]:
    return 1.0 / np.where(np.abs(u) < 1e-12, 1e-12, u)


def _box_hits(
    boxes: Boxes, t_frame: float, rays: tuple[NDArray[np.float64], ...], rng: np.random.Generator
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Nearest box hit per ray, vectorized over (column x box) then (pair x ring).

    Returns:
        (rho, box): (N_COLUMNS, N_RINGS) horizontal hit distance (m, inf = none) and box index (-1).
    """
    ox, oy, ux, uy, _ = rays
    lo = boxes.lo.copy()
    hi = boxes.hi.copy()
    lo[:, 0] += boxes.vx * t_frame
    hi[:, 0] += boxes.vx * t_frame
    gap = np.hypot(
        np.maximum(0, np.maximum(lo[:, 0] - ox[-1], ox[-1] - hi[:, 0])),
        np.maximum(0, np.maximum(lo[:, 1] - oy[-1], oy[-1] - hi[:, 1])),
    )
    idx = np.flatnonzero(gap < _MAX_RANGE)
    lo, hi = lo[idx], hi[idx]
    ix, iy = _safe_inv(ux)[:, None], _safe_inv(uy)[:, None]
    tx0, tx1 = (lo[:, 0] - ox[:, None]) * ix, (hi[:, 0] - ox[:, None]) * ix
    ty0, ty1 = (lo[:, 1] - oy[:, None]) * iy, (hi[:, 1] - oy[:, None]) * iy
    r_in = np.maximum(np.minimum(tx0, tx1), np.minimum(ty0, ty1))
    r_out = np.minimum(np.maximum(tx0, tx1), np.maximum(ty0, ty1))
    col, j = np.nonzero((r_out > np.maximum(r_in, 0.0)) & (r_in < _MAX_RANGE))
    r_in, r_out = np.maximum(r_in[col, j], 0.0)[:, None], r_out[col, j][:, None]
    tan_el = np.tan(np.radians(RING_ELEVATION_DEG))
    za = (lo[:, 2] - LIDAR_TRANSLATION[2])[:, None] / tan_el  # (M', 32)
    zb = (hi[:, 2] - LIDAR_TRANSLATION[2])[:, None] / tan_el
    hit = np.maximum(r_in, np.minimum(za, zb)[j])
    out = np.minimum(r_out, np.maximum(za, zb)[j])
    porous = boxes.porous[idx][j]
    hit[porous] += rng.exponential(0.2, (int(porous.sum()), N_RINGS))
    ok = (hit <= out) & ~(porous[:, None] & (rng.random(hit.shape) < 0.15))
    pair, ring = np.nonzero(ok)
    key = np.full(POINTS_PER_SWEEP, np.iinfo(np.int64).max, dtype=np.int64)
    mm = np.round(hit[pair, ring] * 1000.0).astype(np.int64)
    np.minimum.at(key, col[pair] * N_RINGS + ring, (mm << 24) | j[pair])
    found = key != np.iinfo(np.int64).max
    rho = np.where(found, (key >> 24) / 1000.0, np.inf).reshape(N_COLUMNS, N_RINGS)
    box = np.full(POINTS_PER_SWEEP, -1, dtype=np.int64)
    box[found] = idx[key[found] & 0xFFFFFF]
    return rho, box.reshape(N_COLUMNS, N_RINGS)


def _intensity(label: NDArray[np.uint8], rng: np.random.Generator) -> NDArray[np.float32]:
    """Integer intensities 0..255: lognormal around each class's median, rare retro-reflectors."""
    median = np.zeros(256)
    for cls, m in _REFLECT.items():
        median[cls] = m
    value = median[label] * np.exp(rng.normal(0.0, 0.8, label.shape))
    retro = rng.random(label.shape) < 0.0015
    value = np.where(retro, rng.uniform(150, 255, label.shape), value)
    return np.clip(np.round(value), 0, 255).astype(np.float32)


def _surfaces(
    boxes: Boxes,
    t_frame: float,
    rays: tuple[NDArray[np.float64], ...],
    rng: np.random.Generator,
) -> tuple[NDArray[np.float64], NDArray[np.uint8], NDArray[np.bool_], NDArray[np.bool_]]:
    """First surface along every ray: the ego roof, a box or the ground.

    Returns:
        (rho, label, on_ground, on_roof), each (N_COLUMNS, N_RINGS): horizontal distance (m, inf =
        nothing), class of the box hit (0 otherwise), and whether the ground / the roof was hit.
    """
    tan_el = np.tan(np.radians(RING_ELEVATION_DEG))[None, :]
    rho, box = _box_hits(boxes, t_frame, rays, rng)
    label = np.where(box >= 0, boxes.label[np.maximum(box, 0)], 0).astype(np.uint8)
    down = -np.minimum(tan_el, -1e-9)
    ground = np.where(tan_el < 0, LIDAR_TRANSLATION[2] / down, np.inf)
    on_ground = ground < rho
    roof = np.where(tan_el < 0, _ROOF_DROP / down, np.inf)
    az = rays[4][:, None]
    x0, x1, y0, y1 = _ROOF_BOX
    rx, ry = roof * np.cos(az), roof * np.sin(az)
    on_roof = (rx >= x0) & (rx <= x1) & (ry >= y0) & (ry <= y1)
    rho = np.where(on_roof, roof, np.where(on_ground, ground, rho))
    return rho, label, on_ground & ~on_roof, on_roof


def scan_frame(
    spec: SceneSpec, boxes: Boxes, t_frame: float, rng: np.random.Generator
) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
    """One 20 Hz LIDAR_TOP sweep ending at scene time ``t_frame``.

    Args:
        spec: the scene.
        boxes: ``scene_layout(spec, ...)``.
        t_frame: sweep timestamp, s from the scene start.
        rng: this frame's generator.

    Returns:
        (points, labels): (34688, 5) float32 x, y, z (m, sensor frame at ``t_frame``), intensity
        (integer 0..255), ring (0..31), rows in firing order; (34688,) uint8 lidarseg class ids.
    """
    rays = _column_rays(spec, t_frame, rng.uniform(0, 2 * np.pi))
    ox, oy, ux, uy, _ = rays
    el = np.radians(RING_ELEVATION_DEG)[None, :]
    rho, label, on_ground, on_roof = _surfaces(boxes, t_frame, rays, rng)
    rng_m = rho / np.cos(el)
    p_drop = 0.02 + 0.6 * np.clip((rng_m - 35.0) / (_MAX_RANGE - 35.0), 0, 1) ** 2
    miss = (rng_m > _MAX_RANGE) | (rng.random(rho.shape) < p_drop)  # no return: the sensor origin
    rho = np.where(miss, 0.0, rho + rng.normal(0, _RANGE_SIGMA, rho.shape) * np.cos(el))
    px, py = ox[:, None] + rho * ux[:, None], oy[:, None] + rho * uy[:, None]
    label = np.where(on_ground, np.where(np.abs(py) <= _ROAD_HALF[spec.kind], ROAD, TERRAIN), label)
    label = np.where(on_roof | miss, EGO, label).astype(np.uint8).ravel()
    intensity = _intensity(label, rng)
    marking = (label == ROAD) & _on_marking(px.ravel(), py.ravel())
    intensity[marking] = np.clip(np.round(rng.normal(60, 15, int(marking.sum()))), 30, 255)
    yaw = float(ego_pose(spec, np.array([t_frame]))[2][0])
    dx, dy = px - ox[-1], py - oy[-1]  # motion compensation: into the sensor frame at t_frame
    out = np.empty((POINTS_PER_SWEEP, 5), dtype=np.float32)
    out[:, 0] = (dx * np.sin(yaw) - dy * np.cos(yaw)).ravel()
    out[:, 1] = (dx * np.cos(yaw) + dy * np.sin(yaw)).ravel()
    out[:, 2] = (rho * np.tan(el)).ravel()
    out[:, 3] = intensity
    out[:, 4] = np.tile(np.arange(N_RINGS, dtype=np.float32), N_COLUMNS)
    return out, label


def _on_marking(x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Painted lane lines: a solid centre line and dashed lane separators (15 cm wide)."""
    centre = np.abs(y) < 0.075
    dashed = (np.abs(np.abs(y) - _LANE) < 0.075) & (np.mod(x, 9.0) < 3.0)
    return centre | dashed
