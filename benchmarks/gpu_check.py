"""The premise on one GPU: do the (step, rank) batches of real plans finish together, beside the noise floor?

    python benchmarks/gpu_check.py [--manifest OUT] [--size small,mink] [--batches 1,2,4] [--world 8]
        [--steps 6] [--backbone auto] [--json-out gpu.json]
    python benchmarks/gpu_check.py --smoke     # CPU, tiny (the test suite's run): 1 m voxels, 1 step

For each backbone size (``small``: ``examples/sparse_unet.py``'s UNet, widths 16-64, 3 levels, 0.1 m voxels;
``mink``: MinkUNet-sized, widths 32-256, 4 levels, 0.05 m) it

1. times every sample of the manifest alone (forward + backward, median of ``--repeats``) and records its
   peak device bytes (CUDA: ``torch.cuda.max_memory_allocated`` after a reset; none on a CPU);
2. for each B, plans ``--world`` virtual ranks with ``random``, the default, ``rebalance``, ``budget`` and
   ``auto`` on the manifest's costs and runs the batch of every (step, rank) of their first ``--steps``
   steps, one after another on the one device: measured linearity = sum of step means / sum of step maxima
   of those batch times (as if on W identical GPUs, no communication), beside the cost model's prediction;
   the noise floor runs one batch (``random``'s rank 0) on every rank of those steps;
3. fits the memory model (peak bytes ~ base + per point + per voxel, over every timed batch) and plans
   ``budget`` under ``--max-step-memory`` (default: the median batch peak x 1.25, at least the largest
   sample's predicted peak x 1.05), then runs that plan's
   heaviest predicted rank-step: its measured peak against the cap.

It prints one table (size, B, plan: measured and predicted linearity, the floor, mean batch ms, the largest
peak) and the memory lines; ``--json-out`` writes them. Runs on CUDA when available, else the CPU (the
report says which). Sized to finish within 5 minutes on one GPU at the defaults (about 40 samples).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lidarshard.loaders import read_samples
from lidarshard.loaders.torch import PointCloudDataset
from lidarshard.tools import fit as cal
from lidarshard.transforms.plan import DEFAULT_STRATEGY, plan_epoch
from lidarshard.transforms.plan.caps import Caps, PoolLimits, rank_step_sums
from lidarshard.transforms.plan.memory import MemoryCap, MemoryModel
from lidarshard.transforms.plan.metrics import equal_count_pool, linearity, load_linearity

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_cost import ScatterUNet, _synth_build  # noqa: E402
from sparse_unet import MINK, SMALL, SpconvUNet, voxelize_batch  # noqa: E402

__all__ = ["main"]

#: Backbone sizes: (widths, voxel edge in m).
SIZES = {"small": (SMALL, 0.1), "mink": (MINK, 0.05)}
PLANS = ("random", DEFAULT_STRATEGY, "rebalance", "budget", "auto")


def _model(backbone: str, widths: tuple[int, ...]) -> tuple[str, torch.nn.Module]:
    if backbone in ("auto", "spconv"):
        try:
            return "spconv", SpconvUNet(16, widths)
        except ImportError:
            if backbone == "spconv":
                raise
    return "scatter", ScatterUNet(widths)


class Runner:
    """Forward + backward of batches of the manifest's samples on one device: wall ms and peak bytes."""

    def __init__(
        self, model: torch.nn.Module, points: list[torch.Tensor], voxel: float, device: torch.device
    ):
        self.model, self.points, self.voxel, self.device = model.to(device), points, voxel, device

    def run(self, batch: list[int]) -> tuple[float, float | None]:
        """(ms, peak bytes or None) of one forward + backward of samples ``batch``."""
        pts = torch.cat([self.points[i] for i in batch])
        index = torch.cat(
            [torch.full((len(self.points[i]),), k, dtype=torch.long) for k, i in enumerate(batch)]
        )
        coords, feats, _ = voxelize_batch(pts, index, self.voxel)
        coords, feats = coords.to(self.device), feats.to(self.device)
        labels = torch.bucketize(feats[:, 2].contiguous(), torch.linspace(-2.0, 4.0, 15, device=self.device))
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
        t = time.perf_counter()
        self.model.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(coords, feats), labels).backward()
        if cuda:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        return ms, float(torch.cuda.max_memory_allocated(self.device)) if cuda else None

    def median(self, batch: list[int], repeats: int) -> tuple[float, float | None]:
        runs = [self.run(batch) for _ in range(repeats)]
        return statistics.median(r[0] for r in runs), runs[-1][1]


def _batches(plan: np.ndarray, steps: int) -> list[list[list[int]]]:
    """The first ``steps`` steps of ``plan`` (S, W, M) as [step][rank] lists of sample indices."""
    return [[[int(i) for i in rank if i >= 0] for rank in step] for step in plan[:steps]]


def _timed(
    runner: Runner, steps: list[list[list[int]]]
) -> tuple[np.ndarray, list[tuple[list[int], float | None]]]:
    """((S, W) ms of every (step, rank) batch, [(batch, peak bytes)])."""
    ms = np.zeros((len(steps), len(steps[0]) if steps else 0))
    peaks = []
    for s, step in enumerate(steps):
        for r, batch in enumerate(step):
            ms[s, r], peak = runner.run(batch)
            peaks.append((batch, peak))
    return ms, peaks


def check_size(name: str, args: argparse.Namespace, out: str, device: torch.device) -> dict[str, Any]:
    """Steps 1-3 of the module docstring for one backbone size: its rows and memory lines."""
    widths, voxel = SIZES[name]
    voxel = args.voxel_size or voxel
    backbone, model = _model(args.backbone, widths)
    samples = read_samples(out, ["sample_id", "cost", "num_points", "occupied_voxels"])
    data = PointCloudDataset(out)
    points = [data[i]["points"] for i in range(samples.num_rows)]
    runner = Runner(model, points, voxel, device)
    runner.run([0])  # warm-up (allocators, kernels), untimed
    alone = [runner.median([i], args.repeats) for i in range(len(points))]
    print(f"{name}: {len(points)} samples timed alone", flush=True)
    costs = samples.column("cost").to_numpy().astype(np.float64)
    feats = np.stack(
        [samples.column("num_points").to_numpy(), samples.column("occupied_voxels").to_numpy()], axis=1
    ).astype(np.float64)
    rows, peaks = [], []
    for b in args.batch_list:
        floor_steps = None
        for strategy in PLANS:
            pool = costs if strategy == "budget" else equal_count_pool(costs, args.world, b)
            if pool.size < args.world * b:
                continue
            plan = plan_epoch(strategy, pool, args.world, b, seed=0, epoch=0)
            steps = _batches(plan, args.steps)
            ms, got = _timed(runner, steps)
            peaks += got
            predicted = linearity(plan[: args.steps], pool)
            rows.append({"size": name, "B": b, "plan": strategy, "measured": load_linearity(ms),
                         "predicted": predicted, "batch_ms": float(ms.mean()),
                         "peak_bytes": max((p for _, p in got if p is not None), default=None)})  # fmt: skip
            if strategy == "random":
                floor_steps = [[step[0]] * len(step) for step in steps]
        print(f"{name} B={b}: {len(PLANS)} plans timed", flush=True)
        if floor_steps:
            ms, _ = _timed(runner, floor_steps)
            for row in rows:
                if row["B"] == b and row["size"] == name:
                    row["floor"] = load_linearity(ms)
    memory = _memory(runner, peaks, feats, costs, args)
    alone_ms = [a[0] for a in alone]
    return {"size": name, "backbone": backbone, "widths": list(widths), "voxel": voxel, "rows": rows,
            "alone_ms": [min(alone_ms), statistics.median(alone_ms), max(alone_ms)], "memory": memory}  # fmt: skip


def _memory(
    runner: Runner, peaks: list, feats: np.ndarray, costs: np.ndarray, args: argparse.Namespace
) -> dict[str, Any]:
    """The memory model fitted to the timed batches' peaks, and budget planned and run under a cap."""
    known = [(batch, p) for batch, p in peaks if p is not None]
    if len(known) < 3:
        return {"note": "no peak bytes on this device (a CPU): no memory model"}
    x = np.array([[1.0, *feats[batch].sum(axis=0)] for batch, _ in known])
    y = np.array([p for _, p in known])
    fit = cal.fit_linear(x, y)  # the constant is per batch: the base
    model = MemoryModel(fit.c0, fit.a, fit.b)
    per_sample = feats @ np.array([fit.a, fit.b])
    cap = int(args.max_step_memory or max(1.25 * float(np.median(y)), 1.05 * (fit.c0 + per_sample.max())))
    limits = PoolLimits(Caps(memory=MemoryCap(cap, model)), None, per_sample)
    b = max(args.batch_list)
    plan = plan_epoch("budget", costs, args.world, b, seed=0, epoch=0, limits=limits)
    predicted = fit.c0 + rank_step_sums(plan, per_sample)
    s, r = np.unravel_index(int(np.argmax(predicted)), predicted.shape)
    _, measured = runner.run([int(i) for i in plan[s, r] if i >= 0])
    return {"base_bytes": fit.c0, "bytes_per_point": fit.a, "bytes_per_voxel": fit.b, "r2": fit.r2,
            "cap_bytes": cap, "budget_B": b, "predicted_peak": float(predicted.max()), "measured_peak": measured}  # fmt: skip


def _print(results: list[dict[str, Any]], device: str) -> None:
    print(f"\ndevice: {device}")
    print(
        f"{'size':<6}{'B':>3} {'plan':<10}{'measured':>9}{'predicted':>10}{'floor':>8}{'batch ms':>10}{'peak MiB':>10}"
    )
    for res in results:
        for r in res["rows"]:
            peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}"
            print(f"{r['size']:<6}{r['B']:>3} {r['plan']:<10}{r['measured']:>9.4f}{r['predicted']:>10.4f}"
                  f"{r.get('floor', float('nan')):>8.4f}{r['batch_ms']:>10.2f}{peak:>10}")  # fmt: skip
    for res in results:
        lo, mid, hi = res["alone_ms"]
        print(f"{res['size']} ({res['backbone']}, widths {res['widths']}, {res['voxel']} m): one sample "
              f"{lo:.1f} / {mid:.1f} / {hi:.1f} ms (min / median / max)")  # fmt: skip
        m = res["memory"]
        if "note" in m:
            print(f"  memory: {m['note']}")
        else:
            print(f"  memory fit: {m['base_bytes'] / 2**20:.0f} MiB + {m['bytes_per_point']:.3g} B/point + "
                  f"{m['bytes_per_voxel']:.3g} B/voxel (R^2 {m['r2']:.3f}); budget B={m['budget_B']} under a "
                  f"{m['cap_bytes'] / 2**20:.0f} MiB cap: heaviest rank-step predicted "
                  f"{m['predicted_peak'] / 2**20:.0f} MiB, measured {m['measured_peak'] / 2**20:.0f} MiB")  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--manifest", type=Path, default=None, help="committed build output (default: synth + build)"
    )
    p.add_argument("--scenes", type=int, default=10, help="synth scenes (x 4 keyframes) without --manifest")
    p.add_argument("--sweeps", type=int, default=9, help="build --sweeps without --manifest")
    p.add_argument("--size", default="small,mink", help="backbone sizes: small, mink")
    p.add_argument("--batches", default="1,2,4")
    p.add_argument("--world", type=int, default=8, help="virtual ranks of the plans")
    p.add_argument("--steps", type=int, default=6, help="steps of each plan run")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per sample alone (median kept)")
    p.add_argument("--backbone", choices=["auto", "spconv", "scatter"], default="auto")
    p.add_argument("--voxel-size", type=float, default=None, help="override each size's voxel edge, m")
    p.add_argument(
        "--max-step-memory", type=float, default=None, help="bytes (default: median batch peak x 1.25)"
    )
    p.add_argument(
        "--smoke", action="store_true", help="CPU-sized: 1 scene, 1 sweep, W=2, 1 step, 1 m voxels"
    )
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.scenes, args.sweeps, args.world, args.steps, args.repeats = 1, 1, 2, 1, 1
        args.voxel_size, args.batches = args.voxel_size or 1.0, "1,2"
    args.batch_list = [int(v) for v in args.batches.split(",")]
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    named = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(args.manifest or _synth_build(Path(tmp), args.scenes, args.sweeps))
        results = [check_size(name, args, out, device) for name in args.size.split(",")]
    _print(results, named)
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"device": named, "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
