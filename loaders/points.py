"""One sample's points: the keyframe plus its sweeps moved into the keyframe's sensor frame.

Pure numpy; imports neither Beam nor torch. Paths may be local or URIs (``gs://``, ``s3://``, ...):
every read goes through ``lidarshard.transforms.storage``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms import storage
from lidarshard.transforms.formats.readers import detect_format, read_points
from lidarshard.transforms.nuscenes.geometry import sweep_matrices
from lidarshard.transforms.nuscenes.multisweep import aggregate

__all__ = ["load_points"]


def load_points(
    path: str,
    fmt: str | None,
    sweep_paths: Sequence[str] = (),
    sweep_transforms: Sequence[float] | NDArray[np.float64] | None = None,
    point_dims: int | None = None,
) -> NDArray[np.float32]:
    """One sample's points: the keyframe plus its sweeps moved into the keyframe's sensor frame.

    Args:
        path: keyframe path/URI.
        fmt: reader name from the samples' ``format`` (None: detect from ``path``); sweeps use it too.
        sweep_paths: S sweep paths/URIs, newest first.
        sweep_transforms: 16*S floats, row-major 4x4 sweep-sensor -> keyframe-sensor per sweep.
        point_dims: channels per point for raw ``bin`` files, passed to the reader.

    Returns:
        (N + sum M', C) float32, xyz first (keyframe only when ``sweep_paths`` is empty).
    """
    fmt = fmt or detect_format(path)
    keyframe = read_points(storage.read_bytes(path), fmt, point_dims=point_dims)
    if not sweep_paths:
        return np.ascontiguousarray(keyframe, dtype=np.float32)
    mats = sweep_matrices(sweep_transforms, len(sweep_paths), path)
    sweeps = [read_points(storage.read_bytes(p), fmt, point_dims=point_dims) for p in sweep_paths]
    return aggregate(keyframe, sweeps, list(mats))
