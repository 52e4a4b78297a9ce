"""Rigid-body geometry of nuScenes records: quaternions, poses, sweep-to-keyframe transforms. Pure numpy.

One place for the maths the scanner (``tables``), the synthetic generator and the loaders share:
quaternions are (w, x, y, z) and normalized first; a pose is a translation (m) and a rotation; 4x4
matrices are float64, row-major, mapping child-frame points to the parent frame (``inverse``: back).

Bounds: a quaternion is normalized after scaling by its largest component, so no finite quaternion
overflows (``[1e200, 1e200, 0, 0]`` is a 90 degree turn about x, not the identity); one whose norm is
(near) zero is refused. A translation component beyond ``MAX_TRANSLATION_M`` is refused: no vehicle pose
lies there, and below it composing four poses cannot overflow float64 (a sweep point the composed
transform would still carry beyond float32 is ``absurd_coordinates`` in ``multisweep.aggregate``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.schemas.jsonsafe import short
from lidarshard.transforms.errors import RejectError

__all__ = [
    "MAX_TRANSLATION_M",
    "quaternion_matrix",
    "pose_matrix",
    "pose_record",
    "sweep_transform",
    "sweep_matrices",
]

#: Largest |translation component| (m) of a pose record: 1e9 m is 150 Earth radii (ECEF is ~6.4e6 m).
MAX_TRANSLATION_M = 1.0e9
#: A quaternion whose norm is at most this is refused as (near) zero: it names no rotation.
_MIN_NORM = 1e-9


def _vector(value: object, size: int, what: str) -> list[float]:
    if isinstance(value, (list, tuple)) and len(value) == size:
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            out = [float(v) for v in value]
            if all(map(math.isfinite, out)):
                return out
    raise RejectError("bad_table", f"{what} must be a list of {size} finite numbers, got {short(value)}")


def _rotation(q: object) -> list[list[float]]:
    w, x, y, z = _vector(q, 4, "rotation quaternion")
    scale = max(abs(w), abs(x), abs(y), abs(z))  # divide first: squaring 1e200 would overflow to inf
    if scale > 0.0:
        w, x, y, z = w / scale, x / scale, y / scale, z / scale
    norm = math.sqrt(w * w + x * x + y * y + z * z)  # in [1, 2] after scaling (0 for a zero quaternion)
    if not norm * scale > _MIN_NORM:
        raise RejectError("bad_table", f"rotation quaternion {short(q)} has (near) zero norm")
    w, x, y, z = w / norm, x / norm, y / norm, z / norm
    return [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]


def quaternion_matrix(q: object) -> NDArray[np.float64]:
    """(3, 3) float64 rotation of a table quaternion ``q`` = (w, x, y, z), normalized first (any finite
    scale, overflow-free).

    Raises:
        RejectError: ``bad_table`` if not 4 finite numbers or the norm is (near) zero (<= 1e-9).
    """
    return np.array(_rotation(q))


def pose_matrix(record: object, inverse: bool = False) -> NDArray[np.float64]:
    """4x4 matrix of a ``calibrated_sensor`` or ``ego_pose`` record, like devkit ``transform_matrix``.

    Args:
        record: mapping with ``translation`` (3 numbers, m) and ``rotation`` (w, x, y, z).
        inverse: False gives child -> parent (sensor -> car, car -> global); True the inverse
            (``R.T``, ``R.T @ -t``), as the devkit computes it.

    Returns:
        (4, 4) float64 homogeneous transform.

    Raises:
        RejectError: ``bad_table`` for a missing or malformed translation/rotation, or a translation
            component beyond ``MAX_TRANSLATION_M``.
    """
    if not isinstance(record, dict):
        raise RejectError("bad_table", f"pose record {short(record)} is not a JSON object")
    try:
        rot = _rotation(record.get("rotation"))
        t = _vector(record.get("translation"), 3, "translation")
        if max(map(abs, t)) > MAX_TRANSLATION_M:
            detail = f"translation {short(t)} m is beyond {MAX_TRANSLATION_M:g} m (not a vehicle pose)"
            raise RejectError("bad_table", detail)
    except RejectError as err:
        raise RejectError("bad_table", f"pose {short(record.get('token', '?'))}: {err.detail}") from None
    if inverse:
        rot = [list(col) for col in zip(*rot, strict=True)]
        t = [-(r[0] * t[0] + r[1] * t[1] + r[2] * t[2]) for r in rot]
    return np.array([rot[0] + [t[0]], rot[1] + [t[1]], rot[2] + [t[2]], [0.0, 0.0, 0.0, 1.0]])


def pose_record(translation: Sequence[float], rotation: Sequence[float]) -> dict[str, list[float]]:
    """A ``calibrated_sensor``/``ego_pose``-shaped record of a translation (m) and a (w, x, y, z) rotation."""
    return {"translation": list(translation), "rotation": list(rotation)}


def sweep_transform(
    ref_cs: object, ref_pose: object, sweep_cs: object, sweep_pose: object
) -> NDArray[np.float64]:
    """Sweep sensor frame -> keyframe (reference) sensor frame, composed exactly as the devkit does.

    ``ref_from_car @ car_from_global @ global_from_car @ car_from_current``, evaluated left to right.

    Args:
        ref_cs, ref_pose: the keyframe's ``calibrated_sensor`` and ``ego_pose`` records.
        sweep_cs, sweep_pose: the sweep's ``calibrated_sensor`` and ``ego_pose`` records.

    Returns:
        (4, 4) float64 homogeneous transform (m).

    Raises:
        RejectError: ``bad_table`` for a malformed record.
    """
    ref_from_global = pose_matrix(ref_cs, inverse=True) @ pose_matrix(ref_pose, inverse=True)
    return ref_from_global @ pose_matrix(sweep_pose) @ pose_matrix(sweep_cs)


def sweep_matrices(
    values: Sequence[float] | NDArray[np.float64] | None, count: int, where: str
) -> NDArray[np.float64]:
    """(count, 4, 4) float64 from the ``16 * count`` row-major floats of ``sweep_transforms`` (None: none).

    Raises:
        ValueError: the number of values is not ``16 * count`` (names ``where``).
    """
    mats = np.asarray(values if values is not None else [], dtype=np.float64)
    if mats.size != 16 * count:
        raise ValueError(f"{where}: {count} sweeps but {mats.size} transform values (want 16 each)")
    return mats.reshape(count, 4, 4)
