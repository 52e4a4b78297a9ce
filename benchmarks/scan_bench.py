"""Scan throughput: ``lidarshard scan`` on Beam against a plain multiprocessing script.

    python benchmarks/scan_bench.py [--files 800] [--points 120000] [--workers 2]

Writes ``--files`` KITTI-style ``.bin`` clouds (float32 x, y, z, intensity; ring-like scenes of
about ``--points`` points), then on the same files, each in a fresh child process:

- ``lidarshard scan IN OUT --runner=DirectRunner --direct_running_mode=multi_processing
  --direct_num_workers=W`` (the whole command: Beam start-up, discovery, reshuffle, gather,
  Parquet, commit);
- the baseline: ``multiprocessing.Pool(W)`` mapping the same pure ``lidarshard.transforms.features.sample.featurize``
  (plain ``open``/``os.stat`` for I/O) over the same files, then the same table and Parquet file.

Both are timed end to end (interpreter start included), interleaved, best of ``--repeat``.
Beam's fixed start-up (~4 s here) weighs on small runs: at 200 files the ratio is ~0.6.

Prints both throughputs (files/s, MB/s), the ratio scan / plain (issue #2 target: >= 0.7) and
whether both produced the same feature rows (exit status 1 when they differ).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from lidarshard import schemas
from lidarshard.transforms.features.sample import ScanConfig, featurize, file_task
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.arrow import concat_sorted, parquet_bytes, rows_to_table
from lidarshard.transforms.layouts import dataset_name

TARGET_RATIO = 0.7
_RUNNERS = {
    "direct": ["--runner=DirectRunner", "--direct_running_mode=multi_processing"],
    "fnapi": ["--runner=FnApiRunner"],
}


def write_clouds(root: Path, files: int, points: int, seed: int = 0) -> int:
    """``files`` ring-like KITTI .bin scenes (range lognormal around ~12 m); returns total bytes."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(files):
        n = int(points * rng.uniform(0.8, 1.2))
        r = np.exp(rng.normal(2.5, 0.8, n))
        a = rng.uniform(0.0, 2.0 * np.pi, n)
        z = rng.normal(-1.0, 0.5, n)
        cloud = np.stack([r * np.cos(a), r * np.sin(a), z, rng.random(n)], axis=1).astype(np.float32)
        cloud.tofile(root / f"{i:06d}.bin")
        total += cloud.nbytes
    return total


def _one(rel: str, root: str, cfg: ScanConfig) -> dict:
    """The scan's row of ``root/rel``: a file task of the INPUT named as the scan names it."""
    task = dataclasses.replace(file_task(rel, os.path.join(root, rel)), dataset=dataset_name(root))
    return featurize(task, storage.read_bytes, storage.size, cfg)


def plain(root: str, out: str, workers: int) -> None:
    """The baseline: Pool.map of ``featurize`` over every file, then samples.parquet."""
    names = sorted(os.listdir(root))
    with Pool(workers) as pool:
        rows = pool.map(partial(_one, root=root, cfg=ScanConfig()), names, chunksize=4)
    schema = schemas.sample_schema()
    table = concat_sorted([rows_to_table(rows, schema)], schema, ("sample_id",))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, schemas.SAMPLES_FILE), "wb") as f:
        f.write(parquet_bytes(table))


def _timed(cmd: list[str], timeout: float) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{cmd[:5]} failed:\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
    return time.perf_counter() - t0


def _features(samples: Path) -> list[dict]:
    """The feature rows of a samples directory or file, without paths (the two runs' paths differ)."""
    t = pq.read_table(samples)
    return t.drop_columns(["path"]).to_pylist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=800)
    ap.add_argument("--points", type=int, default=120_000, help="mean points per cloud")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--runner",
        choices=["direct", "fnapi"],
        default="direct",
        help="the scan's runner: DirectRunner multi_processing x --workers, or the in-process FnApiRunner",
    )
    ap.add_argument("--repeat", type=int, default=2, help="interleaved runs of each; best time counts")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is killed")
    ap.add_argument("--workdir", help="keep files here (default: a temp dir, removed)")
    ap.add_argument("--plain", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args(argv)
    if args.plain:
        plain(*args.plain, args.workers)
        return 0
    work = Path(args.workdir or tempfile.mkdtemp(prefix="scan_bench-"))
    try:
        inp = work / "in"
        size = write_clouds(inp, args.files, args.points)
        for p in inp.iterdir():  # warm the page cache for both contenders alike
            p.read_bytes()
        scan_cmd = [sys.executable, "-m", "lidarshard.pipelines.cli", "scan", str(inp), str(work / "scan")]
        scan_cmd += _RUNNERS[args.runner] + (
            [f"--direct_num_workers={args.workers}"] if args.runner == "direct" else []
        )
        plain_cmd = [sys.executable, __file__, "--workers", str(args.workers), "--plain"]
        plain_cmd += [str(inp), str(work / "plain")]
        t_plain, t_scan = float("inf"), float("inf")
        for _ in range(args.repeat):  # interleaved, best of each: other load on the host hits both
            t_plain = min(t_plain, _timed(plain_cmd, args.timeout))
            t_scan = min(t_scan, _timed(scan_cmd, args.timeout))
        same = _features(work / "scan" / schemas.SAMPLES_DIR) == _features(
            work / "plain" / schemas.SAMPLES_FILE
        )
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    mb = size / 1e6
    print(
        f"scan_bench: {args.files} files, {mb:.0f} MB, {args.workers} workers, scan on {args.runner}, best of {args.repeat}"
    )
    print(f"{'':<34} {'s':>7} {'files/s':>8} {'MB/s':>7}")
    for name, t in (("plain multiprocessing.Pool", t_plain), (f"lidarshard scan ({args.runner})", t_scan)):
        print(f"{name:<34} {t:>7.1f} {args.files / t:>8.1f} {mb / t:>7.1f}")
    ratio = t_plain / t_scan
    verdict = "MET" if ratio >= TARGET_RATIO else "MISSED"
    print(f"ratio scan / plain throughput: {ratio:.2f} (target >= {TARGET_RATIO}: {verdict})")
    print(f"same feature rows: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
