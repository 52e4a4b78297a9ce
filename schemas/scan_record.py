"""``_scan.json`` as one typed, checked, frozen record: what a scan recorded of its run.

A manifest records the same provenance (its scan's keys, then the plan), so :meth:`ScanRecord.from_json`
reads the scan part of either file: ``build --from-samples`` learns an earlier run's root, reject fraction
and datasets from whichever of the two sits beside its samples. Keys and their meaning:
``lidarshard.schemas.MANIFEST_KEYS``; keys not typed here are kept as written in ``provenance``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lidarshard.schemas.records import DatasetEntry, Reader, ScanCounts

__all__ = ["ScanRecord", "PROVENANCE_KEYS"]

#: The scan's keys a manifest keeps as written (``Manifest.provenance``) and what each holds; with the
#: fields of ``Manifest`` they make ``MANIFEST_KEYS``.
PROVENANCE_KEYS: dict[str, str] = {
    "created_by": "lidarshard version",
    "input": "INPUT as given (absolute for local paths); 'from_samples' when re-planned from earlier samples",
    "datasets": "[{'name', 'root', 'layout', 'weight', 'label_map'}]: the INPUTs scanned (4.1); label_map "
    "{raw label id: class id} (SemanticKITTI's learning_map) or null",
    "nuscenes_version": "tables version in tables mode, else null; 'sweeps': previous sweeps aggregated",
    "max_reject_fraction": "the --max-reject-fraction the scan ran with",
    "scan_config": "the feature options (voxel size, range, formats, limits); 'content_hash': the algorithm of "
    "the samples' *_crc32 columns (CONTENT_HASH), null under --features stat; 'close_points': the close-point "
    "rule the size features were computed under and the loaders apply",
    "part_rows": "int: rows of each samples part (--part-rows), which fixes where the parts are cut",
    "sample_schema": "the samples' fields as JSON (name, type, doc)",
}


@dataclass(frozen=True)
class ScanRecord:
    """The scan part of ``_scan.json`` or ``_manifest.json``, checked. ``where`` names the file in messages."""

    where: str
    schema_version: str
    counts: ScanCounts
    inputs_fingerprint: str
    datasets: tuple[DatasetEntry, ...] = ()
    #: ``--max-reject-fraction`` the run used (None: not recorded).
    max_reject_fraction: float | None = None
    #: ROOT relative sample paths resolve against (None: full paths; a scan stores full paths).
    path_root: str | None = None
    #: previous sweeps aggregated: N for every INPUT, or {INPUT name: N} (0 when not recorded).
    sweeps: int | Mapping[str, int] = 0
    #: the nuScenes tables version of a tables-mode scan (None otherwise).
    nuscenes_version: str | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: object, where: str = "_scan.json") -> ScanRecord:
        """Check and type a parsed ``_scan.json`` (or the scan part of a ``_manifest.json``).

        Raises:
            ValueError: one line naming the first missing or malformed key.
        """
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: not a JSON object")
        r = Reader(obj, where)
        return cls(
            where=where,
            schema_version=str(r.str_("schema_version")),
            counts=ScanCounts.parse(r.sub("counts")),
            inputs_fingerprint=str(r.str_("inputs_fingerprint")),
            datasets=DatasetEntry.parse_all(r),
            max_reject_fraction=r.number("max_reject_fraction", optional=True),
            path_root=r.str_("path_root", optional=True),
            sweeps=_sweeps(r),
            nuscenes_version=r.str_("nuscenes_version", optional=True),
            provenance=dict(obj),
        )


def _sweeps(r: Reader) -> int | dict[str, int]:
    """The recorded ``sweeps``: an int >= 0, or {INPUT name: int >= 0}; 0 when absent."""
    v = r.obj.get("sweeps", 0)
    if isinstance(v, dict):
        return {str(k): r.int_("sweeps", value=n) for k, n in v.items()}
    return r.int_("sweeps", value=v)
