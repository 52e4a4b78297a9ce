"""Dataset layouts: how a dataset's tree becomes scan tasks, one module per layout. Pure (no Beam).

Each module exports ``NAME``, ``describe(root, io) -> str | None`` (detection: a phrase naming what
was found, from a few globs) and ``load_tasks(root, opts, io) -> Found``; ``LAYOUTS`` is the registry.
``FILES`` is no module: INPUT is a directory or glob of point-cloud files, listed by the scan itself.

``Dataset`` is one INPUT of a run (its name, root, layout and sampling weight); a run of several
INPUTs prefixes each sample_id with its dataset's name and records the datasets in the manifest.
"""

from __future__ import annotations

import importlib
import os
import posixpath
from dataclasses import dataclass
from types import ModuleType

from lidarshard.transforms.io import storage
from lidarshard.transforms.layouts.task import Found, LayoutIO, LayoutOptions

__all__ = [
    "LAYOUTS",
    "incomplete",
    "STORAGE_IO",
    "module",
    "FILES",
    "LAYOUT_NAMES",
    "Dataset",
    "detect",
    "describe",
    "load",
    "dataset_name",
]

#: The layout modules by name (``lidarshard.transforms.layouts.<name>``; imported when first used).
LAYOUTS: tuple[str, ...] = ("nuscenes", "av2", "semantickitti", "waymo_v2")
#: The file access layouts get in a run: ``lidarshard.transforms.io.storage`` (local paths and the object
#: stores it knows), before Beam and in the pipeline alike.
STORAGE_IO = LayoutIO(storage.read_bytes, storage.glob, storage.open_read)
#: INPUT as plain point-cloud files (a directory or a glob): no layout module.
FILES = "files"
LAYOUT_NAMES: tuple[str, ...] = (*LAYOUTS, FILES)


def module(layout: str) -> ModuleType:
    """The module of ``layout`` (one of ``LAYOUTS``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    return importlib.import_module(f"{__name__}.{layout}")


@dataclass(frozen=True)
class Dataset:
    """One INPUT of a run.

    Attributes:
        name: unique among the run's inputs; the prefix of its sample_ids when there are several.
        root: the INPUT (directory, glob or URI; local paths absolute).
        layout: one of ``LAYOUT_NAMES``.
        weight: expected copies per epoch of each of its samples (x any repeat factor), > 0.
    """

    name: str
    root: str
    layout: str
    weight: float = 1.0

    def to_json(self) -> dict:
        return {"name": self.name, "root": self.root, "layout": self.layout, "weight": self.weight}


def dataset_name(root: str) -> str:
    """The default name of an INPUT: its last path component (a glob's part before the wildcard)."""
    cut = min((root.find(c) for c in "*?[" if c in root), default=len(root))
    base = posixpath.basename(root[:cut].rstrip("/").replace("\\", "/"))
    return base or "input"


def describe(root: str, io: LayoutIO) -> dict[str, str]:
    """{layout name: what was found} for every layout ``root`` looks like (usually one, or none)."""
    found = {}
    for name in LAYOUTS:
        what = module(name).describe(root.rstrip("/"), io)
        if what:
            found[name] = what
    return found


def detect(root: str, io: LayoutIO) -> str:
    """The layout of ``root``: the one layout it looks like, else ``FILES``.

    Raises:
        ValueError: it looks like several (one line naming them: pass ``--dataset``).
    """
    found = describe(root, io)
    if len(found) > 1:
        what = "; ".join(f"{k}: {v}" for k, v in found.items())
        raise ValueError(f"{root} looks like several layouts ({what}): pass --dataset NAME")
    if not found:
        _refuse_a_layout_nearby(root.rstrip("/"), io)
    return next(iter(found), FILES)


#: Subfolders of an INPUT that detection looks into for a dataset one level down.
MAX_PROBED_SUBFOLDERS = 32


def _refuse_a_layout_nearby(root: str, io: LayoutIO) -> None:
    """Raise when ``root`` is no layout itself but plainly meant as one: a subfolder holds a known
    layout, or it has nuScenes' ``samples/``/``sweeps/`` folders without the tables that pair them.
    Read as loose files it would give other samples than the user expects; ``--dataset files`` says
    that is what is wanted."""
    loose = "or pass --dataset files to read every point-cloud file below it as one sample"
    nuscenes = _nuscenes_files(root, io)
    if nuscenes:
        raise ValueError(
            f"{root} has nuScenes {' and '.join(nuscenes)} files but no tables (<version>/sample_data.json) "
            f"to pair keyframes with their sweeps: add the tables, {loose}"
        )
    lacking = incomplete(root, io)
    if lacking:
        raise ValueError(f"{root} {lacking}")
    above = _dataset_above(root, io)
    if above is not None:
        where, what = above
        raise ValueError(f"{root} is part of the dataset at {where} ({what}): pass {where} as INPUT, {loose}")
    for sub in _subfolders(root):
        if describe(sub, io):
            raise ValueError(
                f"{root} holds no dataset itself, but {sub} holds one: pass {sub} as INPUT, {loose}"
            )
    if not storage.is_local(root):  # no folder listing: the layouts' own globs, one level deeper
        below = describe(f"{root}/*", io)
        if below:
            what = "; ".join(below.values())
            raise ValueError(
                f"{root} holds no dataset itself, but a folder in it holds {what}: pass that folder, {loose}"
            )


def incomplete(root: str, io: LayoutIO) -> str | None:
    """What ``root`` lacks to be read as a layout it partly is (a layout's ``incomplete`` hook), else None."""
    for name in LAYOUTS:
        lacking = getattr(module(name), "incomplete", None)
        said = lacking(root.rstrip("/"), io) if lacking is not None else None
        if said:
            return said
    return None


#: Levels above an INPUT that detection looks at for the dataset it is part of (nuScenes
#: ``samples/LIDAR_TOP``, AV2 ``<log>/sensors/lidar``: 2).
MAX_PROBED_LEVELS_UP = 2
#: The first folder below a layout's root that a user may point at by mistake, per layout (None: any).
_PARTS: dict[str, tuple[str, ...] | None] = {
    "nuscenes": ("samples", "sweeps", "lidarseg"),
    "av2": ("sensors",),
    "semantickitti": ("velodyne", "labels"),
    "waymo_v2": None,  # a split folder holds only its components
}


def _nuscenes_files(root: str, io: LayoutIO) -> list[str]:
    return [p for p in ("samples/LIDAR_TOP", "sweeps/LIDAR_TOP") if io.glob(f"{root}/{p}/*")]


def _dataset_above(root: str, io: LayoutIO) -> tuple[str, str] | None:
    """(the folder, what it holds) of a dataset ``root`` lies inside, one or two levels up, when ``root``
    is one of its parts (``samples/``, ``sensors/lidar``, ``velodyne/``...), else None."""
    path = root
    for _ in range(MAX_PROBED_LEVELS_UP):
        parent = _parent(path)
        if parent is None:
            return None
        part = root[len(parent) + 1 :].split("/", 1)[0]
        for name, what in describe(parent, io).items():
            parts = _PARTS[name]
            if parts is None or part in parts:
                return parent, what
        nuscenes = _nuscenes_files(parent, io)
        if nuscenes and part in ("samples", "sweeps"):
            return (
                parent,
                f"nuScenes {' and '.join(nuscenes)}; it needs its tables <version>/sample_data.json",
            )
        path = parent
    return None


def _parent(path: str) -> str | None:
    """The folder holding ``path``; None at a filesystem root or a bucket."""
    head, _, tail = path.rstrip("/").rpartition("/")
    if not tail or not head or head.endswith(":/") or "*" in path:
        return None
    return head


def _subfolders(root: str) -> list[str]:
    """The first ``MAX_PROBED_SUBFOLDERS`` subfolders of a local ``root``, sorted (none for a URI)."""
    if not storage.is_local(root) or "*" in root:
        return []
    try:
        names = sorted(e.name for e in os.scandir(storage.local_path(root)) if e.is_dir())
    except OSError:
        return []
    return [f"{root}/{name}" for name in names[:MAX_PROBED_SUBFOLDERS]]


def load(layout: str, root: str, opts: LayoutOptions, io: LayoutIO) -> Found:
    """``layout``'s tasks of ``root`` (not ``FILES``, which the scan lists itself)."""
    return module(layout).load_tasks(root.rstrip("/"), opts, io)
