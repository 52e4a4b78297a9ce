"""The nuScenes layout (and Lyft Level 5, which shares it): ``<root>/<version>/sample_data.json`` and
its sibling tables; one sample per LIDAR_TOP keyframe (``lidarshard.transforms.layouts.nuscenes_tasks``)."""

from __future__ import annotations

import posixpath

from lidarshard.transforms.layouts.nuscenes_tasks import load_tasks as load_tables
from lidarshard.transforms.layouts.task import Found, LayoutIO, LayoutOptions

__all__ = ["NAME", "describe", "load_tasks"]

NAME = "nuscenes"


def versions(root: str, io: LayoutIO) -> list[str]:
    """The table folders (``v1.*``: nuScenes ``v1.0-mini``, Lyft ``v1.01-train``) under ``root`` that hold
    ``sample_data.json``, sorted."""
    found = io.glob(posixpath.join(root.rstrip("/"), "v1.*", "sample_data.json"))
    return sorted({posixpath.basename(posixpath.dirname(p.replace("\\", "/"))) for p in found})


def describe(root: str, io: LayoutIO) -> str | None:
    """``"nuScenes tables v1.0-mini"`` when ``root`` is a nuScenes dataroot, else None."""
    found = versions(root, io)
    return f"nuScenes tables {', '.join(found)}" if found else None


def load_tasks(root: str, opts: LayoutOptions, io: LayoutIO) -> Found:
    """One task per LIDAR_TOP keyframe of the ``opts.version`` tables (the only one present when None)."""
    version = opts.version
    if version is None:
        found = versions(root, io)
        if len(found) != 1:
            raise ValueError(f"{root} holds tables {', '.join(found) or 'none'}: pass --nuscenes-version")
        version = found[0]
    tasks, rejects = load_tables(root, version, opts.sweeps, io.read_bytes)
    return Found(tasks, rejects)
