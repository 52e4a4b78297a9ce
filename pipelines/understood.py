"""What a run understood, in plain words, from what it recorded (``_scan.json``, the manifest): each INPUT's
layout and sweeps, the counts with what the plan dropped or repeated, a warning before replacing a live OUT.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow.compute as pc

from lidarshard import schemas
from lidarshard.transforms.formats.labels import SEMANTICKITTI_LEARNING_MAP
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.parts import read_parts, samples_files
from lidarshard.transforms.layouts import FILES
from lidarshard.transforms.layouts.multisweep import NON_FINITE_RULE

__all__ = [
    "TITLES",
    "sweeps_of",
    "by_input",
    "input_lines",
    "points_line",
    "counts_line",
    "live_output",
    "warn_live",
]

#: What each layout reads, as a person would say it.
TITLES = {
    "nuscenes": "nuScenes dataroot",
    "av2": "Argoverse 2 sensor logs",
    "semantickitti": "SemanticKITTI sequences",
    "waymo_v2": "Waymo Open v2 components",
    FILES: "point-cloud files",
}
#: Where each layout's sweep chains start (a sample near it has fewer previous sweeps than asked).
_CHAIN_STARTS = {"nuscenes": "scene", "av2": "log", "semantickitti": "sequence", "waymo_v2": "segment"}


def sweeps_of(sweeps: int | Mapping[str, int] | None, name: str) -> int:
    """Previous sweeps of INPUT ``name``: ``sweeps`` is one count for every INPUT or {name: count} (else 0)."""
    if isinstance(sweeps, Mapping):
        return int(sweeps.get(name, 0))
    return int(sweeps or 0)


def by_input(out: str, meta: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """({INPUT: samples accepted}, {INPUT: of them with fewer sweeps than ``meta`` records}) of the published
    scan or manifest ``out`` (empty when its samples name no INPUT, e.g. a ``write_manifest`` table's)."""
    try:
        files = samples_files(storage.join(out, schemas.SAMPLES_DIR))
        table = read_parts(files, ["dataset", "num_sweeps"]) if files else None
    except (OSError, ValueError, KeyError):  # no samples folder, or samples of before the column
        return {}, {}
    if table is None or table["dataset"].null_count == len(table):
        return {}, {}
    counts = pc.value_counts(table["dataset"].drop_null()).to_pylist()
    short = {}
    for d in meta.get("datasets") or []:
        name = d.get("name", "")
        fewer = pc.less(table["num_sweeps"], sweeps_of(meta.get("sweeps"), name))
        short[name] = int(pc.sum(pc.and_kleene(pc.equal(table["dataset"], name), fewer)).as_py() or 0)
    return {c["values"]: c["counts"] for c in counts}, short


def input_lines(
    meta: Mapping[str, Any], accepted: Mapping[str, int] | None = None, short: Mapping[str, int] | None = None
) -> list[str]:
    """One line per INPUT of a run's metadata, with its ``accepted`` and ``short`` counts (``by_input``):
    ``INPUT nusc: nuScenes dataroot, tables v1.0-mini, keyframe + 9 previous sweeps (/data/nuscenes): 404
    samples accepted, 10 with fewer sweeps: their scene starts sooner``."""
    lines = []
    for d in meta.get("datasets") or []:
        layout = d.get("layout", FILES)
        what = TITLES.get(layout, layout) + (", one sample each" if layout == FILES else "")
        if layout == "nuscenes" and meta.get("nuscenes_version"):
            what += f", tables {meta['nuscenes_version']}"
        if layout != FILES:
            n = sweeps_of(meta.get("sweeps"), d.get("name", ""))
            what += f", keyframe + {n} previous sweep{'s' * (n != 1)}" if n else ", no sweeps"
        what += _labels(d.get("label_map"))
        weight = d.get("weight", 1.0)
        if weight != 1.0:
            what += f", weight {weight:g}"
        line = f"INPUT {d.get('name')}: {what} ({d.get('root')})"
        if accepted:  # empty: not known
            n = accepted.get(d.get("name"), 0)
            line += f": {n} sample{'s' * (n != 1)} accepted"
            fewer = (short or {}).get(d.get("name"), 0)
            if fewer:
                line += (
                    f", {fewer} with fewer sweeps: their {_CHAIN_STARTS.get(layout, 'scene')} starts sooner"
                )
        lines.append(line)
    return lines


def _labels(label_map: Mapping[str, int] | None) -> str:
    """Which learning_map turns the INPUT's raw label ids into classes (nothing without one)."""
    if not label_map:
        return ""
    classes = len(set(label_map.values()))
    if {int(k): v for k, v in label_map.items()} == SEMANTICKITTI_LEARNING_MAP:
        return f", labels mapped by the standard SemanticKITTI learning_map ({classes} classes)"
    return f", labels mapped by the learning_map of its semantic-kitti.yaml ({classes} classes)"


def points_line(meta: Mapping[str, Any]) -> str:
    """The rule for non-finite rows as a summary line (a ``--features stat`` scan reads no point)."""
    config = meta.get("scan_config")
    stat = isinstance(config, Mapping) and config.get("features") == "stat"
    return f"points: {NON_FINITE_RULE}" + (
        " (--features stat reads no point: its counts hold every row)" if stat else ""
    )


def counts_line(
    scanned: int, accepted: int, rejected: int, dropped: Sequence[int] = (), padded: Sequence[int] = ()
) -> str:
    """``scanned 3: accepted 3, rejected 0; 1 dropped to fill whole steps (--pad keeps them)`` (``dropped`` /
    ``padded``: per epoch)."""
    line = f"scanned {scanned}: accepted {accepted}, rejected {rejected}"
    if any(dropped):
        line += f"; {_per_epoch(dropped)} dropped to fill whole steps (--pad keeps them)"
    if any(padded):
        line += f"; {_per_epoch(padded)} repeated to fill the last step (--pad)"
    return line


def _per_epoch(values: Sequence[int]) -> str:  # "3", or "2-4 per epoch"
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi} per epoch"


def live_output(out: str) -> str | None:
    """The warning for an OUT holding a published manifest or scan (None: nothing published there)."""
    if not storage.exists(storage.join(out, schemas.SUCCESS_FILE)):
        return None
    return (
        f"OUT {out} holds a published manifest: this run replaces it atomically when it succeeds "
        "(a reader sees wholly the old or the new one, never a mix) and leaves it as it is when it fails"
    )


def warn_live(out: str, command: str) -> None:
    warning = live_output(out)
    if warning:
        print(f"lidarshard {command}: warning: {warning}", file=sys.stderr)
