"""Writers of synthetic datasets in other layouts than nuScenes, behind one shape for the CLI.

``LAYOUT_WRITERS[name]`` is a ``Writer``: ``unit_files(seed, index, frames)`` yields every file of
unit ``index`` (an AV2 log, a SemanticKITTI sequence, a Waymo segment) as (path relative to the
output root, bytes), deterministic from its arguments, so units can be written in any order on
any worker; ``static_files(seed)`` yields the files shared by all units (SemanticKITTI's label
config). Each writer lives in its own module (``synth/av2_logs.py``, ``synth/kitti_sequences.py``,
``synth/waymo_segments.py``, whose docstrings give the trees written); all cast their lidars with
``synth/beams.py`` over the street scenes of ``synth/scene.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from lidarshard.transforms.synth import av2_logs as av2
from lidarshard.transforms.synth import kitti_sequences as semantickitti
from lidarshard.transforms.synth import waymo_segments as waymo_v2

__all__ = ["Writer", "LAYOUT_WRITERS"]

Files = Iterator[tuple[str, bytes]]


@dataclass(frozen=True)
class Writer:
    """One layout's writer.

    Attributes:
        name: the layout name (``--layout``).
        unit_files: ``(seed, index, frames) -> files`` of unit ``index`` with ``frames`` 10 Hz frames.
        static_files: ``(seed) -> files`` shared by all units.
        unit: what a unit is, for messages ("log", "sequence", "segment").
    """

    name: str
    unit_files: Callable[[int, int, int], Files]
    static_files: Callable[[int], Files]
    unit: str


LAYOUT_WRITERS: dict[str, Writer] = {
    av2.NAME: Writer(av2.NAME, av2.unit_files, av2.static_files, "log"),
    semantickitti.NAME: Writer(
        semantickitti.NAME, semantickitti.unit_files, semantickitti.static_files, "sequence"
    ),
    waymo_v2.NAME: Writer(waymo_v2.NAME, waymo_v2.unit_files, waymo_v2.static_files, "segment"),
}
