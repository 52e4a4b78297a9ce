"""What a manifest directory records: each written file's ``files`` entry, and ``_manifest.json`` from
the build's numbers (``lidarshard.schemas.manifest.Manifest``). Pure: every file goes through an
injected ``write(rel, data)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lidarshard import schemas
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.io.arrow import sha256_hex

__all__ = ["Write", "write_file", "build_manifest", "Kept", "kept_from"]

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
        pair_repeat_rate: ``planner.epoch_repeat_rates`` of epochs 0 and 1 (None with one epoch).
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
            "plan_groups": cfg.groups_record(counts["accepted"]),
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


@dataclass(frozen=True)
class Kept:
    """What a re-plan (``build --replan-from E``) must keep of the manifest it continues: the samples
    (``inputs_fingerprint``) and the plan files of epochs ``< E``, byte for byte (their sha256)."""

    previous: str
    inputs_fingerprint: str
    files: tuple[tuple[str, str], ...]

    def problem(self, built: Manifest) -> str | None:
        """Why ``built`` does not continue the previous manifest (one line), or None."""
        if built.inputs_fingerprint != self.inputs_fingerprint:
            return (
                f"the re-plan accepted other samples than {self.previous} (inputs_fingerprint "
                f"{built.inputs_fingerprint[:12]} != {self.inputs_fingerprint[:12]}): the new cost model rejects "
                "samples the previous one planned; fix the cost model"
            )
        for rel, sha in self.files:
            entry = built.files.get(rel)
            if entry is None or entry.sha256 != sha:
                return (
                    f"{rel} of the re-plan differs from {self.previous}'s: the epochs before --replan-from cannot be "
                    "kept (were other plan flags given than the previous build's?)"
                )
        return None


def kept_from(previous: str, m: Manifest, epoch: int) -> Kept:
    """The ``Kept`` of a re-plan of manifest ``m`` (directory ``previous``) from ``epoch`` on."""
    files = tuple((rel, entry.sha256) for e in range(epoch) for rel, entry in m.epoch_files(e).items())
    return Kept(previous, m.inputs_fingerprint, files)
