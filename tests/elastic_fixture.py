"""Test helper: a committed manifest planned by the real planner (``plan_samples``) with any strategy, fast.

``tests/manifest_fixture.py`` plans with a stand-in (its strategies are not registered, so nothing can
re-plan them); the elastic tests need the manifest's own strategy. This writer keeps that fixture's
samples table and file layout and plans every epoch with ``lidarshard.transforms.core.planner.plan_samples``,
the function the build calls: weighted pools (repeats), ``drop_last``/``pad`` and caps included.
No Beam, no point files (paths are placeholders; the samplers never open them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from lidarshard.schemas import (
    MANIFEST_FILE,
    REJECTS_FILE,
    SCHEMA_VERSION,
    SUCCESS_FILE,
    reject_schema,
    samples_part,
)
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import plan_samples
from lidarshard.transforms.plan.caps import Caps
from tests.manifest_fixture import _scored_table, _sha, write_plan_files

__all__ = ["plan_manifest"]


def plan_manifest(
    out: Path,
    costs: Any,
    *,
    world_size: int,
    batch_size: int,
    strategy: str = "mixed",
    epochs: int = 1,
    seed: int = 0,
    policy: str = "drop_last",
    weights: tuple[float, ...] | None = None,
    caps: Caps | None = None,
) -> Path:
    """Write a committed manifest of ``len(costs)`` samples at ``out``, planned with ``strategy``.

    ``weights``: per-bucket weights over 2 cost buckets (e.g. ``(1.0, 2.0)``: the heavier half planned
    about twice per epoch). Returns ``out``.
    """
    cost = np.asarray(costs, dtype=np.float64)
    n = cost.size
    ids = [f"s{i:05d}" for i in range(n)]
    cols = {
        "sample_id": ids,
        "path": [f"/data/{s}.bin" for s in ids],
        "num_points": cost.astype(np.int64) + 1,
    }
    samples, edges = _scored_table(cols, cost, 2 if weights else 4)
    out.mkdir(parents=True, exist_ok=True)
    (out / samples_part(0)).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(samples, out / samples_part(0))
    pq.write_table(reject_schema().empty_table(), out / REJECTS_FILE)
    cfg = PlanConfig(
        world_size, batch_size, epochs, seed, strategy, policy, weights=weights, caps=caps or Caps()
    )
    files, steps, balance, planned, dropped, padded = [samples_part(0), REJECTS_FILE], [], [], [], [], []
    paths, sweeps = samples["path"].to_pylist(), samples["sweep_paths"].to_pylist()
    buckets = samples["bucket_id"].to_numpy()
    for e in range(epochs):
        ep = plan_samples(samples, e, cfg)
        steps.append(int(ep.plan.shape[0]))
        balance.append({k: v for k, v in ep.stats.items() if k not in ("planned", "dropped", "padded")})
        planned.append(ep.stats["planned"])
        dropped.append(ep.stats["dropped"])
        padded.append(ep.stats["padded"])
        files += write_plan_files(out, e, ep.plan, (ids, paths, sweeps, cost, buckets))
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "created_by": "tests/elastic_fixture.py",
        **cfg.to_json(),
        "cost_model": {"name": "given"},
        "buckets": {
            "edges": edges.tolist(),
            "weights": list(weights) if weights else [1.0] * (len(edges) + 1),
            "counts": np.bincount(buckets, minlength=len(edges) + 1).tolist(),
        },
        "steps_per_epoch": steps,
        "counts": {
            "scanned": n,
            "accepted": n,
            "rejected": 0,
            "planned": planned,
            "dropped": dropped,
            "padded": padded,
        },
        "balance": balance,
        "inputs_fingerprint": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
        "files": {rel: _sha(out / rel) for rel in files},
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    (out / SUCCESS_FILE).write_text("")
    return out
