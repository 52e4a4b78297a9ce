"""The calibration loop on a workload whose true cost is known (issue 27: the calibrated plan's true
linearity within 0.01 of the oracle plan's).

    python benchmarks/calibration_bench.py [--samples 4000] [--world-size 8] [--batch-size 2] [--noise 0.05]

A pool of samples with nuScenes-like sizes (10-sweep points lognormal around 270k, occupied voxels a
noisy 0.3-0.9 of a thousandth of them, so points and voxels rank samples differently), and two true
costs unlike the default voxel model: point-based (``1e-5 ms x points``) and attention-like
(``2e-4 ms x voxels^1.3``). For each:

1. build a manifest on the default cost model (voxels), ``lidarshard.write_manifest``;
2. "train" epoch 0 of it: every rank-step's time is the true cost of its samples x (1 + noise x N(0,1)),
   recorded through the recorder (``StepTimer.record``, the same files a run writes);
3. ``lidarshard calibrate`` from those files (step sums, no per-sample pass) -> ``linear:c0,a,b``;
4. re-plan the same samples on the fitted model (``build --from-samples ... --cost-model``), and on the
   true cost itself (the oracle: the cost column given to ``write_manifest``).

Prints, per workload, the TRUE linearity (noise-free true costs) of epoch 1 of each plan: random,
uncalibrated (voxels), calibrated, oracle; and calibrated - oracle.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

import lidarshard
from lidarshard.loaders.step_timer import StepTimer
from lidarshard.tools.calibrate import calibrate
from lidarshard.tools.report import read_plan
from lidarshard.transforms.plan.metrics import load_linearity

WORKLOADS = {
    "point-based": lambda points, voxels: 1e-5 * points,
    "attention-like": lambda points, voxels: 2e-4 * voxels**1.3,
}


def pool(n: int, seed: int = 0) -> pa.Table:
    """``n`` samples: ids, paths, points and voxels (counts that rank samples differently)."""
    rng = np.random.default_rng(seed)
    points = np.round(np.exp(rng.normal(np.log(270_000), 0.35, n))).astype(np.int64)
    voxels = np.round(points * rng.uniform(3e-4, 9e-4, n)).astype(np.int64)
    return pa.table(
        {
            "sample_id": [f"s{i:06d}" for i in range(n)],
            "path": [f"/data/s{i:06d}.bin" for i in range(n)],
            "num_points": points,
            "num_in_range": points,
            "occupied_voxels": voxels,
        }
    )


def true_linearity(out: str, epoch: int, truth: dict[str, float], world: int) -> float:
    """Linearity of ``epoch`` of ``out``'s plan on the true per-sample costs (noise-free)."""
    plan = read_plan(out).to_pydict()
    loads: dict[tuple[int, int], float] = {}
    for e, s, r, i in zip(plan["epoch"], plan["step"], plan["rank"], plan["sample_id"], strict=True):
        if e == epoch:
            loads[(s, r)] = loads.get((s, r), 0.0) + truth[i]
    steps = max(s for s, _ in loads) + 1
    grid = np.zeros((steps, world))
    for (s, r), v in loads.items():
        grid[s, r] = v
    return load_linearity(grid)


def record_epoch(out: str, timings: Path, cost: dict[str, float], noise: float, seed: int) -> None:
    """Epoch 0 of ``out`` "trained": each rank-step's true time x (1 + noise N(0,1)) through the recorder."""
    rng = np.random.default_rng([seed, 1])
    plan = read_plan(out).to_pydict()
    steps: dict[tuple[int, int], list[str]] = {}
    for e, s, r, i in zip(plan["epoch"], plan["step"], plan["rank"], plan["sample_id"], strict=True):
        if e == 0:
            steps.setdefault((r, s), []).append(i)
    world = max(r for r, _ in steps) + 1
    for rank in range(world):
        with StepTimer(str(timings), rank=rank, world_size=world, device="cpu") as timer:
            for (r, s), ids in sorted(steps.items()):
                if r == rank:
                    ms = sum(cost[i] for i in ids) * (1 + noise * rng.standard_normal())
                    timer.record(0, s, ids, max(ms, 0.0) / 1000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--noise", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    w, b = args.world_size, args.batch_size
    samples = pool(args.samples, args.seed)
    ids = samples.column("sample_id").to_pylist()
    points = samples.column("num_points").to_numpy().astype(np.float64)
    voxels = samples.column("occupied_voxels").to_numpy().astype(np.float64)
    plan_flags = {"epochs": 2, "seed": args.seed}
    print(f"{args.samples} samples, W={w}, B={b}, {args.noise:.0%} noise; TRUE linearity of epoch 1:")
    print(
        f"{'workload':<15} {'random':>7} {'voxels':>7} {'calibrated':>10} {'oracle':>7} {'cal-oracle':>10}  fit"
    )
    for name, fn in WORKLOADS.items():
        truth_ms = fn(points, voxels)
        truth = dict(zip(ids, truth_ms.tolist(), strict=True))
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            first = lidarshard.write_manifest(
                samples, str(t / "voxels"), w, b, cost_model="voxels", **plan_flags
            )
            record_epoch(str(t / "voxels"), t / "timings", truth, args.noise, args.seed)
            fit, source, _ = calibrate(str(t / "voxels"), str(t / "timings"))
            model = f"linear:{fit.c0!r},{fit.a!r},{fit.b!r},{fit.q!r}"
            lidarshard.build(
                None, str(t / "calibrated"), world_size=w, batch_size=b, runner="FnApiRunner",
                from_samples=str(t / "voxels" / "samples"), cost_model=model, **plan_flags,
            )  # fmt: skip
            oracle = samples.append_column("cost", pa.array(truth_ms))
            lidarshard.write_manifest(oracle, str(t / "oracle"), w, b, **plan_flags)
            lin = {k: true_linearity(str(t / k), 1, truth, w) for k in ("voxels", "calibrated", "oracle")}
            random = first["balance"][1]["random_linearity"]  # on voxels; the true-cost random below
            random_true = _random_true(str(t / "oracle"))
            held = source["held_out"]
            print(
                f"{name:<15} {random_true:>7.4f} {lin['voxels']:>7.4f} {lin['calibrated']:>10.4f} "
                f"{lin['oracle']:>7.4f} {lin['calibrated'] - lin['oracle']:>+10.4f}  {model} "
                f"(R^2 {fit.r2:.3f}, held-out {held.get('r2', float('nan')):.3f}; random on voxels {random:.4f})"
            )


def _random_true(oracle_out: str) -> float:
    """The random plan's linearity on the true costs: the oracle manifest's recorded baseline for epoch 1."""
    from lidarshard.loaders import load_manifest

    return float(load_manifest(oracle_out).balance[1].random_linearity)


if __name__ == "__main__":
    main()
