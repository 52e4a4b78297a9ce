"""Reading from a slow object store: plan-aware prefetch against no prefetch and local files (issue 29).

    python benchmarks/remote_bench.py [--scenes 16] [--keyframes 10] [--delay-ms 50] [--workers 2] [--prefetch 4] [--s3]

Synthesizes and builds a nuScenes-style manifest (keyframe + 9 sweeps a sample, ``lidarshard synth``),
then trains nothing but the data path: ``PlanLoader(PointCloudDataset(OUT, ...), BalancedBatchSampler(OUT,
0, 1), num_workers=W)`` over the epoch, three ways, in one run:

- ``local``: the files on local disk (page cache warm), no prefetch: the figure to match;
- ``remote, prefetch 0``: every file behind ``--delay-ms`` per request, read when its batch is asked for
  (the files of one sample one after the other, as before lidarshard read ahead);
- ``remote, prefetch k``: the same store, each worker reading its next ``k`` batches ahead from the plan.

The store: by default ``delayed://``, the local files behind a backend that waits ``--delay-ms`` per
request and twice per read (S3 answers a read with a HEAD and a GET), so latency is all it adds. With
``--s3``: a real S3 server (``moto_server`` from the test extra) behind ``tests/s3_server.LatencyProxy``;
on a small machine the Python server's own CPU, not the latency, then limits the rate, so the script
also prints the server's rate without delay. Prints samples/s and the ratio to local. Linux/macOS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from synthetic import synth_build

REPO = Path(__file__).resolve().parents[1]


def _delayed_store():
    """``delayed://`` + a local absolute path: the file, after ``delay_s`` per request (2 a read), as a
    ``pyarrow.fs`` filesystem for ``storage.register_filesystem``."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    sys.path.insert(0, str(REPO))
    from tests.object_store import Handler

    class DelayedStore(Handler):
        delay_s = 0.05

        def get_file_info(self, paths: list[str]) -> list:
            time.sleep(self.delay_s)
            return [
                pafs.FileInfo(p, pafs.FileType.File, size=os.stat("/" + p.lstrip("/")).st_size) for p in paths
            ]

        def open_input_stream(self, path: str):
            time.sleep(2 * self.delay_s)  # HEAD + GET
            with open("/" + path.lstrip("/"), "rb") as f:
                return pa.BufferReader(f.read())

        open_input_file = open_input_stream

    return DelayedStore


def epoch(out: str, workers: int, **dataset_args) -> tuple[float, int]:
    """(seconds, samples) of one epoch of rank 0's plan through PlanLoader."""
    from lidarshard.loaders.torch import BalancedBatchSampler, PlanLoader, PointCloudDataset

    dataset = PointCloudDataset(out, **dataset_args)
    loader = PlanLoader(
        dataset, BalancedBatchSampler(out, 0, 1), num_workers=workers, collate_fn=lambda items: len(items)
    )
    start = time.perf_counter()
    samples = sum(loader)
    return time.perf_counter() - start, samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--scenes", type=int, default=16, help="synthetic scenes, --keyframes samples each (default 16)"
    )
    ap.add_argument("--keyframes", type=int, default=10, help="synth --keyframes-per-scene (default 10)")
    ap.add_argument("--delay-ms", type=float, default=50.0, help="latency per request (default 50)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    ap.add_argument("--prefetch", type=int, default=4, help="batches read ahead per worker (default 4)")
    ap.add_argument("--s3", action="store_true", help="a real S3 server (moto) behind a latency proxy")
    args = ap.parse_args(argv)
    from lidarshard.transforms.io import storage

    with tempfile.TemporaryDirectory(prefix="remote_bench.") as tmp, ExitStack() as stack:
        root, out = synth_build(Path(tmp), args.scenes, args.keyframes, world_size=1)
        rows = [("local", *epoch(out, args.workers, prefetch=0))]
        if args.s3:
            sys.path.insert(0, str(REPO))
            from tests.s3_server import LatencyProxy, S3Server, upload

            s3 = stack.enter_context(S3Server())
            upload(s3.filesystem(), root, f"{s3.bucket}/data")
            remote_root = s3.uri("data")
            with s3.environment():
                rows.append(
                    ("s3, no delay, prefetch 0", *epoch(out, args.workers, root=remote_root, prefetch=0))
                )
                rows.append(
                    (
                        "s3, no delay, prefetch k",
                        *epoch(out, args.workers, root=remote_root, prefetch=args.prefetch),
                    )
                )
            proxy = stack.enter_context(LatencyProxy(s3.port, args.delay_ms / 1000))
            stack.enter_context(s3.environment(proxy.endpoint))
        else:
            import pyarrow.fs as pafs

            store = _delayed_store()
            store.delay_s = args.delay_ms / 1000
            storage.register_filesystem("delayed", pafs.PyFileSystem(store()))
            remote_root = f"delayed://{root}"
        for k in (0, args.prefetch):
            rows.append(
                (
                    f"{args.delay_ms:g} ms/request, prefetch {k}",
                    *epoch(out, args.workers, root=remote_root, prefetch=k),
                )
            )
        local_rate = rows[0][2] / rows[0][1]
        print(
            f"\n{rows[0][2]} samples (keyframe + 9 sweeps: 10 files each), {args.workers} DataLoader workers"
        )
        print(f"{'store':34s}  {'seconds':>7s}  {'samples/s':>9s}  {'/ local':>7s}")
        for name, seconds, samples in rows:
            rate = samples / seconds
            print(f"{name:34s}  {seconds:7.2f}  {rate:9.1f}  {rate / local_rate:6.2f}x")
        print("target: prefetch >= 0.8x local at 50 ms a request")
        same = all(samples == rows[0][2] for _, _, samples in rows)
        print(f"every run delivered the same {rows[0][2]} samples: {same}")
        shutil.rmtree(root, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
