"""Reading each dataset layout: lidarshard's reader against a plain pyarrow/numpy read of the same files
(issue 28: points/s ratio >= 0.8 per layout).

    python benchmarks/layout_bench.py [--frames 6] [--repeat 3] [--scan]

Writes one synthetic unit of each layout (``lidarshard synth --layout``: an AV2 log, a SemanticKITTI
sequence, a Waymo v2 segment; nuScenes keyframes for reference) into a temporary directory, then reads
every frame's points, in one process, two ways:

- ``lidarshard``: what the scan runs per file: ``storage.read_bytes`` + ``readers.read_points(copy=False)``
  (AV2 Feather, KITTI .bin, nuScenes .pcd.bin: a view of the bytes), ``waymo_v2.read_frame`` (the
  frame's row group, both returns of all lasers to xyz in the vehicle frame);
- ``plain``: the same points the way a user would write it: ``pyarrow.feather.read_table`` + numpy
  stacking; ``np.fromfile(...).reshape``; for Waymo ``pq.read_table(filters=frame)`` of lidar and
  calibration, then the range-image formula of realdata/PROVENANCE.md in plain numpy.

Point totals are asserted equal. Files are in the page cache (a first pass reads them); the two are
interleaved, best of ``--repeat``. Prints points/s and lidarshard/plain per layout. ``--scan`` also
times the scan's whole ``featurize`` per sample (reading, voxel features, percentiles, hashes).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.feather as feather
import pyarrow.parquet as pq

from lidarshard.transforms import layouts
from lidarshard.transforms.features.sample import ScanConfig, featurize, file_task
from lidarshard.transforms.formats.readers import detect_format, read_points
from lidarshard.transforms.io import storage
from lidarshard.transforms.layouts.task import LayoutOptions
from lidarshard.transforms.layouts.waymo_v2 import read_frame
from lidarshard.transforms.synth.dataroot import SynthConfig, scene_files
from lidarshard.transforms.synth.layouts import LAYOUT_WRITERS

IO = layouts.STORAGE_IO
PREFIX = "[LiDARComponent].range_image_return"


def _write(root: Path, files) -> None:
    for rel, data in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def make(tmp: Path, frames: int) -> dict[str, Path]:
    """One unit of each layout under ``tmp``: {layout: its root}."""
    roots = {}
    for name, writer in LAYOUT_WRITERS.items():
        root = tmp / name
        _write(root, writer.static_files(0))
        _write(root, writer.unit_files(0, 1, frames))
        roots[name] = root
    cfg = SynthConfig(scenes=1, keyframes_per_scene=frames, sweeps_per_keyframe=0)
    _write(tmp / "nuscenes", scene_files(cfg, 0))
    roots["nuscenes"] = tmp / "nuscenes"
    return roots


def _plain_waymo(path: str, frame: int) -> np.ndarray:
    """Points of one Waymo v2 frame, written plainly: filtered reads, then the PROVENANCE formula."""
    lidar = pq.read_table(path, filters=[("key.frame_timestamp_micros", "=", frame)])
    calib = pq.read_table(path.replace("/lidar/", "/lidar_calibration/"))
    by_laser = {r["key.laser_name"]: r for r in calib.to_pylist()}
    out = []
    for row in sorted(lidar.to_pylist(), key=lambda r: r["key.laser_name"]):
        cal = by_laser[row["key.laser_name"]]
        ext = np.asarray(cal["[LiDARCalibrationComponent].extrinsic.transform"], np.float64).reshape(4, 4)
        for k in (1, 2):
            h, w, c = row[f"{PREFIX}{k}.shape"]
            img = np.asarray(row[f"{PREFIX}{k}.values"], np.float32).reshape(h, w, c)
            values = cal["[LiDARCalibrationComponent].beam_inclination.values"]
            if values is not None:
                inc = np.asarray(values, np.float64)[::-1]
            else:
                lo = cal["[LiDARCalibrationComponent].beam_inclination.min"]
                hi = cal["[LiDARCalibrationComponent].beam_inclination.max"]
                inc = (lo + (np.arange(h) + 0.5) / h * (hi - lo))[::-1]
            az = ((w - np.arange(w) - 0.5) / w * 2 - 1) * np.pi - np.arctan2(ext[1, 0], ext[0, 0])
            r = img[..., 0].astype(np.float64)
            keep = r > 0
            ii, jj = np.nonzero(keep)
            rr, ci, ca = r[keep], np.cos(inc[ii]), az[jj]
            xyz = np.stack([rr * np.cos(ca) * ci, rr * np.sin(ca) * ci, rr * np.sin(inc[ii])], 1)
            xyz = xyz @ ext[:3, :3].T + ext[:3, 3]
            out.append(np.column_stack([xyz, img[..., 1][keep], img[..., 2][keep]]).astype(np.float32))
    return np.concatenate(out)


def _plain_feather(path: str) -> np.ndarray:
    t = feather.read_table(path, columns=["x", "y", "z", "intensity"])
    return np.column_stack([np.asarray(t[c], np.float32) for c in ("x", "y", "z", "intensity")])


def readers(
    roots: dict[str, Path],
) -> dict[str, list[tuple[Callable[[], np.ndarray], Callable[[], np.ndarray]]]]:
    """{layout: [(lidarshard read, plain read) per frame]}."""
    out: dict[str, list] = {}
    for name, root in roots.items():
        pairs = []
        for t in _tasks(name, root):
            if t.frame is not None:
                pairs.append(
                    (lambda t=t: read_frame(storage.open_read, t.path, t.frame, 50_000_000),
                     lambda t=t: _plain_waymo(t.path, t.frame))
                )  # fmt: skip
            else:
                fmt = detect_format(t.path)
                dims = {"nuscenes_bin": 5, "kitti_bin": 4}.get(fmt)
                plain = (lambda t=t: _plain_feather(t.path)) if dims is None else (
                    lambda t=t, d=dims: np.fromfile(t.path, np.float32).reshape(-1, d)
                )  # fmt: skip
                ours = lambda t=t, f=fmt: read_points(storage.read_bytes(t.path), f, copy=False)  # noqa: E731
                pairs.append((ours, plain))
        out[name] = pairs
    return out


def _tasks(name: str, root: Path) -> list:
    """The layout's scan tasks (nuScenes: its keyframe files, written without tables here)."""
    if name == "nuscenes":
        return [file_task(p, p) for p in storage.glob(f"{root}/**/*.pcd.bin")]
    return layouts.load(name, str(root), LayoutOptions(), IO).tasks


def _time(fns: list[Callable[[], np.ndarray]]) -> tuple[float, int]:
    start = time.perf_counter()
    n = sum(len(fn()) for fn in fns)
    return time.perf_counter() - start, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--scan", action="store_true", help="also time the scan's featurize per sample")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        roots = make(Path(tmp), args.frames)
        pairs = readers(roots)
        print(
            f"{'layout':<14} {'frames':>6} {'points':>10} {'lidarshard pts/s':>17} {'plain pts/s':>12} {'ratio':>6}"
        )
        for name, frame_pairs in pairs.items():
            ours, plain = [a for a, _ in frame_pairs], [b for _, b in frame_pairs]
            _time(ours), _time(plain)  # warm the page cache
            best_ours = best_plain = float("inf")
            for _ in range(args.repeat):
                t, n_ours = _time(ours)
                best_ours = min(best_ours, t)
                t, n_plain = _time(plain)
                best_plain = min(best_plain, t)
            assert n_ours == n_plain, (name, n_ours, n_plain)
            rate_ours, rate_plain = n_ours / best_ours, n_plain / best_plain
            print(
                f"{name:<14} {len(frame_pairs):>6} {n_ours:>10,} {rate_ours:>17,.0f} {rate_plain:>12,.0f} "
                f"{rate_ours / rate_plain:>6.2f}"
            )
        if args.scan:
            cfg = ScanConfig()
            for name, root in roots.items():
                tasks = _tasks(name, root)
                start = time.perf_counter()
                rows = [featurize(t, storage.read_bytes, storage.size, cfg, storage.open_read) for t in tasks]
                took = time.perf_counter() - start
                points = sum(r["num_points"] for r in rows)
                print(f"scan featurize {name:<14} {points / took:>12,.0f} points/s ({len(rows)} samples)")


if __name__ == "__main__":
    main()
