"""The cost premise on a real backbone: does predicted cost rank measured sparse-conv step time?

Times forward + backward of a small sparse-convolution UNet on every sample of a manifest (keyframe +
planned sweeps, voxelized at ``--voxel-size``), writes ``sample_id, ms`` and fits it with
``lidarshard calibrate``'s model (``ms = c0 + a * points + b * voxels``, non-negative least squares).
Prints R^2 of the fit, and the Spearman rank correlation with measured time of (1) the fitted cost and
(2) the manifest's own predicted cost (the cost model it was built with, ``voxels`` by default).

Backbones (``--backbone``):
    spconv    spconv 2.x SubMConv3d / SparseConv3d / SparseInverseConv3d (``pip install spconv`` for the
              CPU build, ``spconv-cu12x`` on a GPU host; NOT a lidarshard dependency): the UNet of
              ``examples/sparse_unet.py``, which ``train_ddp.py --backbone spconv`` trains too. The CPU
              build calls ``torch.cuda.current_stream()`` even for CPU tensors, which a CPU-only torch
              refuses; ``sparse_unet.patch_cpu_stream`` then passes stream 0 (CPU ops ignore it).
    scatter   fallback from plain torch ops: the same UNet shape with each sparse conv replaced by a
              voxel MLP + neighbour max over the 6 face neighbours (hash join via ``torch.searchsorted``).
    auto      spconv when importable, else scatter (default).

Runs on CUDA when available, else CPU (the report says which). Manifest source: ``--manifest OUT``
(any committed build output), or by default ``lidarshard synth`` + ``build --sweeps`` into a temp dir.

    python benchmarks/gpu_cost.py [--manifest OUT] [--backbone auto] [--repeats 3] [--json-out r.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lidarshard.loaders import read_samples
from lidarshard.loaders.torch import PointCloudDataset
from lidarshard.tools.calibrate import calibrate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))  # the spconv UNet's one home: examples/sparse_unet.py
from sparse_unet import SpconvUNet, voxelize_batch  # noqa: E402

__all__ = ["main", "spearman", "ScatterUNet"]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation of two (n,) arrays (ties broken by order; fine for timings)."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


class ScatterUNet(nn.Module):
    """Sparse-UNet stand-in from torch ops: per level, voxel MLP + max over the 6 face neighbours;
    stride-2 pooling down, gather back up, skip connections. Cost ~ voxels at each level. Takes the
    coords of a batch, (V, 4) [sample, x, y, z] as ``voxelize_batch`` gives them, like ``SpconvUNet``;
    runs on the device of its inputs (CPU or CUDA)."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), classes: int = 16) -> None:
        super().__init__()
        dims = (4, *widths)
        self.down = nn.ModuleList(nn.Linear(2 * dims[i], dims[i + 1]) for i in range(len(widths)))
        self.up = nn.ModuleList(
            nn.Linear(widths[i] + widths[i + 1], widths[i]) for i in range(len(widths) - 1)
        )
        self.head = nn.Linear(widths[0], classes)

    @staticmethod
    def _key(coords: torch.Tensor) -> torch.Tensor:
        """(V,) int64 key of (V, 4) [sample, x, y, z] voxel coords (each axis below 4096)."""
        return ((coords[:, 0] * 4096 + coords[:, 1]) * 4096 + coords[:, 2]) * 4096 + coords[:, 3]

    @classmethod
    def _neighbour_max(cls, coords: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        key = cls._key(coords)
        order = torch.argsort(key)
        skey = key[order]
        out = torch.full_like(feats, -1e9)
        for axis in range(1, 4):
            for step in (-1, 1):
                shift = torch.zeros(4, dtype=torch.long, device=coords.device)
                shift[axis] = step
                nk = cls._key(coords + shift)
                pos = torch.searchsorted(skey, nk).clamp_max(len(skey) - 1)
                hit = skey[pos] == nk
                out = torch.where(hit[:, None], torch.maximum(out, feats[order[pos]]), out)
        return torch.where(out > -1e8, out, torch.zeros_like(out))

    def forward(self, coords: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        coords = coords.long()
        levels, inverses = [], []
        x = feats / 50.0
        for i, lin in enumerate(self.down):
            if i:
                halved = torch.cat(
                    [coords[:, :1], coords[:, 1:] // 2], dim=1
                )  # a sample's voxels stay its own
                coords, inv = torch.unique(halved, dim=0, return_inverse=True)
                x = x.new_zeros(len(coords), x.shape[1]).index_reduce_(0, inv, x, "amax", include_self=False)
                inverses.append(inv)
            x = F.relu(lin(torch.cat([x, self._neighbour_max(coords, x)], dim=1)))
            levels.append(x)
        for i in reversed(range(len(self.up))):
            x = F.relu(self.up[i](torch.cat([levels[i], x[inverses[i]]], dim=1)))
        return self.head(x)


def _backbone(name: str) -> tuple[str, nn.Module]:
    if name in ("auto", "spconv"):
        try:
            return "spconv", SpconvUNet()
        except ImportError:
            if name == "spconv":
                raise
    return "scatter", ScatterUNet()


def _step_ms(
    model: nn.Module, coords: torch.Tensor, feats: torch.Tensor, device: torch.device
) -> tuple[float, float]:
    """One forward + backward (cross-entropy on voxel height bands): (wall ms, process CPU ms)."""
    labels = torch.bucketize(feats[:, 2].contiguous(), torch.linspace(-2.0, 4.0, 15, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    t, c = time.perf_counter(), time.process_time()
    F.cross_entropy(model(coords, feats), labels).backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3


def _synth_build(work: Path, scenes: int, sweeps: int) -> Path:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cli = [sys.executable, "-m", "lidarshard.pipelines.cli"]
    root, out = work / "synth", work / "manifest"
    flags = ["--runner=FnApiRunner"]
    subprocess.run(
        [*cli, "synth", str(root), "--scenes", str(scenes), "--keyframes-per-scene", "4", *flags],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [
            *cli,
            "build",
            str(root),
            str(out),
            "--nuscenes-version",
            "v1.0-synth",
            "--sweeps",
            str(sweeps),
            "--world-size",
            "1",
            "--batch-size",
            "1",
            *flags,
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--manifest", type=Path, default=None, help="committed build output (default: synth + build)"
    )
    p.add_argument("--scenes", type=int, default=6, help="synth scenes (x 4 keyframes) without --manifest")
    p.add_argument("--sweeps", type=int, default=9, help="build --sweeps without --manifest")
    p.add_argument("--backbone", choices=["auto", "spconv", "scatter"], default="auto")
    p.add_argument("--voxel-size", type=float, default=0.1, help="backbone voxel edge, m")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per sample (median kept)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument(
        "--clock",
        choices=["auto", "wall", "cpu"],
        default="auto",
        help="what is fitted: wall ms, or process CPU ms (robust on a shared host); auto: cpu on CPU",
    )
    p.add_argument("--json-out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    clock = args.clock if args.clock != "auto" else ("wall" if device.type == "cuda" else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.manifest or _synth_build(Path(tmp), args.scenes, args.sweeps)
        name, model = _backbone(args.backbone)
        model = model.to(device)
        rows = read_samples(out, ["sample_id", "cost"]).to_pylist()
        dataset = PointCloudDataset(out)  # keyframe + planned sweeps, paths resolved against path_root
        timings = Path(tmp) / "timings.csv"
        measured: list[float] = []
        other: list[float] = []  # the clock not fitted
        for i, r in enumerate(rows):
            pts = dataset[i]["points"]
            coords, feats, _ = voxelize_batch(pts, torch.zeros(len(pts), dtype=torch.long), args.voxel_size)
            coords, feats = coords.to(device), feats.to(device)
            if i == 0:
                _step_ms(model, coords, feats, device)  # warm-up (allocators, kernels), untimed
            wall, cpu = zip(
                *[_step_ms(model, coords, feats, device) for _ in range(args.repeats)], strict=True
            )
            ms = statistics.median(cpu if clock == "cpu" else wall)
            measured.append(ms)
            other.append(statistics.median(wall if clock == "cpu" else cpu))
            print(
                f"{i + 1:>4}/{len(rows)} {r['sample_id'][:12]} {len(pts):>8} points {len(coords):>7} voxels "
                f"{ms:9.1f} ms",
                flush=True,
            )
        with open(timings, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["sample_id", "ms"])
            w.writerows((r["sample_id"], f"{ms:.4f}") for r, ms in zip(rows, measured, strict=True))
        fit, source, pairs = calibrate(str(out), str(timings))
    ms_arr = np.asarray(measured)
    report = {
        "backbone": name,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "samples": len(rows),
        "clock": clock,
        "spearman_fitted_clock_vs_other": spearman(np.asarray(measured), np.asarray(other)),
        "voxel_size": args.voxel_size,
        "fit": fit.to_json(),
        "spearman_fitted": spearman(pairs[:, 0], pairs[:, 1]),
        "spearman_manifest_cost": spearman(np.asarray([r["cost"] for r in rows]), ms_arr),
        "manifest_cost_model": source["manifest_cost_model"],
        "ms_min_median_max": [float(ms_arr.min()), float(np.median(ms_arr)), float(ms_arr.max())],
    }
    print(
        f"\nbackbone {name} on {report['device']}, {len(rows)} samples, voxel {args.voxel_size} m, {clock} clock"
    )
    print(f"measured ms min/median/max: {', '.join(f'{v:.1f}' for v in report['ms_min_median_max'])}")
    print(f"calibrate fit: c0={fit.c0:.3f} a={fit.a:.3g} b={fit.b:.3g} ms, R^2 = {fit.r2:.3f}")
    print(
        f"Spearman(fitted cost, ms) = {report['spearman_fitted']:.3f}; "
        f"Spearman(manifest cost [{source['manifest_cost_model']}], ms) = {report['spearman_manifest_cost']:.3f}"
    )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
