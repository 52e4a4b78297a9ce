"""What recording file sizes and CRC-32s costs the scan, and what ``validate --data`` reads per second.

    python benchmarks/integrity_bench.py [--scenes 4] [--keyframes 10] [--sweeps 9] [--repeat 3]

Writes a nuScenes-style dataroot with ``lidarshard synth`` (34,688 points a file), then on it, each
in a fresh child process, interleaved, best of ``--repeat``:

- ``lidarshard scan DATAROOT OUT --nuscenes-version v1.0-synth --sweeps N --runner=FnApiRunner``
  (one in-process worker, so the two runs differ in one thing only) as shipped: every file read is
  hashed (``schemas.content_hash``, zlib CRC-32);
- the same command with ``schemas.content_hash`` replaced by a function returning 0 (no hashing).

Also, in this process, the pure per-sample work (``featurize`` over every task, no Beam) with and
without hashing, and ``lidarshard validate OUT --data`` (reads and hashes every file the samples name).

Times are CPU seconds (user + system; the host may be shared and loaded, which swings wall times by
20%). Prints them, the ratios with / without hashing (the overhead) and validate's GB/s of CPU.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from synthetic import VERSION, synth_args

from lidarshard import schemas
from lidarshard.transforms.features.sample import ScanConfig, featurize
from lidarshard.transforms.io import storage
from lidarshard.transforms.layouts import nuscenes_tasks as tables

#: The child that scans without hashing: ``schemas.content_hash`` returns 0 (the feature work is unchanged).
_NO_HASH = (
    "import sys; from lidarshard import schemas; schemas.content_hash = lambda data, running=0: 0; "
    "from lidarshard.pipelines.cli import main; sys.exit(main(sys.argv[1:]))"
)
_CLI = "import sys; from lidarshard.pipelines.cli import main; sys.exit(main(sys.argv[1:]))"


def _timed(code: str, args: list[str]) -> float:
    """CPU seconds (user + system) of a child running ``code`` with ``args``: on a shared, loaded host
    the CPU time of a one-worker run varies far less than its wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=3600)
    if r.returncode:
        raise RuntimeError(f"{args[:3]} failed:\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _featurize_all(root: str, sweeps: int, hashed: bool) -> float:
    """CPU seconds of ``featurize`` over every task of the dataroot, in this process."""
    tasks, _ = tables.load_tasks(root, VERSION, sweeps, storage.read_bytes)
    real = schemas.content_hash
    if not hashed:
        schemas.content_hash = lambda data, running=0: 0  # type: ignore[assignment]
    try:
        t0 = time.process_time()
        for task in tasks:
            featurize(task, storage.read_bytes, storage.size, ScanConfig())
        return time.process_time() - t0
    finally:
        schemas.content_hash = real  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenes", type=int, default=4, help="synth scenes (--keyframes each)")
    ap.add_argument("--keyframes", type=int, default=10, help="synth --keyframes-per-scene (default 10)")
    ap.add_argument("--sweeps", type=int, default=9, help="previous sweeps aggregated per keyframe")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of each; best time counts")
    ap.add_argument("--workdir", help="keep files here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="integrity_bench-"))
    try:
        root, out = work / "dataroot", work / "scan"
        if not (root / VERSION).is_dir():
            synth = synth_args(root, args.scenes, args.keyframes)
            synth += ["--labels", "--runner=FnApiRunner"]
            _timed(_CLI, synth)
        files = list(root.rglob("*.bin"))
        for p in files:  # warm the page cache for both contenders alike
            p.read_bytes()
        scan = ["scan", str(root), str(out), "--nuscenes-version", VERSION, "--sweeps", str(args.sweeps)]
        scan += ["--runner=FnApiRunner", "--direct_num_workers=1"]
        best = {
            "hashed": float("inf"),
            "plain": float("inf"),
            "f_hashed": float("inf"),
            "f_plain": float("inf"),
        }
        for _ in range(args.repeat):  # interleaved: other load on the host hits both
            best["plain"] = min(best["plain"], _timed(_NO_HASH, scan))
            best["hashed"] = min(best["hashed"], _timed(_CLI, scan))
            best["f_plain"] = min(best["f_plain"], _featurize_all(str(root), args.sweeps, False))
            best["f_hashed"] = min(best["f_hashed"], _featurize_all(str(root), args.sweeps, True))
        t_validate = min(_timed(_CLI, ["validate", str(out), "--data"]) for _ in range(args.repeat))
        t_plain_validate = min(_timed(_CLI, ["validate", str(out)]) for _ in range(args.repeat))
        samples = storage.read_json(str(out / schemas.SCAN_FILE))["counts"]["accepted"]
        read = _bytes_named(out)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"integrity_bench: {args.scenes} scenes, {samples} samples x (1 + {args.sweeps} sweeps) + labels, "
          f"{read / 1e6:.0f} MB named, best of {args.repeat}")  # fmt: skip
    print(f"{'':<44} {'CPU s':>7}")
    for name, key in (("scan without hashing (FnApiRunner, 1 worker)", "plain"), ("scan as shipped (CRC-32)", "hashed"),
                      ("featurize only, without hashing", "f_plain"), ("featurize only, CRC-32", "f_hashed")):  # fmt: skip
        print(f"{name:<44} {best[key]:>7.2f}")
    print(f"scan time ratio hashed / not hashed: {best['hashed'] / best['plain']:.3f}")
    print(f"featurize time ratio hashed / not hashed: {best['f_hashed'] / best['f_plain']:.3f}")
    extra = t_validate - t_plain_validate
    print(f"validate --data: {t_validate:.2f} s ({t_plain_validate:.2f} s without --data): "
          f"{read / 1e9 / max(extra, 1e-9):.2f} GB per CPU-second over the data files")  # fmt: skip
    return 0


def _bytes_named(out: Path) -> int:
    """Bytes of every file the samples name (as recorded)."""
    import pyarrow.parquet as pq

    t = pq.read_table(out / schemas.SAMPLES_DIR, columns=["path_bytes", "sweep_bytes", "label_bytes"])
    sweeps = sum(sum(s) for s in t["sweep_bytes"].to_pylist() if s)
    return int(sum(t["path_bytes"].to_pylist()) + sweeps + sum(v or 0 for v in t["label_bytes"].to_pylist()))


if __name__ == "__main__":
    sys.exit(main())
