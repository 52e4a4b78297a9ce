"""Helpers shared by the tests: the one module test modules import from each other
(fixtures live in ``conftest.py``)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.typing import NDArray

from lidarshard import schemas

REPO = Path(__file__).resolve().parents[1]
#: The repository folders that install as the one ``lidarshard`` package.
PACKAGES = ("lidarshard", "pipelines", "transforms", "schemas", "loaders", "tools")

#: Beam flags the tests' builds pass: an explicit runner, never the Prism download; and no construction-time
#: type check, ~0.45 of a small build's ~2.2 CPU-s (apache-beam 2.77 re-parses every option for each of
#: its ~400 consistency checks). The builds that keep Beam's defaults still check the typed graph and run
#: its inferred coders in the fast lane: the API's (``runner="FnApiRunner"``: test_api, test_one_path,
#: test_layouts, ...), the README's (test_docs), every runner's (test_runners) and ``make demo``.
BEAM_TEST_FLAGS = ["--runner=FnApiRunner", "--no_pipeline_type_check"]

IDENTITY_Q = [1.0, 0.0, 0.0, 0.0]


def slow_after(keep: int, values: list) -> list:
    """``values`` for ``parametrize`` with all but the first ``keep`` in the slow lane: the fast lane runs
    the end-to-end path once (or ``keep`` times), ``make test-slow`` runs every case."""
    return [v if i < keep else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
            for i, v in enumerate(values)]  # fmt: skip


def one_scene_samples(sample_data: list) -> list[dict]:
    """``sample.json`` rows for every sample token that ``sample_data`` rows name, all in one scene
    (tables whose sweeps are followed need the keyframe's scene, ``sample.scene_token``); tokens over
    4096 characters are left out (their rows are refused on their length before any lookup)."""
    tokens = {r.get("sample_token") for r in sample_data if isinstance(r, dict)}
    kept = sorted(t for t in tokens if isinstance(t, str) and len(t) <= 4096)
    return [{"token": t, "scene_token": "scene-0"} for t in kept]


def yaw_q(theta: float) -> list[float]:
    return [math.cos(theta / 2), 0.0, 0.0, math.sin(theta / 2)]


def yaw_tf(theta: float, t: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """Independent 4x4 (cos/sin, no quaternion) for a yaw about z then a translation."""
    c, s = math.cos(theta), math.sin(theta)
    tf = np.eye(4)
    tf[:2, :2] = [[c, -s], [s, c]]
    tf[:3, 3] = t
    return tf


def build_bins_manifest(tmp: Path, n: int, world_size: int, batch_size: int, epochs: int = 2) -> Path:
    """``lidarshard build`` of ``make_bins(tmp / "in", n)`` (one bad file) into ``tmp / "out"``."""
    from lidarshard.pipelines.cli import main

    out = tmp / "out"
    args = [str(make_bins(tmp / "in", n=n)), str(out), "--world-size", str(world_size)]
    args += ["--batch-size", str(batch_size), "--epochs", str(epochs), "--max-reject-fraction", "0.1"]
    assert main(["build", *args, *BEAM_TEST_FLAGS]) == 0
    return out


def make_bins(root: Path, n: int = 61, seed: int = 0) -> Path:
    """``n`` KITTI-style .bin clouds with lognormal point counts (one of them bad)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i, count in enumerate(np.exp(rng.normal(7.0, 0.6, size=n)).astype(int) + 10):
        rng.normal(scale=20.0, size=(count, 4)).astype(np.float32).tofile(root / f"{i:04d}.bin")
    (root / "bad.bin").write_bytes(b"\0" * 7)
    return root


def scored_pool(n: int, seed: int) -> pa.Table:
    """``n`` scored rows (ids, paths, 0-3 sweeps, lognormal costs, 3 buckets, points, weights 0..2.3)."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "sample_id": [f"s{i:06d}" for i in range(n)],
            "path": [f"scenes/{i}.bin" for i in range(n)],
            "sweep_paths": [[f"sweeps/{i}_{j}.bin" for j in range(i % 4)] for i in range(n)],
            "cost": rng.lognormal(0.0, 1.0, n),
            "bucket_id": pa.array(rng.integers(0, 3, n), pa.int32()),
            "num_points": rng.integers(1, 1000, n),
            "weight": rng.choice([0.0, 0.5, 1.0, 1.0, 2.3], n),
        }
    )


def write_samples(samples: Path, table: pa.Table) -> Path:
    """Replace the samples directory ``samples`` with ``table`` as its one part; returns ``samples``."""
    shutil.rmtree(samples, ignore_errors=True)
    samples.mkdir(parents=True)
    pq.write_table(table, samples / "part-00000.parquet")
    return samples


def samples_table(ids: list[str], points: list[int] | NDArray, paths: list[str] | None = None) -> pa.Table:
    """A samples table (``schemas.sample_schema()``): the given ids and point counts, voxels a third
    of the points, no sweeps; paths ``/d/<id>.bin`` unless given."""
    n = len(ids)
    points = np.asarray(points, dtype=np.int64)
    cols = {
        "sample_id": ids,
        "path": paths or [f"/d/{s}.bin" for s in ids],
        "num_points": points,
        "num_in_range": points,
        "occupied_voxels": points // 3,
        "file_bytes": points * 16,
    }
    arrays = [
        pa.array(cols[f.name], f.type) if f.name in cols else pa.array([[]] * n, f.type)
        if pa.types.is_list(f.type) else pa.nulls(n, f.type)
        for f in schemas.sample_schema()
    ]  # fmt: skip
    return pa.Table.from_arrays(arrays, schema=schemas.sample_schema())


def mem_io(files: dict[str, bytes]):
    """``(read, size)`` over in-memory files ``{path: bytes}``, as the featurize step's readers take them."""

    def read(p: str, limit: int | None = None) -> bytes:
        return files[p]

    def size(p: str) -> int:
        if p not in files:
            raise FileNotFoundError(p)
        return len(files[p])

    return read, size


def balance_entry(epoch: int = 0, steps: int = 1, max_count: int = 1, **numbers: float) -> dict:
    """A complete manifest ``balance`` entry for hand-made manifests (``schemas.records.BalanceEntry``):
    ``numbers`` over 1.0 linearities, 0 spread and ``max_count`` samples a rank-step."""
    from lidarshard.schemas.balance_entry import BALANCE_NUMBERS

    values = dict.fromkeys(BALANCE_NUMBERS, 1.0) | {"spearman_step_cost": 0.0, "rank_total_cv": 0.0}
    return (
        {"epoch": epoch, "steps": steps, "max_count": max_count}
        | values
        | {"mean_count": float(max_count)}
        | numbers
    )


def record_plan_timings(
    out: Path, directory: Path, epochs: int, speeds: tuple[float, ...], overhead_s: float = 0.0
) -> None:
    """The recorder's files of training manifest ``out``'s first ``epochs`` epochs (``StepTimer.record``):
    a rank-step computes 1 us a point / the rank's speed (+3% noise, seed 0), its wall ``overhead_s`` more."""
    from lidarshard.loaders.timing import StepTimer

    s = pq.read_table(out / schemas.SAMPLES_DIR).to_pydict()
    points = dict(zip(s["sample_id"], s["num_in_range"], strict=True))
    rng = np.random.default_rng(0)
    for rank, speed in enumerate(speeds):
        with StepTimer(str(directory), rank=rank, world_size=len(speeds), device="cpu") as timer:
            for epoch in range(epochs):
                t = pq.read_table(out / schemas.plan_file(epoch, rank)).to_pydict()
                for step in sorted(set(t["step"])):
                    ids = [i for i, st in zip(t["sample_id"], t["step"], strict=True) if st == step]
                    own = 1e-6 * sum(points[i] for i in ids) / speed * (1 + 0.03 * rng.normal())
                    timer.record(epoch, step, ids, own, own + overhead_s)
