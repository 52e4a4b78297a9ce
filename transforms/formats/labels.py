"""Per-point label files, decoded in one place for every layout (pure numpy; never imports ``apache_beam``).

Two layouts of label file exist, told apart by name (``label_format``):

* ``lidarseg``: nuScenes-lidarseg ``*_lidarseg.bin`` (and any other name): one uint8 class index per point,
  in the points file's order, used as stored.
* ``semantickitti``: SemanticKITTI ``*.label``: one little-endian uint32 per point; the lower 16 bits are the
  semantic id, the upper 16 the instance id (dropped here). Semantic ids are raw (0..259) and are mapped
  to training classes (0..19) through the dataset's ``learning_map``: a ``semantic-kitti.yaml`` beside the
  data (read with ``parse_learning_map``), else the standard one (``SEMANTICKITTI_LEARNING_MAP``, which the
  SemanticKITTI downloads do not ship). ``read_labels`` without a map returns the raw ids (they must fit
  uint8); the layout always gives labelled SemanticKITTI data a map.

Bad bytes never crash: a file that does not hold one record per point, or an id the map lacks, raises
``RejectError("label_mismatch", ...)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from lidarshard.schemas.jsonsafe import short
from lidarshard.transforms.errors import RejectError

__all__ = [
    "LABEL_FORMATS",
    "SEMANTICKITTI_LEARNING_MAP",
    "label_format",
    "read_labels",
    "decode_labels",
    "parse_learning_map",
]

#: Label file layouts ``read_labels`` decodes.
LABEL_FORMATS: tuple[str, ...] = ("lidarseg", "semantickitti")
_SEMANTIC_MASK = 0xFFFF
_MAX_RAW_ID = 0xFFFF
_MAX_CLASS = 0xFF
_RECORD_NAMES = {"lidarseg": "uint8", "semantickitti": "uint32"}
#: The standard SemanticKITTI ``learning_map``, {raw semantic id: training class 0..19}: the values of
#: ``config/semantic-kitti.yaml`` in PRBonn/semantic-kitti-api (MIT licence), the benchmark's 19 classes plus
#: 0 "unlabeled"; moving classes (252-259) map to their static class. Data, not code: checked against that
#: file in tests/test_semantickitti.py (realdata ``semantickitti_full/semantic-kitti.yaml``).
SEMANTICKITTI_LEARNING_MAP: dict[int, int] = {
    0: 0, 1: 0, 10: 1, 11: 2, 13: 5, 15: 3, 16: 5, 18: 4, 20: 5, 30: 6, 31: 7, 32: 8, 40: 9, 44: 10,
    48: 11, 49: 12, 50: 13, 51: 14, 52: 0, 60: 9, 70: 15, 71: 16, 72: 17, 80: 18, 81: 19, 99: 0,
    252: 1, 253: 7, 254: 6, 255: 8, 256: 5, 257: 5, 258: 4, 259: 5,
}  # fmt: skip
#: Ids named in a ``label_mismatch`` detail (the rest are counted).
_NAMED_IDS = 5


def label_format(path: str) -> str:
    """The layout of the label file at ``path``, by name: ``.label`` -> ``"semantickitti"``, else ``"lidarseg"``."""
    return "semantickitti" if path.lower().endswith(".label") else "lidarseg"


def read_labels(
    data: bytes, fmt: str, num_points: int, label_map: Mapping[int, int] | None = None
) -> NDArray[np.uint8]:
    """Decode one label file into one class id per point, checking it holds one record per point.

    Args:
        data: the whole label file.
        fmt: one of ``LABEL_FORMATS`` (``label_format(path)``).
        num_points: points in the matching points file (the keyframe, before any filtering).
        label_map: {raw semantic id: class id} applied to ``semantickitti`` ids (``learning_map``); None
            keeps the raw ids. Ignored for ``lidarseg``, whose bytes are already class ids.

    Returns:
        (num_points,) uint8 class ids, in the points file's order (a new, writable array).

    Raises:
        RejectError: ``label_mismatch`` when the file is not a whole number of records, holds another
            number of records than ``num_points``, or holds a semantic id the map lacks (or, without a
            map, one above 255).
        ValueError: an unknown ``fmt`` or a negative ``num_points`` (a caller bug, not bad input).
    """
    size = _record_bytes(fmt)
    if isinstance(num_points, bool) or not isinstance(num_points, int | np.integer) or num_points < 0:
        raise ValueError(f"num_points must be an int >= 0, got {num_points!r}")
    kind = _RECORD_NAMES[fmt]
    if len(data) % size:
        raise RejectError(
            "label_mismatch",
            f"label file of {len(data)} bytes is not a whole number of {kind} labels ({size} bytes each) "
            f"but the keyframe has {num_points} points",
        )
    if len(data) // size != num_points:
        raise RejectError(
            "label_mismatch",
            f"label file holds {len(data) // size} {kind} labels but the keyframe has {num_points} points",
        )
    return decode_labels(data, fmt, label_map)


def decode_labels(data: bytes, fmt: str, label_map: Mapping[int, int] | None = None) -> NDArray[np.uint8]:
    """Decode one label file into class ids without a point count to check against (the scan checked it:
    ``read_labels``); for readers of labels already accepted, such as the repeat-factor presence.

    Returns:
        (records,) uint8 class ids (a new, writable array).

    Raises:
        RejectError: ``label_mismatch`` for a partial record or a semantic id the map lacks (see
            ``read_labels``).
        ValueError: an unknown ``fmt``.
    """
    size = _record_bytes(fmt)
    if len(data) % size:
        raise RejectError(
            "label_mismatch",
            f"label file of {len(data)} bytes is not a whole number of {_RECORD_NAMES[fmt]} labels ({size} bytes each)",
        )
    if fmt == "lidarseg":
        return np.frombuffer(data, np.uint8).copy()
    semantic = (np.frombuffer(data, "<u4") & _SEMANTIC_MASK).astype(np.uint16)
    if label_map is None:
        over = semantic > _MAX_CLASS
        if over.any():
            raise RejectError(
                "label_mismatch",
                f"semantic {_ids(semantic[over])} above 255 with no learning_map to map it to a class",
            )
        return semantic.astype(np.uint8)
    lut = _lookup(tuple(sorted(label_map.items())))
    mapped = lut[semantic]
    unknown = mapped < 0
    if unknown.any():
        raise RejectError(
            "label_mismatch",
            f"semantic {_ids(semantic[unknown])} not in the learning_map ({int(unknown.sum())} points)",
        )
    return mapped.astype(np.uint8)


def _record_bytes(fmt: str) -> int:
    """Bytes per point of a label file of layout ``fmt``; ValueError for an unknown one."""
    if fmt not in LABEL_FORMATS:
        raise ValueError(f"label format {fmt!r} is not one of {', '.join(LABEL_FORMATS)}")
    return 1 if fmt == "lidarseg" else 4


def _ids(values: NDArray[np.uint16]) -> str:
    """``"id 300"`` / ``"ids 300, 301 and 2 more"`` for the distinct ``values``."""
    distinct = np.unique(values).tolist()
    named = ", ".join(str(v) for v in distinct[:_NAMED_IDS])
    more = f" and {len(distinct) - _NAMED_IDS} more" if len(distinct) > _NAMED_IDS else ""
    return f"{'id' if len(distinct) == 1 else 'ids'} {named}{more}"


@lru_cache(maxsize=8)
def _lookup(items: tuple[tuple[int, int], ...]) -> NDArray[np.int16]:
    """(65536,) int16 read-only table: raw semantic id -> class id, -1 where the map has none."""
    lut = np.full(_MAX_RAW_ID + 1, -1, np.int16)
    for raw, cls in items:
        if not (0 <= raw <= _MAX_RAW_ID and 0 <= cls <= _MAX_CLASS):
            raise ValueError(f"label_map entry {raw}: {cls} is outside 0..{_MAX_RAW_ID}: 0..{_MAX_CLASS}")
        lut[raw] = cls
    lut.flags.writeable = False
    return lut


def parse_learning_map(text: bytes) -> dict[int, int]:
    """The ``learning_map`` of a SemanticKITTI label config (``semantic-kitti.yaml``).

    Args:
        text: the YAML file's bytes.

    Returns:
        {raw semantic id (0..65535): class id (0..255)}.

    Raises:
        ValueError: not YAML, no ``learning_map`` mapping, or a key/value that is not an int in range
            (one line).
        ImportError: PyYAML is not installed (it comes with the ``pipeline`` extra).
    """
    try:  # imported by name: PyYAML ships no type stubs
        yaml = importlib.import_module("yaml")
    except ImportError as err:  # pragma: no cover - PyYAML comes with apache-beam
        raise ImportError("reading a learning_map needs PyYAML: pip install 'lidarshard[pipeline]'") from err
    try:
        doc = yaml.load(text, Loader=_loader(yaml))  # noqa: S506 - a SafeLoader without aliases, depth-bounded
    except yaml.YAMLError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"label config is not valid YAML: {first}") from None
    if not isinstance(doc, dict) or "learning_map" not in doc:
        raise ValueError("label config has no learning_map (a semantic-kitti.yaml holds one)")
    raw_map = doc["learning_map"]
    if not isinstance(raw_map, dict) or not raw_map:
        raise ValueError("label config's learning_map is not a non-empty mapping of raw id: class id")
    out: dict[int, int] = {}
    for raw, cls in raw_map.items():
        if not _int_in(raw, _MAX_RAW_ID) or not _int_in(cls, _MAX_CLASS):
            raise ValueError(
                f"label config's learning_map entry {short(raw)}: {short(cls)} is not "
                f"int 0..{_MAX_RAW_ID}: int 0..{_MAX_CLASS}"
            )
        out[raw] = cls
    return dict(sorted(out.items()))


#: How deep a label config may nest (semantic-kitti.yaml nests 2 levels).
MAX_YAML_DEPTH = 16


def _loader(yaml: Any) -> type:
    """PyYAML's ``SafeLoader`` refusing aliases (``*ref``: a few hundred bytes of them expand to
    gigabytes once formatted or copied) and nesting deeper than ``MAX_YAML_DEPTH`` (the parser
    recurses), each as a one-line ``YAMLError``."""

    class StrictLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("aliases (*name) are not allowed in a label config")
            if self.depth >= MAX_YAML_DEPTH:
                raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels")
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return StrictLoader


def _int_in(value: object, high: int) -> bool:
    """True when ``value`` is an int (not a bool) in ``0..high``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high
