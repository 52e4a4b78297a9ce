"""What a manifest directory records: each written file's ``files`` entry, and ``_manifest.json`` from
the build's numbers (``lidarshard.schemas.manifest.Manifest``). Pure: every file goes through an
injected ``write(rel, data)``.
"""

from __future__ import annotations

from collections.abc import Callable

from lidarshard import schemas
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.arrow import sha256_hex
from lidarshard.transforms.plan.epochs import PlanConfig

__all__ = ["Write", "write_file", "build_manifest"]

#: ``write(relative path, data)``: stores one file of the manifest directory being built.
Write = Callable[[str, bytes], None]


def write_file(write: Write, rel: str, data: bytes) -> dict:
    """Write one file; returns its ``files`` entry {path, bytes, sha256}."""
    write(rel, data)
    return {"path": rel, "bytes": len(data), "sha256": sha256_hex(data)}


def build_manifest(
    meta: dict,
    cfg: PlanConfig,
    scored: dict,
    files: list[dict],
    stats: list[dict],
    pair_repeat_rate: dict[str, float] | None,
) -> Manifest:
    """The build's ``_manifest.json`` as a checked ``Manifest``.

    Args:
        meta: provenance (``schema_version``, ``created_by``, ``input``, ..., ``path_root``).
        scored: ``score.settle_and_score``'s metadata (counts, model, buckets, fingerprint, repeat).
        files: every written file's ``write_file`` entry.
        stats: each epoch's ``EpochPlan.stats`` (any order).
        pair_repeat_rate: ``epochs.repeat_rates`` of epochs 0 and 1 (None with one epoch).
    """
    stats = sorted(stats, key=lambda s: s["epoch"])
    balance = [{k: v for k, v in s.items() if k not in ("planned", "dropped", "padded")} for s in stats]
    counts = dict(scored["counts"])
    for key in ("planned", "dropped", "padded"):
        counts[key] = [s[key] for s in stats]
    plan = {k: v for k, v in cfg.to_json().items() if k != "max_plan_factor"}
    obj = (
        meta
        | plan
        | {
            "max_plan_factor": cfg.max_plan_factor,
            "repeat": scored["repeat"],
            "cost_model": scored["model"],
            "buckets": scored["buckets"],
            "steps_per_epoch": [s["steps"] for s in stats],
            "counts": counts,
            "balance": balance,
            "pair_repeat_rate": pair_repeat_rate,
            "inputs_fingerprint": scored["fingerprint"],
            "files": {f["path"]: {"bytes": f["bytes"], "sha256": f["sha256"]} for f in files},
            "plan_schema": schemas.schema_to_json(schemas.plan_schema()),
        }
    )
    return Manifest.from_json(obj, schemas.MANIFEST_FILE)
