"""Synthetic street scenes (pure numpy, no Beam): the world every synthetic lidar ray-casts.

A scene is a straight road along the world x axis lined with axis-aligned boxes (buildings,
sidewalks, parked and moving cars, pedestrians, poles, trees with porous canopies, fences,
guard rails) and painted lane lines. The ego drives along the road (or stands still); its pose
at any time is ``ego_pose``. The sensors live in ``beams`` (one caster, the sensor as data) and
the layouts' writers (the nuScenes LIDAR_TOP in ``dataroot``).

Frame: road/world frame x along the road, y left, z up, ground z = 0. Units: metres, seconds,
radians.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "SWEEP_PERIOD_S", "SCENE_KINDS", "EGO_LANE", "Boxes", "SceneSpec", "scene_layout", "ego_pose",
    "EGO", "CAR", "ADULT", "BARRIER", "ROAD", "SIDEWALK", "TERRAIN", "MANMADE", "VEGETATION",
]  # fmt: skip

SWEEP_PERIOD_S = 0.05  # s, the scene's frame clock (20 Hz)
SCENE_KINDS = ("urban", "suburban", "open")

_MAX_RANGE = 105.0  # m; the layout covers the ego path plus this much on either end
_LANE = 3.5  # m
_LANES = {"urban": 2, "suburban": 1, "open": 2}  # per direction; urban/suburban add a parking strip
EGO_LANE = -_LANE / 2  # road-frame y of the ego's lane centre (drives toward +x)
_ROAD_HALF = {"urban": 9.0, "suburban": 5.5, "open": 7.5}  # m, road axis to kerb (lanes + parking)

# lidarseg class ids (nuScenes-lidarseg category.json ``index``).
EGO, CAR, ADULT, BARRIER, ROAD, SIDEWALK, TERRAIN, MANMADE, VEGETATION = 31, 17, 2, 9, 24, 26, 27, 28, 30


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


def _on_marking(x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Painted lane lines: a solid centre line and dashed lane separators (15 cm wide)."""
    centre = np.abs(y) < 0.075
    dashed = (np.abs(np.abs(y) - _LANE) < 0.075) & (np.mod(x, 9.0) < 3.0)
    return centre | dashed
