"""From settled samples to the files of a manifest directory. Pure: every file goes through an
injected ``write(rel, data)``.

``lidarshard build`` calls these from its Beam steps (epochs in parallel, files on any Beam
filesystem); ``lidarshard.write_manifest`` calls them in one process. Same samples and options,
same bytes::

    samples, weights = repeat.sample_weights(samples, cfg.repeat, read)     # weights, if any
    checked = score_samples(samples, rejects, counts, model, cfg, write, weights=weights)
    files, stats = write_epoch(scored, epoch, cfg, write)                  # once per epoch
    manifest = manifest_json(meta, cfg, checked, files + checked["files"], stats)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.transforms.arrow import parquet_bytes, sha256_hex
from lidarshard.transforms.features.accounting import fingerprint
from lidarshard.transforms.features.buckets import resolve_weights
from lidarshard.transforms.features.cost import CostModel, sample_costs
from lidarshard.transforms.features.repeat import Weights, class_counts
from lidarshard.transforms.parts import PART_ROWS
from lidarshard.transforms.plan.caps import over_cap
from lidarshard.transforms.plan.epochs import (
    PlanConfig,
    bucket_info,
    epoch_pool,
    plan_tables,
    repeat_rates,
    score,
)

__all__ = [
    "Write",
    "PLAN_INPUT",
    "write_file",
    "reject_over_cap",
    "over_cap_rejects",
    "score_samples",
    "checked_meta",
    "repeat_info",
    "write_epoch",
    "manifest_json",
]

#: ``write(relative path, data)``: stores one file of the manifest directory being built.
Write = Callable[[str, bytes], None]

#: The columns of the scored samples an epoch's plan needs.
PLAN_INPUT = ["sample_id", "path", "sweep_paths", "cost", "bucket_id", "num_points", "weight"]


def write_file(write: Write, rel: str, data: bytes) -> dict:
    """Write one file; returns its ``files`` entry {path, bytes, sha256}."""
    write(rel, data)
    return {"path": rel, "bytes": len(data), "sha256": sha256_hex(data)}


def reject_over_cap(
    samples: pa.Table, rejects: pa.Table, model: CostModel, cfg: PlanConfig, costs: pa.Array | None = None
) -> tuple[pa.Table, pa.Table]:
    """Move the samples that alone exceed a cap to rejects (reason ``over_cap``)."""
    if not cfg.caps.active:
        return samples, rejects
    cost = sample_costs(samples, model) if costs is None else np.asarray(costs, dtype=np.float64)
    points = samples.column("num_points").to_numpy(zero_copy_only=False)
    paths = samples.column("path")
    keep, rejects = over_cap_rejects(
        cost, points, cfg, rejects, lambda rows: paths.take(pa.array(rows)).to_pylist()
    )
    return (samples if keep.all() else samples.filter(pa.array(keep))), rejects


def over_cap_rejects(
    cost: NDArray[np.float64],
    points: NDArray[np.int64],
    cfg: PlanConfig,
    rejects: pa.Table,
    paths_at: Callable[[NDArray[np.int64]], list[str]],
) -> tuple[NDArray[np.bool_], pa.Table]:
    """(keep mask (N,), ``rejects`` plus one ``over_cap`` row per sample that alone exceeds a cap, sorted);
    ``paths_at(rows)`` gives the stored paths of the rows (N,) ``cost`` and ``points`` describe."""
    keep = np.ones(len(cost), dtype=bool)
    if not cfg.caps.active:
        return keep, rejects
    details = over_cap(cost, points, cfg.caps)
    bad = np.flatnonzero([bool(d) for d in details])
    if bad.size:
        keep[bad] = False
        rows = {"path": paths_at(bad), "reason": ["over_cap"] * bad.size, "detail": [details[i] for i in bad]}
        rejects = pa.concat_tables([rejects, pa.Table.from_pydict(rows, schema=rejects.schema)])
        rejects = rejects.sort_by([(c, "ascending") for c in ("path", "reason", "detail")])
    return keep, rejects


def score_samples(
    samples: pa.Table,
    rejects: pa.Table,
    counts: dict,
    model: CostModel,
    cfg: PlanConfig,
    write: Write,
    costs: pa.Array | None = None,
    weights: Weights | None = None,
    part_rows: int = PART_ROWS,
) -> dict:
    """Score settled samples (sorted by sample_id), write them as samples parts of ``part_rows`` rows
    and rejects.parquet.

    Returns only small metadata (``files``, ``counts``, ``model``, ``buckets``, ``fingerprint``,
    ``pair_repeat_rate``, ``repeat``, the rows of each part ``part_rows``): the scored table is read back from the written file where
    needed. ``costs`` (N,) replaces the model's costs (``model.name == "given"``); ``weights`` are the
    samples' own weights (``repeat.sample_weights``), None: all 1.
    """
    if samples.num_rows == 0:
        raise ValueError(f"no sample was accepted ({counts}); nothing to plan")
    scored, edges = score(samples, model, cfg, costs, None if weights is None else weights.values)
    slices = [scored.slice(start, part_rows) for start in range(0, scored.num_rows, part_rows)]
    parts = [write_file(write, schemas.samples_part(k), parquet_bytes(t)) for k, t in enumerate(slices)]
    meta = checked_meta(
        parts, rejects, counts, model, cfg, write, scored, edges, fingerprint(samples), weights
    )
    return meta | {"part_rows": [t.num_rows for t in slices]}


def checked_meta(
    samples_files: list[dict],
    rejects: pa.Table,
    counts: dict,
    model: CostModel,
    cfg: PlanConfig,
    write: Write,
    scored: pa.Table,
    edges: NDArray[np.float64],
    inputs_fingerprint: str,
    weights: Weights | None,
) -> dict:
    """Write rejects.parquet; the metadata ``score_samples`` returns, for samples parts written
    elsewhere (``samples_files``: their ``files`` entries, if written yet). ``scored`` needs only ``cost``, ``bucket_id``,
    ``num_points`` and ``weight``."""
    return {
        "files": [*samples_files, write_file(write, schemas.REJECTS_FILE, parquet_bytes(rejects))],
        "counts": counts,
        "model": model.to_json(),
        "buckets": bucket_info(scored, edges, cfg),
        "fingerprint": inputs_fingerprint,
        "pair_repeat_rate": repeat_rates(scored, cfg),
        "repeat": repeat_info(scored, weights, cfg),
    }


def repeat_info(scored: pa.Table, weights: Weights | None, cfg: PlanConfig) -> dict | None:
    """The manifest's ``repeat`` object (None without sample weights): expected copies per epoch of
    the samples holding each lidarseg class (bucket weight x sample weight), and the copies each
    epoch's plan holds; a column's weights count all samples under ``'all'``."""
    if weights is None:
        return None
    ids = scored.column("bucket_id").to_numpy()
    n = scored.num_rows
    held = weights.presence if weights.presence is not None else np.ones((n, 1), dtype=bool)

    def named(totals: dict[str, float]) -> dict[str, float]:
        return totals if weights.presence is not None else {"all": totals.get("0", 0.0)}

    k = int(ids.max()) + 1 if n else 1
    expected = named(class_counts(held, weights.values * resolve_weights(cfg.weights, k)[ids]))
    realized = [
        named(class_counts(held, np.bincount(epoch_pool(ids, weights.values, e, cfg)[0], minlength=n)))
        for e in range(cfg.epochs)
    ]
    return {"mode": cfg.repeat.mode, "expected": expected, "realized": realized}


def write_epoch(scored: pa.Table, epoch: int, cfg: PlanConfig, write: Write) -> tuple[list[dict], dict]:
    """Plan one epoch and write its W rank files; returns (``files`` entries, epoch stats)."""
    tables, stats = plan_tables(scored, epoch, cfg)
    files = [write_file(write, schemas.plan_file(epoch, r), parquet_bytes(t)) for r, t in enumerate(tables)]
    return files, stats


def manifest_json(meta: dict, cfg: PlanConfig, checked: dict, files: list[dict], stats: list[dict]) -> dict:
    """The ``_manifest.json`` object: ``meta`` (provenance, ``path_root``) plus the plan's numbers and
    file hashes."""
    stats = sorted(stats, key=lambda s: s["epoch"])
    balance = [{k: v for k, v in s.items() if k not in ("planned", "dropped", "padded")} for s in stats]
    counts = dict(checked["counts"])
    for key in ("planned", "dropped", "padded"):
        counts[key] = [s[key] for s in stats]
    return meta | {
        "world_size": cfg.world_size,
        "batch_size": cfg.batch_size,
        "epochs": cfg.epochs,
        "seed": cfg.seed,
        "strategy": cfg.strategy,
        "policy": cfg.policy,
        "caps": cfg.caps.to_json(),
        "repeat": checked["repeat"],
        "cost_model": checked["model"],
        "buckets": checked["buckets"],
        "steps_per_epoch": [s["steps"] for s in stats],
        "counts": counts,
        "balance": balance,
        "pair_repeat_rate": checked["pair_repeat_rate"],
        "inputs_fingerprint": checked["fingerprint"],
        "files": {
            f["path"]: {"bytes": f["bytes"], "sha256": f["sha256"]}
            for f in sorted(files, key=lambda f: f["path"])
        },
        "plan_schema": schemas.schema_to_json(schemas.plan_schema()),
    }
