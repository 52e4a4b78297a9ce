"""Test helper: rewrite an output of this lidarshard as an earlier schema version wrote it, to test that
an older output is refused in one line and rebuilds from its samples (``build --from-samples``)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from lidarshard import schemas

__all__ = ["as_written_by"]


def as_written_by(out: Path, version: str) -> Path:
    """Rewrite ``out`` (written by this lidarshard) in place as a ``version`` writer did: without the
    fields added later (``schemas.ADDED_IN``), plan files at that version's names (3.x: hive directories
    ``plan/epoch=E/rank=R``, no ``epoch``/``rank`` columns), every file's schema version and the
    manifest's sizes and sha256s recomputed. Returns ``out``."""
    meta = json.loads((out / schemas.MANIFEST_FILE).read_text())
    meta["schema_version"] = version
    meta["sample_schema"] = schemas.schema_to_json(schemas.sample_schema(version))
    meta["plan_schema"] = schemas.schema_to_json(schemas.plan_schema(version))
    files = {}
    for rel in sorted(meta["files"]):
        t = pq.read_table(out / rel)
        key, new = schemas.plan_key(rel), rel
        if rel.startswith(schemas.SAMPLES_DIR + "/"):
            t = t.select(schemas.scored_schema(version).names)
        elif key is not None:
            t = t.select(schemas.plan_schema(version).names)
            e, r = key
            new = f"{schemas.PLAN_DIR}/epoch={e}/rank={r}/part-00000.parquet" if version < "4" else rel
            (out / rel).unlink()
        (out / new).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t.replace_schema_metadata({"lidarshard.schema_version": version}), out / new)
        data = (out / new).read_bytes()
        files[new] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    meta["files"] = files
    for epoch_dir in (out / schemas.PLAN_DIR).glob("epoch-*"):
        shutil.rmtree(epoch_dir)  # emptied above
    (out / schemas.MANIFEST_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out
