"""Optional open3d reader for PCD/PLY, used to cross-check ``lidarshard.transforms.formats.readers`` and as an escape hatch.

open3d is a heavy optional dependency (``pip install "lidarshard[open3d]"``) and is imported lazily.
Its reader only accepts a file path, so the bytes are written to a temporary file with the right suffix.
Unlike ``read_points`` it returns x, y, z only, and it does not guard against hostile headers: do not
feed it untrusted input.
"""

from __future__ import annotations

import os
import tempfile
from types import ModuleType

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.errors import RejectError

__all__ = ["OPEN3D_FORMATS", "import_open3d", "read_points_open3d"]

#: Formats open3d's ``read_point_cloud`` handles that lidarshard also names.
OPEN3D_FORMATS: tuple[str, ...] = ("pcd", "ply")


def import_open3d() -> ModuleType:
    """Import open3d, or raise an ImportError that names the extra to install."""
    try:
        import open3d
    except ImportError as e:
        raise ImportError(
            'the open3d backend needs open3d: pip install "lidarshard[open3d]" (open3d-cpu on x86_64)'
        ) from e
    return open3d


def read_points_open3d(data: bytes, fmt: str, *, remove_nan_points: bool = False) -> NDArray[np.float32]:
    """Decode a PCD or PLY file with open3d.

    Args:
        data: the whole file.
        fmt: ``"pcd"`` or ``"ply"``.
        remove_nan_points: drop points with a NaN coordinate (open3d's flag); the default keeps
            organized clouds at WIDTH * HEIGHT rows like ``read_points``.

    Returns:
        ``(N, 3)`` float32 x, y, z, C-contiguous (open3d keeps float64 internally).

    Raises:
        ImportError: open3d is not installed.
        RejectError: ``unsupported_format`` for other formats; ``empty`` when open3d finds no points
            (it also reports unreadable files that way, printing a warning).
    """
    if fmt not in OPEN3D_FORMATS:
        raise RejectError("unsupported_format", f"open3d backend reads {OPEN3D_FORMATS}, not {fmt!r}")
    o3d = import_open3d()
    with tempfile.TemporaryDirectory(prefix="lidarshard-o3d-") as tmp:
        path = os.path.join(tmp, f"cloud.{fmt}")
        with open(path, "wb") as f:
            f.write(data)
        cloud = o3d.io.read_point_cloud(
            path, format=fmt, remove_nan_points=remove_nan_points, remove_infinite_points=False
        )
    points = np.asarray(cloud.points, dtype=np.float32).reshape(-1, 3)
    if len(points) == 0:
        raise RejectError("empty", f"open3d read no points from the {fmt} data ({len(data)} bytes)")
    return np.ascontiguousarray(points)
