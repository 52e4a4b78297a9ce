"""Memory of DataLoader workers over a large manifest: flat across an epoch (issue 29).

    python benchmarks/worker_memory_bench.py [--samples 1000000] [--steps 0 (the epoch)] [--workers 2]

A forked DataLoader worker shares its parent's pages until it writes one; touching a Python object
writes its reference count, so a dataset holding one Python object per sample (a list of ids or
paths) makes every worker copy, page by page, what it touches: memory that grows across an epoch.
``PointCloudDataset`` keeps per-sample data in Arrow buffers and numpy arrays instead.

Writes ``--samples`` KITTI-style ``.bin`` files (hard links of a few 2,000-point files: a million cost seconds and
little space), plans them with ``lidarshard.write_manifest`` (W=8, B=4), then
runs ``PlanLoader(PointCloudDataset(OUT), BalancedBatchSampler(OUT, 0, 8), num_workers=W)`` for
``--steps`` steps and samples each worker's unique memory (USS: private pages, from
``/proc/PID/smaps_rollup``) and RSS every 1/20 of the way. Prints the series and the growth from the
first sample after warm-up to the end, per worker. Linux only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

W, B = 8, 4


def memory(pid: int) -> tuple[int, int]:
    """(USS, RSS) of ``pid`` in bytes: private (clean + dirty) and resident pages."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0]) * 1024
    return fields["Private_Clean"] + fields["Private_Dirty"], fields["Rss"]


def make_manifest(tmp: Path, n: int) -> str:
    """``n`` hard-linked point files and a manifest planning them; returns OUT."""
    import lidarshard
    from lidarshard import schemas

    data = tmp / "data"
    data.mkdir()
    cloud = np.random.default_rng(0).random((2000, 4), dtype=np.float32)
    paths = [str(data / f"{i:09d}.bin") for i in range(n)]
    for k, p in enumerate(paths):
        if k % 60_000 == 0:  # a filesystem allows ~65,000 links to one inode
            first = p
            cloud.tofile(first)
        else:
            os.link(first, p)
    rng = np.random.default_rng(1)
    points = rng.integers(1000, 200_000, n)
    cols = {
        "sample_id": [f"{i:09d}" for i in range(n)],
        "path": paths,
        "format": ["kitti_bin"] * n,
        "num_points": points,
        "num_in_range": points,
        "occupied_voxels": points // 3,
        "file_bytes": np.full(n, cloud.nbytes),
    }
    fields = schemas.sample_schema()
    table = pa.Table.from_arrays(
        [
            pa.array(cols[f.name], f.type)
            if f.name in cols
            else (pa.array([[]] * n, f.type) if pa.types.is_list(f.type) else pa.nulls(n, f.type))
            for f in fields
        ],
        schema=fields,
    )
    out = str(tmp / "out")
    lidarshard.write_manifest(table, out, W, B, epochs=1)
    return out


class _Pid:
    """Wraps a dataset so each batch says which worker process read it."""

    def __init__(self, dataset) -> None:
        self.dataset, self.prefetch = dataset, 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [{**self.dataset[i], "pid": os.getpid()} for i in indices]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1_000_000, help="samples in the manifest")
    ap.add_argument(
        "--steps", type=int, default=0, help="steps of rank 0 to run (default 0: its whole epoch)"
    )
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    args = ap.parse_args(argv)

    from lidarshard.loaders.torch import BalancedBatchSampler, PlanLoader, PointCloudDataset

    with tempfile.TemporaryDirectory(prefix="worker_memory.") as tmp:
        t0 = time.perf_counter()
        out = make_manifest(Path(tmp), args.samples)
        print(f"{args.samples} samples planned in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        dataset = PointCloudDataset(out, sweeps=False)
        sampler = BalancedBatchSampler(out, 0, W)
        steps = min(args.steps or len(sampler), len(sampler))
        loader = PlanLoader(
            _Pid(dataset), sampler, num_workers=args.workers, collate_fn=lambda items: items[0]["pid"]
        )
        series: dict[int, list[tuple[int, int, int]]] = {}
        every = max(1, steps // 20)
        t0 = time.perf_counter()
        for step, pid in enumerate(loader):
            if step % every < args.workers or step >= steps - args.workers:  # each worker's batch
                series.setdefault(pid, []).append((step, *memory(pid)))
            if step == steps - 1:
                break
        seconds = time.perf_counter() - t0
        print(
            f"\n{args.samples} samples, W={W} B={B}: rank 0 ran {steps} of {len(sampler)} steps "
            f"({steps * B} samples) in {seconds:.0f} s over {args.workers} workers"
        )
        print(f"{'worker':>8s}  {'step':>7s}  {'USS MiB':>8s}  {'RSS MiB':>8s}")
        for pid, rows in sorted(series.items()):
            for step, uss, rss in rows:
                print(f"{pid:8d}  {step:7d}  {uss / 2**20:8.1f}  {rss / 2**20:8.1f}")
        for pid, rows in sorted(series.items()):
            (s0, u0, r0), (s1, u1, r1) = rows[1], rows[-1]  # the first sample is before warm-up
            print(
                f"worker {pid}: steps {s0}..{s1}: USS {u0 / 2**20:.1f} -> {u1 / 2**20:.1f} MiB "
                f"({(u1 - u0) / 2**20:+.1f}), RSS {r0 / 2**20:.1f} -> {r1 / 2**20:.1f} MiB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
