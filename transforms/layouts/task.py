"""What a dataset layout hands the scan: one ``ScanTask`` per sample. Pure (no Beam).

A layout module (``lidarshard.transforms.layouts.<name>``) turns a dataset root into tasks; the scan's
``featurize`` reads each task's files and computes its feature row, whatever layout produced it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["SweepRef", "ScanTask", "Reject", "LayoutIO", "LayoutOptions", "Found", "FRAMES_FORMAT"]

#: The samples' ``format`` of a sample whose files hold many frames (``ScanTask.frame`` set): Waymo v2
#: lidar rows, read by ``lidarshard.transforms.layouts.waymo_v2.read_frame``.
FRAMES_FORMAT = "waymo_v2"

#: ``(path or table record, reason, detail)``; ``reason`` from ``lidarshard.schemas.REJECT_REASONS``.
Reject = tuple[str, str, str]


@dataclass(frozen=True)
class SweepRef:
    """One previous sweep to aggregate into a keyframe.

    Attributes:
        path: full path/URI of the sweep's file.
        sensor_to_ref: 16 floats, row-major 4x4: sweep points' frame -> keyframe points' frame (m).
        time_lag_s: t_keyframe - t_sweep, seconds (> 0).
        frame: the sweep's row key inside a multi-frame file (Waymo v2: ``key.frame_timestamp_micros``);
            None when the file holds one sweep.
    """

    path: str
    sensor_to_ref: tuple[float, ...]
    time_lag_s: float
    frame: int | None = None


@dataclass(frozen=True)
class ScanTask:
    """One sample to scan.

    Attributes:
        sample_id: stable id (nuScenes sample token, ``<log>/<timestamp>``, a path relative to INPUT, ...).
        path: full path/URI of the keyframe's file.
        sweeps: up to N previous sweeps, newest first.
        label_path: the keyframe's per-point label file, or None.
        frame: the keyframe's row key inside a multi-frame file (see ``SweepRef.frame``), or None.
        dataset: the name of the INPUT it came from (set by the scan, not by layouts).
        format: the reader of its files (``formats.readers.FORMATS``) when the layout defines it
            whatever their names (nuScenes/Lyft lidar files: ``nuscenes_bin``); None: by extension.
    """

    sample_id: str
    path: str
    sweeps: tuple[SweepRef, ...]
    label_path: str | None
    frame: int | None = None
    dataset: str | None = None
    format: str | None = None


@dataclass(frozen=True)
class LayoutIO:
    """The file access a layout may use (``lidarshard.transforms.io.storage`` functions in the pipeline).

    Attributes:
        read_bytes: ``(path, limit)`` -> the whole file, never more than ``limit`` bytes (None: no cap);
            FileNotFoundError when absent, ``FileTooLargeError`` over the limit, OSError otherwise.
        glob: pattern (``*``, ``?``, ``[..]``; ``**`` spans folders) -> sorted full paths of files.
        open_read: path -> a seekable binary stream the caller closes (Parquet row groups).
    """

    read_bytes: Callable[[str, int | None], bytes]
    glob: Callable[[str], list[str]]
    open_read: Callable[[str], BinaryIO]


@dataclass(frozen=True)
class LayoutOptions:
    """What shapes a layout's tasks (recorded in ``_scan.json``).

    Attributes:
        sweeps: previous sweeps aggregated per sample (0: the keyframe alone).
        version: nuScenes table folder (``v1.0-trainval``); other layouts ignore it.
    """

    sweeps: int = 0
    version: str | None = None


@dataclass(frozen=True)
class Found:
    """A layout's tasks (sorted by sample_id, ids unique) and rejects (sorted), plus what the trainer
    needs to read the layout's labels: ``label_map`` {raw label id: class id} (SemanticKITTI's
    ``learning_map``), None when labels are used as stored."""

    tasks: list[ScanTask]
    rejects: list[Reject] = field(default_factory=list)
    label_map: dict[int, int] | None = None
