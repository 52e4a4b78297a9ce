"""Test helper: write a valid lidarshard manifest directory straight from numpy arrays.

Follows the contract in ``schemas``: ``samples/part-00000.parquet``, ``rejects.parquet``,
``epoch-E/rank-R/part-00000.parquet``, ``_manifest.json``, and ``_SUCCESS`` written last. The plan
is made here by a tiny stand-in planner (not the pipeline's): ``balanced=True`` sorts the epoch's
pool by cost, cuts it into steps of ``world_size * batch_size`` similar samples and deals each step
to ranks longest-first; ``balanced=False`` deals a random permutation in order.

Also writes synthetic nuScenes-style clouds: float32 x5 (x, y, z, intensity, ring) ``.pcd.bin``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from lidarshard.schemas import (
    INTEGRITY_FIELDS,
    MANIFEST_FILE,
    REJECTS_FILE,
    SCHEMA_VERSION,
    SUCCESS_FILE,
    plan_file,
    plan_schema,
    reject_schema,
    samples_part,
    scored_schema,
)
from lidarshard.transforms.core.plan_writer import plan_rows
from lidarshard.transforms.plan import plan_epoch
from lidarshard.transforms.plan.metrics import rank_costs
from tests.helpers import balance_entry

__all__ = [
    "random_cloud",
    "write_clouds",
    "write_manifest",
    "write_plan_files",
    "make_fixture",
    "sweep_offset",
]


def random_cloud(n: int, rng: np.random.Generator) -> NDArray[np.float32]:
    """(n, 5) float32 points 2..50 m from the sensor (none near the origin), z in [-3, 5] m."""
    r = rng.uniform(2.0, 50.0, n)
    a = rng.uniform(-np.pi, np.pi, n)
    return np.stack(
        [r * np.cos(a), r * np.sin(a), rng.uniform(-3, 5, n), rng.uniform(0, 255, n), rng.integers(0, 32, n)],
        axis=1,
    ).astype(np.float32)


def sweep_offset(k: int) -> NDArray[np.float64]:
    """(4, 4) sweep k -> keyframe transform used by :func:`write_clouds`: a 0.5 m x-translation per sweep."""
    m = np.eye(4)
    m[0, 3] = 0.5 * (k + 1)
    return m


def write_clouds(
    root: Path, sizes: Sequence[int], *, sweeps: int = 0, sweep_size: int | None = None, seed: int = 0
) -> dict[str, list[Any]]:
    """Write one keyframe of ``sizes[i]`` points (plus ``sweeps`` sweep files) per sample under ``root``.

    Sweeps hold ``sweep_size`` points each (default: the keyframe's size). Returns per-sample columns:
    sample_id, path, sweep_paths, sweep_transforms (16 floats per sweep), num_points (keyframe + sweeps).
    """
    rng = np.random.default_rng(seed)
    (root / "samples").mkdir(parents=True, exist_ok=True)
    (root / "sweeps").mkdir(parents=True, exist_ok=True)
    cols: dict[str, list[Any]] = {k: [] for k in ("sample_id", "path", "sweep_paths", "sweep_transforms")}
    cols["num_points"] = []
    for i, n in enumerate(sizes):
        sid = f"s{i:05d}"
        path = root / "samples" / f"{sid}.pcd.bin"
        random_cloud(int(n), rng).tofile(path)
        sp, st, total = [], [], int(n)
        for k in range(sweeps):
            m = int(n if sweep_size is None else sweep_size)
            p = root / "sweeps" / f"{sid}_{k}.pcd.bin"
            random_cloud(m, rng).tofile(p)
            sp.append(str(p))
            st.extend(sweep_offset(k).ravel().tolist())
            total += m
        for key, val in zip(cols, (sid, str(path), sp, st, total), strict=True):
            cols[key].append(val)
    return cols


def _lpt(costs: NDArray[np.float64], world_size: int, batch_size: int) -> list[list[int]]:
    """Deal one step's W*B items to W ranks of B slots, longest first onto the least loaded rank."""
    loads, slots = np.zeros(world_size), [[] for _ in range(world_size)]
    for j in np.argsort(-costs, kind="stable"):
        open_ranks = [r for r in range(world_size) if len(slots[r]) < batch_size]
        r = min(open_ranks, key=lambda q: loads[q])
        slots[r].append(int(j))
        loads[r] += costs[j]
    return slots


def _linearity(rank_costs: NDArray[np.float64]) -> float:
    """Sum over steps of mean rank cost / sum of max rank cost; ``rank_costs`` is (steps, W)."""
    return float(rank_costs.mean(1).sum() / max(rank_costs.max(1).sum(), 1e-12))


def _plan_epoch(
    costs: NDArray[np.float64], world_size: int, batch_size: int, seed: int, epoch: int, balanced: bool
) -> NDArray[np.int64]:
    """(steps, W, B) sample indices for one epoch (drop_last)."""
    rng = np.random.default_rng([seed, epoch])
    per_step = world_size * batch_size
    steps = len(costs) // per_step
    pool = rng.permutation(len(costs))[: steps * per_step]
    if not balanced:
        return pool.reshape(steps, world_size, batch_size)
    pool = pool[np.argsort(costs[pool], kind="stable")].reshape(steps, per_step)
    pool = pool[rng.permutation(steps)]
    out = np.empty((steps, world_size, batch_size), dtype=np.int64)
    for s, items in enumerate(pool):
        for r, idx in enumerate(_lpt(costs[items], world_size, batch_size)):
            out[s, r] = items[idx]
    return out


def _scored_table(
    cols: dict[str, list[Any]], costs: NDArray[np.float64], n_buckets: int
) -> tuple[pa.Table, NDArray[np.float64]]:
    n = len(costs)
    edges = np.quantile(costs, np.linspace(0, 1, n_buckets + 1)[1:-1]) if n_buckets > 1 else np.array([])
    num_points = np.asarray(cols.get("num_points", costs), dtype=np.int64)
    defaults: dict[str, Any] = {
        "sweep_paths": [[] for _ in range(n)],
        "sweep_transforms": [[] for _ in range(n)],
        "label_path": [None] * n,
        "format": ["nuscenes_bin"] * n,
        "file_bytes": num_points * 20,
        "num_points": num_points,
        "num_finite": num_points,
        "num_in_range": num_points,
        "occupied_voxels": num_points // 4,
        "num_sweeps": [len(s) for s in cols.get("sweep_paths", [[]] * n)],
        "has_labels": [False] * n,
        "cost": costs,
        "bucket_id": np.searchsorted(edges, costs, side="right").astype(np.int32),
        "weight": np.ones(n),
    }
    schema = scored_schema()
    arrays = []
    for field in schema:
        if field.name in cols:
            arrays.append(pa.array(cols[field.name], type=field.type))
        elif field.name in defaults:
            arrays.append(pa.array(defaults[field.name], type=field.type))
        elif field.name in INTEGRITY_FIELDS:  # sizes and hashes not recorded: loaders read unchecked
            arrays.append(pa.nulls(n, field.type))
        elif field.name in ("dataset", "frame", "sweep_frames", "sweep_time_lags"):  # one dataset, no lags
            arrays.append(pa.nulls(n, field.type))
        else:  # spatial stats (float32 m): not needed by the loaders
            arrays.append(pa.array(np.zeros(n, np.float32), type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema), edges


def _sha(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_plan_files(out: Path, epoch: int, plan: NDArray[np.int64], columns: tuple) -> list[str]:
    """Rank files of epoch ``epoch``'s ``plan`` (S, W, M) of samples rows, from the samples' ``columns``
    (ids, paths, sweep paths, costs, bucket ids); returns their relative paths, rank order."""
    ids, paths, sweeps, cost, buckets = columns
    all_rows = plan_rows(plan)
    files = []
    for r in range(plan.shape[1]):
        mine = all_rows["rank"] == r
        idx = all_rows["row"][mine]
        rows = {
            "epoch": np.full(idx.size, epoch, np.int32),
            "rank": np.full(idx.size, r, np.int32),
            "step": all_rows["step"][mine],
            "slot": all_rows["slot"][mine],
            "sample_id": [ids[i] for i in idx],
            "path": [paths[i] for i in idx],
            "sweep_paths": [sweeps[i] for i in idx],
            "cost": cost[idx],
            "bucket_id": buckets[idx].astype(np.int32),
            "rank_count": all_rows["rank_count"][mine],
            "global_count": all_rows["global_count"][mine],
        }
        rel = plan_file(epoch, r)
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(rows, schema=plan_schema()), out / rel)
        files.append(rel)
    return files


def write_manifest(
    out: Path,
    cols: dict[str, list[Any]],
    *,
    world_size: int,
    batch_size: int,
    epochs: int,
    seed: int = 0,
    balanced: bool = True,
    costs: Sequence[float] | None = None,
    n_buckets: int = 4,
    budget: bool = False,
) -> Path:
    """Write a committed manifest for samples ``cols`` (``write_clouds``'s columns, or at least sample_id,
    path); ``costs`` default to num_points. Returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    n = len(cols["sample_id"])
    cost = np.asarray(costs if costs is not None else cols.get("num_points", np.ones(n)), dtype=np.float64)
    samples, edges = _scored_table(cols, cost, n_buckets)
    (out / samples_part(0)).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(samples, out / samples_part(0))
    pq.write_table(reject_schema().empty_table(), out / REJECTS_FILE)
    ids, paths = samples["sample_id"].to_pylist(), samples["path"].to_pylist()
    sweeps, buckets = samples["sweep_paths"].to_pylist(), samples["bucket_id"].to_numpy()
    files, steps_per_epoch, balance = [samples_part(0), REJECTS_FILE], [], []
    planned = []
    for e in range(epochs):
        if budget:  # the real variable-count planner over every sample
            plan = plan_epoch("budget", cost, world_size, batch_size, seed=seed, epoch=e)
        else:
            plan = _plan_epoch(cost, world_size, batch_size, seed, e, balanced)
        steps = plan.shape[0]
        steps_per_epoch.append(steps)
        planned.append(int((plan >= 0).sum()))
        random_plan = _plan_epoch(cost, world_size, batch_size, seed, e, False)
        balance.append(
            balance_entry(
                e,
                steps,
                batch_size,
                linearity=_linearity(rank_costs(plan, cost)),
                random_linearity=_linearity(cost[random_plan].sum(2)),
            )
        )
        files += write_plan_files(out, e, plan, (ids, paths, sweeps, cost, buckets))
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "created_by": "tests/manifest_fixture.py",
        "world_size": world_size,
        "batch_size": batch_size,
        "epochs": epochs,
        "seed": seed,
        "strategy": "budget" if budget else "fixture_sorted_lpt" if balanced else "fixture_random",
        "cost_model": {"name": "points", "a": 1.0},
        "buckets": {
            "edges": edges.tolist(),
            "weights": [1.0] * (len(edges) + 1),
            "counts": np.bincount(buckets, minlength=len(edges) + 1).tolist(),
        },
        "policy": "drop_last",
        "steps_per_epoch": steps_per_epoch,
        "counts": {
            "scanned": n,
            "accepted": n,
            "rejected": 0,
            "planned": planned,
            "dropped": [n - p for p in planned],
            "padded": [0] * epochs,
        },
        "balance": balance,
        "inputs_fingerprint": hashlib.sha256(json.dumps(sorted(ids)).encode()).hexdigest(),
        "options": {"fixture": True},
        "files": {rel: _sha(out / rel) for rel in files},
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    (out / SUCCESS_FILE).write_text("")
    return out


def make_fixture(
    tmp: Path,
    sizes: Sequence[int],
    *,
    world_size: int = 2,
    batch_size: int = 2,
    epochs: int = 2,
    sweeps: int = 0,
    sweep_size: int | None = None,
    seed: int = 0,
    balanced: bool = True,
    budget: bool = False,
) -> Path:
    """Clouds under ``tmp/data`` and a committed manifest at ``tmp/out``; returns the manifest dir.
    ``budget=True`` plans with the real ``budget`` strategy (variable counts per rank-step)."""
    cols = write_clouds(tmp / "data", sizes, sweeps=sweeps, sweep_size=sweep_size, seed=seed)
    return write_manifest(
        tmp / "out",
        cols,
        world_size=world_size,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        balanced=balanced,
        budget=budget,
    )
