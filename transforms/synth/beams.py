"""The ray-cast spinning lidar of every synthetic layout, over the street scenes of ``scene`` (pure numpy).

The sensor is data: a ``Lidar`` gives the beam elevations, columns per turn, mounting (height,
position and yaw on the ego), range limits, spin period, whether points are motion-compensated
and what the ego body adds (a roof that returns, no-return placeholders), so that one caster
serves the nuScenes LIDAR_TOP (HDL-32E, ``dataroot``), the Argoverse 2 VLP-32C pair, the
SemanticKITTI HDL-64E and the five Waymo lidars.

Frames: road/world frame as in ``scene`` (x along the road, y left, z up, ground z = 0); the
sensor frame is x forward, y left, z up, rotated by the mounting yaw about z from the ego frame
(the KITTI velodyne, AV2 and Waymo convention). Azimuth is measured from +x toward +y; column
``k`` looks at ``phase - k * 2 pi / C`` (the sensor spins clockwise seen from above) and fires at
``t_frame + (start + k / C) * period_s``. Rays are ordered (ring, column) row-major: ray
``r * C + k`` is ``elevations_deg[r]`` at column ``k``, so ``range.reshape(R, C)`` is a range image.
Units: metres, seconds, radians (degrees where named ``_deg``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.synth import scene as sc

__all__ = ["Lidar", "Returns", "Scan", "street", "scan"]

_NONE = np.iinfo(np.int64).max
_PORE_PASS = 0.15  # chance that a ray passes a porous box (foliage) untouched
_SECOND = 0.6  # chance that a ray stopped in foliage also returns from the surface behind
_RANGE_SIGMA = 0.015  # m, range noise (HDL-32E: +-2 cm)
#: median intensity per class (0..255), lognormal around it
_REFLECT = {
    sc.EGO: 25, sc.CAR: 10, sc.ADULT: 8, sc.BARRIER: 30, sc.ROAD: 6, sc.SIDEWALK: 14, sc.TERRAIN: 10,
    sc.MANMADE: 18, sc.VEGETATION: 12,
}  # fmt: skip


@dataclass(frozen=True)
class Lidar:
    """One spinning lidar.

    Attributes:
        elevations_deg: (R,) beam elevations, degrees, in the order of the output rows.
        columns: firings per turn (C).
        height_m: sensor origin above the ground, m.
        forward_m, left_m: sensor origin in the ego frame (x forward, y left), m.
        yaw: mounting yaw of the sensor frame about the ego z axis, rad.
        phase: sensor-frame azimuth of column 0, rad; None draws it from the frame's generator.
        period_s: one turn, s.
        start: column 0 fires at ``t_frame + start * period_s``; -1 ends the turn at ``t_frame``.
        min_range_m, max_range_m: returns outside are dropped (ego body, sensor limit).
        half_fov_deg: columns farther than this from the sensor's +x axis return nothing (the
            vehicle body occludes them); 180 = the full turn.
        deskew: motion-compensate points into the sensor frame at ``t_frame``; False keeps each
            point in the sensor frame at its own firing time (exactly ``range * direction``).
        dual: also cast a second return behind foliage.
        roof: (drop, x0, x1, y0, y1) m: the ego roof, a rectangle ``drop`` below the sensor over
            x0..x1, y0..y1 of the sensor frame; rays reaching it return from it as ``scene.EGO``.
            None: no roof.
        placeholders: a ray without a return keeps a point at its firing origin (motion-compensated
            with ``deskew``), labelled ``scene.EGO``, as nuScenes files do; False: xyz 0, label 0.
    """

    elevations_deg: tuple[float, ...]
    columns: int
    height_m: float
    forward_m: float = 0.0
    left_m: float = 0.0
    yaw: float = 0.0
    phase: float | None = None
    period_s: float = 0.1
    start: float = -1.0
    min_range_m: float = 0.0
    max_range_m: float = 105.0
    half_fov_deg: float = 180.0
    deskew: bool = True
    dual: bool = False
    roof: tuple[float, float, float, float, float] | None = None
    placeholders: bool = False

    def azimuths(self, phase: float) -> NDArray[np.float64]:
        """(C,) sensor-frame azimuth of every column, rad."""
        return phase - np.arange(self.columns, dtype=np.float64) * (2 * np.pi / self.columns)


@dataclass(frozen=True)
class Returns:
    """One return per ray (R * C rows; a miss has range 0, box -1 and xyz 0, label 0 unless
    ``Lidar.placeholders``).

    Attributes:
        xyz: (R*C, 3) float64 sensor frame (see ``Lidar.deskew``), m.
        range: (R*C,) float64 distance from the firing origin, m (0 = no return).
        intensity: (R*C,) uint8 0..255.
        label: (R*C,) uint8 lidarseg class ids of ``scene`` (0 = no return).
        box: (R*C,) int64 index of the box hit into ``Boxes`` (-1: ground or no return).
    """

    xyz: NDArray[np.float64]
    range: NDArray[np.float64]
    intensity: NDArray[np.uint8]
    label: NDArray[np.uint8]
    box: NDArray[np.int64]


@dataclass(frozen=True)
class Scan:
    """A cast turn: first returns, second returns (all misses unless ``Lidar.dual``), timing.

    Attributes:
        first, second: per-ray returns.
        phase: the sensor-frame azimuth of column 0 used, rad.
        column_time: (C,) firing time of every column relative to ``t_frame``, s.
    """

    first: Returns
    second: Returns
    phase: float
    column_time: NDArray[np.float64]


def street(
    seed: int, index: int, frames: int, salt: int
) -> tuple[np.random.Generator, sc.SceneSpec, sc.Boxes]:
    """The street of unit ``index`` for a layout: its generator, spec and boxes (10 Hz frames).

    Kinds cycle urban/suburban/open; every 4th unit (0, 4, ...) is stopped, the others drive at
    2-12 m/s. Everything comes from ``default_rng([seed, index, salt])`` (``salt`` per layout).

    Returns:
        (rng, spec, boxes): the unit's generator (for its other draws, after the layout's),
        the scene (20 Hz ``n_frames`` spanning ``frames`` 10 Hz frames) and its boxes.
    """
    if seed < 0 or index < 0 or frames < 1:
        raise ValueError(f"need seed >= 0, index >= 0, frames >= 1; got {seed}, {index}, {frames}")
    rng = np.random.default_rng([seed, index, salt])
    kind = sc.SCENE_KINDS[index % len(sc.SCENE_KINDS)]
    speed = 0.0 if index % 4 == 0 else float(np.round(rng.uniform(2.0, 12.0), 2))
    spec = sc.SceneSpec(seed, index, kind, speed, 2 * frames + 1)
    return rng, spec, sc.scene_layout(spec, rng)


def _safe(u: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.where(np.abs(u) < 1e-12, np.where(u < 0, -1e-12, 1e-12), u)


def _box_hits(
    boxes: sc.Boxes,
    t_frame: float,
    ray: tuple[NDArray[np.float64], ...],
    tan_el: NDArray[np.float64],
    lidar: Lidar,
    rng: np.random.Generator,
) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64], NDArray[np.int64], NDArray[np.bool_]]:
    """The two nearest box hits per ray (``scene._box_hits`` for any beam set and sensor height).

    Returns:
        (rho1, box1, rho2, box2, porous1): (R, C) horizontal distances (m, inf = none), box indices
        (-1 = none) and whether the first box is porous.
    """
    ox, oy, ux, uy = ray
    n_ring, n_col = len(tan_el), len(ox)
    lo, hi = boxes.lo.copy(), boxes.hi.copy()
    lo[:, 0] += boxes.vx * t_frame
    hi[:, 0] += boxes.vx * t_frame
    gap = np.hypot(
        np.maximum(0, np.maximum(lo[:, 0] - ox.mean(), ox.mean() - hi[:, 0])),
        np.maximum(0, np.maximum(lo[:, 1] - oy.mean(), oy.mean() - hi[:, 1])),
    )
    idx = np.flatnonzero(gap < lidar.max_range_m + 2.0)
    lo, hi = lo[idx], hi[idx]
    ix, iy = 1.0 / _safe(ux)[:, None], 1.0 / _safe(uy)[:, None]
    tx0, tx1 = (lo[:, 0] - ox[:, None]) * ix, (hi[:, 0] - ox[:, None]) * ix
    ty0, ty1 = (lo[:, 1] - oy[:, None]) * iy, (hi[:, 1] - oy[:, None]) * iy
    r_in = np.maximum(np.minimum(tx0, tx1), np.minimum(ty0, ty1))
    r_out = np.minimum(np.maximum(tx0, tx1), np.maximum(ty0, ty1))
    col, j = np.nonzero((r_out > np.maximum(r_in, 0.0)) & (r_in < lidar.max_range_m))
    r_in, r_out = np.maximum(r_in[col, j], 0.0)[:, None], r_out[col, j][:, None]
    za = (lo[:, 2] - lidar.height_m)[:, None] / tan_el[None, :]  # (M', R)
    zb = (hi[:, 2] - lidar.height_m)[:, None] / tan_el[None, :]
    hit = np.maximum(r_in, np.minimum(za, zb)[j])
    out = np.minimum(r_out, np.maximum(za, zb)[j])
    porous = boxes.porous[idx][j]
    hit[porous] += rng.exponential(0.2, (int(porous.sum()), n_ring))
    ok = (hit <= out) & ~(porous[:, None] & (rng.random(hit.shape) < _PORE_PASS))
    pair, ring = np.nonzero(ok)
    where = ring * n_col + col[pair]
    key = (np.round(hit[pair, ring] * 1000.0).astype(np.int64) << 24) | j[pair]
    first = np.full(n_ring * n_col, _NONE, dtype=np.int64)
    np.minimum.at(first, where, key)
    rest = key != first[where]
    second = np.full(n_ring * n_col, _NONE, dtype=np.int64)
    np.minimum.at(second, where[rest], key[rest])
    rho1, box1 = _nearest(first, idx, (n_ring, n_col))
    rho2, box2 = _nearest(second, idx, (n_ring, n_col))
    porous1 = boxes.porous[np.maximum(box1, 0)] & (box1 >= 0)
    return rho1, box1, rho2, box2, porous1


def _nearest(
    key: NDArray[np.int64], idx: NDArray[np.int64], shape: tuple[int, int]
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Decode per-ray keys ``mm << 24 | candidate`` into (R, C) distances (m, inf) and box indices (-1)."""
    ok = key != _NONE
    box = np.full(key.shape, -1, dtype=np.int64)
    box[ok] = idx[key[ok] & 0xFFFFFF]
    rho = np.where(ok, (key >> 24) / 1000.0, np.inf)
    return rho.reshape(shape), box.reshape(shape)


def _intensity(label: NDArray[np.uint8], rng: np.random.Generator) -> NDArray[np.float32]:
    """Integer intensities 0..255: lognormal around each class's median, rare retro-reflectors."""
    median = np.zeros(256)
    for cls, m in _REFLECT.items():
        median[cls] = m
    value = median[label] * np.exp(rng.normal(0.0, 0.8, label.shape))
    retro = rng.random(label.shape) < 0.0015
    value = np.where(retro, rng.uniform(150, 255, label.shape), value)
    return np.clip(np.round(value), 0, 255).astype(np.float32)


def _roof(
    lidar: Lidar, tan_el: NDArray[np.float64], az: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """(R,) horizontal distance to the roof plane (m, inf for rings at or above the horizon) and the
    (R, C) rays that land on the roof rectangle (all False without ``Lidar.roof``)."""
    if lidar.roof is None:
        return np.full(tan_el.shape, np.inf), np.zeros((len(tan_el), len(az)), dtype=bool)
    drop, x0, x1, y0, y1 = lidar.roof
    down = tan_el < 0
    rho = np.where(down, drop / np.abs(tan_el), np.inf)
    d = np.where(down, rho, 0.0)[:, None]
    rx, ry = d * np.cos(az)[None, :], d * np.sin(az)[None, :]
    return rho, down[:, None] & (rx >= x0) & (rx <= x1) & (ry >= y0) & (ry <= y1)


def _column_rays(
    spec: sc.SceneSpec, t_frame: float, lidar: Lidar, phase: float
) -> tuple[NDArray[np.float64], ...]:
    """Per column: firing time offset, road-frame origin, road-frame horizontal direction."""
    k = np.arange(lidar.columns, dtype=np.float64)
    dt = (lidar.start + k / lidar.columns) * lidar.period_s
    ex, ey, yaw = sc.ego_pose(spec, t_frame + dt)
    ox = ex + lidar.forward_m * np.cos(yaw) - lidar.left_m * np.sin(yaw)
    oy = ey + lidar.forward_m * np.sin(yaw) + lidar.left_m * np.cos(yaw)
    world = lidar.azimuths(phase) + lidar.yaw + yaw
    return dt, ox, oy, np.cos(world), np.sin(world)


def _returns(
    spec: sc.SceneSpec,
    lidar: Lidar,
    t_frame: float,
    geometry: tuple[NDArray[np.float64], ...],
    hit: tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.bool_], NDArray[np.uint8]],
    rng: np.random.Generator,
) -> Returns:
    """Noise, dropout, labels, intensity and sensor-frame xyz of one set of hits, each (R, C)."""
    rho, box, ground, label = hit
    ox, oy, ux, uy, az, el = geometry
    r = rho / np.cos(el)
    fov = np.abs(np.angle(np.exp(1j * az))) <= np.radians(lidar.half_fov_deg) + 1e-9
    span = 0.67 * lidar.max_range_m
    p_drop = 0.02 + 0.6 * np.clip((r - (lidar.max_range_m - span)) / span, 0, 1) ** 2
    miss = ~np.isfinite(r) | (r > lidar.max_range_m) | (r < lidar.min_range_m) | ~fov
    miss |= rng.random(r.shape) < p_drop
    r = np.where(miss, 0.0, r + rng.normal(0, _RANGE_SIGMA, r.shape))
    rho = r * np.cos(el)
    px, py = ox + rho * ux, oy + rho * uy
    road = np.abs(py) <= sc._ROAD_HALF[spec.kind]
    label = np.where(ground, np.where(road, sc.ROAD, sc.TERRAIN), label)
    label = np.where(miss, sc.EGO if lidar.placeholders else 0, label).astype(np.uint8)
    box = np.where(miss | ground, -1, box)
    intensity = _intensity(label.ravel(), rng)
    marking = (label.ravel() == sc.ROAD) & sc._on_marking(px.ravel(), py.ravel())
    intensity[marking] = np.clip(np.round(rng.normal(60, 15, int(marking.sum()))), 30, 255)
    xyz = np.empty((r.size, 3), dtype=np.float64)
    if lidar.deskew:  # into the sensor frame at t_frame
        ex, ey, eyaw = (float(v[0]) for v in sc.ego_pose(spec, np.array([t_frame])))
        sx = ex + lidar.forward_m * np.cos(eyaw) - lidar.left_m * np.sin(eyaw)
        sy = ey + lidar.forward_m * np.sin(eyaw) + lidar.left_m * np.cos(eyaw)
        yaw = eyaw + lidar.yaw
        dx, dy = px - sx, py - sy
        xyz[:, 0] = (dx * np.cos(yaw) + dy * np.sin(yaw)).ravel()
        xyz[:, 1] = (-dx * np.sin(yaw) + dy * np.cos(yaw)).ravel()
    else:
        xyz[:, 0] = (rho * np.cos(az)).ravel()
        xyz[:, 1] = (rho * np.sin(az)).ravel()
    xyz[:, 2] = (r * np.sin(el)).ravel()
    if not lidar.placeholders:
        xyz[miss.ravel()] = 0.0
    return Returns(xyz, r.ravel(), intensity.astype(np.uint8), label.ravel(), box.ravel())


def scan(spec: sc.SceneSpec, boxes: sc.Boxes, t_frame: float, rng: np.random.Generator, lidar: Lidar) -> Scan:
    """One turn of ``lidar`` around scene time ``t_frame`` (s).

    Args:
        spec: the scene.
        boxes: ``scene.scene_layout(spec, ...)``.
        t_frame: the frame's timestamp, s from the scene start.
        rng: this frame's generator (everything random is drawn from it, in a fixed order).
        lidar: the sensor.

    Returns:
        ``Scan`` with R * C first (and second) returns in (ring, column) row-major order.
    """
    phase = float(rng.uniform(-np.pi, np.pi)) if lidar.phase is None else lidar.phase
    dt, ox, oy, ux, uy = _column_rays(spec, t_frame, lidar, phase)
    el_deg = np.asarray(lidar.elevations_deg, dtype=np.float64)
    tan_el = _safe(np.tan(np.radians(el_deg)))
    rho1, box1, rho2, box2, porous1 = _box_hits(boxes, t_frame, (ox, oy, ux, uy), tan_el, lidar, rng)
    ground_rho = np.where(tan_el < 0, lidar.height_m / np.abs(tan_el), np.inf)
    ground = np.broadcast_to(ground_rho[:, None], rho1.shape)
    grid = (ox[None, :], oy[None, :], ux[None, :], uy[None, :])
    geometry = (*grid, lidar.azimuths(phase)[None, :], np.radians(el_deg)[:, None])
    lab1 = np.where(box1 >= 0, boxes.label[np.maximum(box1, 0)], 0).astype(np.uint8)
    on_ground = ground < rho1
    roof_rho, on_roof = _roof(lidar, tan_el, lidar.azimuths(phase))
    rho_a = np.where(on_roof, roof_rho[:, None], np.where(on_ground, ground, rho1))
    hit = (rho_a, np.where(on_roof, -1, box1), on_ground & ~on_roof, np.where(on_roof, sc.EGO, lab1))
    first = _returns(spec, lidar, t_frame, geometry, hit, rng)
    behind = porous1 & ~on_ground & ~on_roof & (first.range.reshape(rho1.shape) > 0)
    if lidar.dual:
        behind &= rng.random(rho1.shape) < _SECOND
    else:
        behind[:] = False
    ground2 = ground < rho2
    rho_b = np.where(behind, np.where(ground2, ground, rho2), np.inf)
    lab2 = np.where(box2 >= 0, boxes.label[np.maximum(box2, 0)], 0).astype(np.uint8)
    second = _returns(spec, lidar, t_frame, geometry, (rho_b, box2, ground2 & behind, lab2), rng)
    return Scan(first=first, second=second, phase=phase, column_time=dt)
