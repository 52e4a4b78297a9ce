"""The one reader of an output directory's metadata files: ``_manifest.json`` into the typed ``Manifest``,
``_scan.json`` into the typed ``ScanRecord``. Every consumer (loaders, validate, report, calibrate, the
API, the re-plan, ``--from-samples``, a publish deciding what it may replace) reads them here; the
contract (``lidarshard.schemas``) types them, this module only finds and parses the bytes.
"""

from __future__ import annotations

import os
from typing import Any

from lidarshard.schemas import MANIFEST_FILE, SCAN_FILE, SUCCESS_FILE, check_version
from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.scan_record import ScanRecord
from lidarshard.transforms.io import storage

__all__ = ["read_object", "load_manifest", "load_scan", "previous_record", "PathLike"]

PathLike = str | os.PathLike[str]


def read_object(path: str, what: str, max_bytes: int = storage.METADATA_MAX_BYTES) -> dict[str, Any]:
    """The JSON object in the metadata file ``path`` (at most ``max_bytes`` read; ``what`` names it).

    Raises:
        OSError: it cannot be read (``FileTooLargeError`` over ``max_bytes``).
        ValueError: not JSON (bounded nesting and integers), or not an object.
    """
    obj = storage.read_json(path, max_bytes, what=what)
    if not isinstance(obj, dict):
        raise ValueError(f"{what} is not a JSON object")
    return obj


def load_manifest(out_dir: PathLike, *, committed: bool = True, where: str | None = None) -> Manifest:
    """The checked ``_manifest.json`` of the manifest directory ``out_dir``.

    Args:
        committed: require ``_SUCCESS`` and plan numbers that can describe a real plan
            (``Manifest.bounds_problem``, checked before any recorded number sizes a read); ``validate``
            passes False and compares every number with the files themselves.
        where: how messages name the file (default ``OUT/_manifest.json``).

    Raises:
        FileNotFoundError: ``committed`` and ``_SUCCESS`` is missing.
        ValueError: the schema major version is not this lidarshard's (one line naming it and the rebuild
            command), a key is missing or malformed (named), or the plan numbers are impossible.
    """
    base = os.fspath(out_dir)
    if committed and not storage.exists(storage.join(base, SUCCESS_FILE)):
        raise FileNotFoundError(
            f"{base} is not a committed lidarshard manifest: {SUCCESS_FILE} is missing "
            "(the build did not finish, or this is not a manifest directory)"
        )
    where = where or f"{base.rstrip('/')}/{MANIFEST_FILE}"
    raw = read_object(storage.join(base, MANIFEST_FILE), where)
    check_version(raw.get("schema_version", ""), base.rstrip("/") or "/", raw)
    manifest = Manifest.from_json(raw, where)
    problem = manifest.bounds_problem() if committed else None
    if problem:
        raise ValueError(f"{problem}; refusing to read it (rebuild the manifest)")
    return manifest


def load_scan(out_dir: PathLike, *, where: str | None = None) -> ScanRecord:
    """The checked ``_scan.json`` of the scan directory ``out_dir`` (``where``: how messages name it).

    Raises:
        OSError: it cannot be read. ValueError: another schema major version, or a malformed key (named).
    """
    base = os.fspath(out_dir)
    where = where or f"{base.rstrip('/')}/{SCAN_FILE}"
    raw = read_object(storage.join(base, SCAN_FILE), where)
    check_version(raw.get("schema_version", ""), base.rstrip("/") or "/", raw)
    return ScanRecord.from_json(raw, where)


def previous_record(directory: str) -> ScanRecord | None:
    """What the run that wrote ``directory`` recorded of its scan (its ``_manifest.json``, else its
    ``_scan.json``), or None when it holds neither (samples copied out of their run). Of any schema
    version: ``build --from-samples`` rebuilds a 3.x output from here.

    Raises:
        OSError, ValueError: the file is there but cannot be read or is malformed (one line).
    """
    for name in (MANIFEST_FILE, SCAN_FILE):
        path = storage.join(directory, name)
        if storage.exists(path):
            return ScanRecord.from_json(read_object(path, path), path)  # any version: 3.x rebuilds from here
    return None
