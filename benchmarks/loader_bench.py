"""Trainer-side point loading: ``PointCloudDataset(OUT, sweeps=True)`` against a plain numpy loop and
nuscenes-devkit (issue 29: >= 0.9x numpy, >= 2x devkit).

    python benchmarks/loader_bench.py [--scenes 4] [--keyframes 10] [--repeat 3] [--out OUT] [--no-cold] [--profile]

Writes a nuScenes-style dataroot (``lidarshard synth``, ``--keyframes`` a scene, default 10, 34,688 points a file) and
builds it with ``--sweeps 9`` (or takes an existing manifest, ``--out``), then delivers every sample's
keyframe + 9 sweeps in the keyframe frame (~260k points), in one process, three ways:

- ``lidarshard``: ``PointCloudDataset(OUT, sweeps=True)[i]`` for every i (file sizes checked against
  the scan's record, points as a torch tensor);
- ``numpy``: the same work as a plain loop: ``np.fromfile`` per file, each sweep loses the |x| < 1,
  |y| < 1 box, its x, y, z go through its 4x4 transform, ``np.concatenate``. Same point totals
  (asserted), and bit for bit the same arrays (reported);
- ``devkit``: ``LidarPointCloud.from_file_multisweep(nusc, sample, nsweeps=10)`` on the same samples, run
  by ``.venv-devkit/bin/python`` (its own venv: it pins numpy 1.26; tests/test_synth_devkit.py
  creates it) when it exists. It also filters the keyframe and drops the ring column, so its totals
  differ a little.

Warm: the files are in the page cache (a first pass reads them); the contenders are interleaved, best
of ``--repeat``. Cold: before each timed pass every file is evicted from the page cache with
``fdatasync`` + ``posix_fadvise(POSIX_FADV_DONTNEED)`` (no root needed, unlike
``/proc/sys/vm/drop_caches``, and only these files leave), so each pass reads them from the disk
(measured here: 364 files, 250 MB, 0.35 s cold against 0.07 s warm for plain reads). Prints
samples/s, points/s and the ratios; ``--profile`` adds the top functions of one warm lidarshard pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from synthetic import VERSION, synth_build

REPO = Path(__file__).resolve().parents[1]
DEVKIT_PYTHON = REPO / ".venv-devkit" / "bin" / "python"
SWEEPS = 9

#: One sample for the numpy loop: keyframe path, sweep paths (newest first), (S, 4, 4) float64.
Sample = tuple[str, list[str], np.ndarray]


def evict(paths: Sequence[str]) -> None:
    """Drop ``paths`` from the page cache (``POSIX_FADV_DONTNEED``), so the next read goes to the disk;
    each is synced first: the kernel keeps the dirty pages of a file just written."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(run: Callable[[], int], files: Sequence[str], cold: bool) -> tuple[float, int]:
    """(wall seconds, points delivered) of one pass of ``run``; ``cold``: ``files`` evicted first."""
    if cold:
        evict(files)
    start = time.perf_counter()
    points = run()
    return time.perf_counter() - start, points


# ------------------------------------------------------------------------------- devkit child mode


def devkit_passes(dataroot: str, keyframes: list[str], files: list[str], repeat: int, cold: bool) -> dict:
    """Best-of-``repeat`` pass of ``from_file_multisweep`` over the samples whose LIDAR_TOP keyframe
    is ``keyframes`` (paths relative to ``dataroot``, in that order). Runs in the devkit's venv."""
    from nuscenes.nuscenes import NuScenes
    from nuscenes.utils.data_classes import LidarPointCloud

    nusc = NuScenes(version=VERSION, dataroot=dataroot, verbose=False)
    by_file = {nusc.get("sample_data", s["data"]["LIDAR_TOP"])["filename"]: s for s in nusc.sample}
    samples = [by_file[k] for k in keyframes]

    def run() -> int:
        total = 0
        for sample in samples:
            pc, _ = LidarPointCloud.from_file_multisweep(
                nusc, sample, "LIDAR_TOP", "LIDAR_TOP", nsweeps=SWEEPS + 1
            )
            total += pc.nbr_points()
        return total

    run()  # warm: tables' lookups, page cache
    best = min(timed(run, files, cold) for _ in range(repeat))
    return {"seconds": best[0], "points": int(best[1])}


# --------------------------------------------------------------------------------- the contenders


def numpy_sample(key: str, sweeps: list[str], mats: np.ndarray) -> np.ndarray:
    """The plain numpy loop: what a user writes for keyframe + sweeps in the keyframe frame."""
    clouds = [np.fromfile(key, dtype=np.float32).reshape(-1, 5)]
    for path, tf in zip(sweeps, mats, strict=True):
        pts = np.fromfile(path, dtype=np.float32).reshape(-1, 5)
        pts = pts[~((np.abs(pts[:, 0]) < 1.0) & (np.abs(pts[:, 1]) < 1.0))]
        pts[:, :3] = pts[:, :3] @ tf[:3, :3].T + tf[:3, 3]
        clouds.append(pts)
    return np.concatenate(clouds)


def load_samples(out: str) -> tuple[str, list[Sample]]:
    """(dataroot, samples in the dataset's row order) of the manifest at ``out``."""
    from lidarshard.loaders.reader import load_manifest, read_samples

    root = load_manifest(out).path_root
    assert root is not None, "a manifest of relative paths (a fresh build) is expected"
    table = read_samples(out, ["path", "sweep_paths", "sweep_transforms"]).to_pylist()
    samples = [
        (
            os.path.join(root, row["path"]),
            [os.path.join(root, p) for p in row["sweep_paths"] or []],
            np.asarray(row["sweep_transforms"] or [], np.float64).reshape(-1, 4, 4),
        )
        for row in table
    ]
    return root, samples


def run_devkit(root: str, samples: list[Sample], files: list[str], repeat: int, cold: bool) -> dict | None:
    """The devkit's best pass (in its venv), or None when ``.venv-devkit`` is absent or fails."""
    if not DEVKIT_PYTHON.exists():
        return None
    keyframes = [os.path.relpath(key, root) for key, _, _ in samples]
    job = json.dumps(
        {"dataroot": root, "keyframes": keyframes, "files": files, "repeat": repeat, "cold": cold}
    )
    done = subprocess.run(
        [str(DEVKIT_PYTHON), __file__, "--devkit-child"],
        input=job,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode:
        print(f"devkit run failed (skipped):\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def profile(get: Callable[[int], object], n: int) -> None:
    """Top functions (own time) of one warm pass of ``get(i)`` for i < n."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        get(i)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--scenes", type=int, default=4, help="synthetic scenes, --keyframes samples each (default 4)"
    )
    ap.add_argument("--keyframes", type=int, default=10, help="synth --keyframes-per-scene (default 10)")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes per contender; the best counts")
    ap.add_argument("--out", help="an existing manifest built with sweeps (default: synthesize one)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache passes")
    ap.add_argument("--profile", action="store_true", help="profile one warm lidarshard pass")
    ap.add_argument("--devkit-child", action="store_true", help=argparse.SUPPRESS)  # runs in .venv-devkit
    args = ap.parse_args(argv)
    if args.devkit_child:
        job = json.load(sys.stdin)
        print(
            json.dumps(
                devkit_passes(job["dataroot"], job["keyframes"], job["files"], job["repeat"], job["cold"])
            )
        )
        return 0

    from lidarshard.loaders.torch import PointCloudDataset

    with tempfile.TemporaryDirectory(prefix="loader_bench.") as tmp:
        out = args.out or synth_build(Path(tmp), args.scenes, args.keyframes, world_size=2, sweeps=SWEEPS)[1]
        root, samples = load_samples(out)
        dataset = PointCloudDataset(out, sweeps=True)
        files = sorted({p for key, sweeps, _ in samples for p in [key, *sweeps]})
        n = len(samples)

        def ours() -> int:
            return sum(dataset[i]["points"].shape[0] for i in range(n))

        def plain() -> int:
            return sum(numpy_sample(*s).shape[0] for s in samples)

        same = all(
            np.array_equal(dataset[i]["points"].numpy(), numpy_sample(*s)) for i, s in enumerate(samples)
        )
        modes = ["warm"] + ([] if args.no_cold else ["cold"])
        rows = []
        for mode in modes:
            cold = mode == "cold"
            best: dict[str, tuple[float, int]] = {}
            for _ in range(args.repeat):  # interleaved: load on a shared host hits both alike
                for name, run in (("lidarshard", ours), ("numpy", plain)):
                    got = timed(run, files, cold)
                    best[name] = min(best.get(name, got), got)
            assert best["lidarshard"][1] == best["numpy"][1], f"point totals differ: {best}"
            devkit = run_devkit(root, samples, files, args.repeat, cold)
            if devkit is not None:
                best["devkit"] = (devkit["seconds"], devkit["points"])
            rows += [(mode, name, *best[name], best["lidarshard"][0]) for name in best]

        print(
            f"\n{n} samples, keyframe + {SWEEPS} sweeps, {len(files)} files; "
            f"best of {args.repeat}, one process"
        )
        print(f"{'cache':5s}  {'reader':10s}  {'samples/s':>9s}  {'Mpoints/s':>9s}  {'lidarshard / it':>15s}")
        for mode, name, seconds, points, ours_s in rows:
            ratio = "" if name == "lidarshard" else f"{seconds / ours_s:.2f}x"
            print(f"{mode:5s}  {name:10s}  {n / seconds:9.1f}  {points / seconds / 1e6:9.2f}  {ratio:>15s}")
        if not DEVKIT_PYTHON.exists():
            print(f"devkit: {DEVKIT_PYTHON} not found (make test creates it): not compared")
        print(
            f"numpy arrays bit-identical to lidarshard's: {same}; targets: >= 0.9x numpy, >= 2x devkit (warm)"
        )
        if args.profile:
            profile(dataset.__getitem__, n)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
