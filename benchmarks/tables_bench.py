"""nuScenes table loading scales linearly in records: ``load_tasks`` on N and 4N keyframes.

    python benchmarks/tables_bench.py [--keyframes 20000] [--per 10] [--sweeps 2]

Builds in-memory tables of ``keyframes * per`` LIDAR_TOP sample_data records (a keyframe every
``per`` records, each chained by ``prev``), times ``load_tasks`` on N and 4N keyframes in this process
and prints the time ratio: about 4 when the joins are dict lookups, about 16 for a quadratic scan.
"""

from __future__ import annotations

import argparse
import json
import time

from lidarshard.transforms.layouts.nuscenes_tasks import load_tasks

VERSION = "v1.0-bench"
_IDENTITY = {"translation": [0.0, 0.0, 0.0], "rotation": [1.0, 0.0, 0.0, 0.0]}


def _tables(n_key: int, per: int) -> dict[str, bytes]:
    rows = [
        {
            "token": f"t{i}",
            "sample_token": f"s{i // per}",
            "ego_pose_token": "p",
            "calibrated_sensor_token": "c",
            "filename": f"samples/L/{i}.bin",
            "timestamp": i,
            "is_key_frame": i % per == per - 1,
            "prev": f"t{i - 1}" if i % per else "",
        }
        for i in range(n_key * per)
    ]
    tables = {
        "sample_data": rows,
        "calibrated_sensor": [{"token": "c", "sensor_token": "l"} | _IDENTITY],
        "sensor": [{"token": "l", "channel": "LIDAR_TOP"}],
        "ego_pose": [{"token": "p"} | _IDENTITY],
        "sample": [{"token": f"s{k}", "scene_token": f"scene{k}"} for k in range(n_key)],
    }
    return {f"/r/{VERSION}/{k}.json": json.dumps(v).encode() for k, v in tables.items()}


def _time(n_key: int, per: int, sweeps: int) -> float:
    data = _tables(n_key, per)

    def read_bytes(path: str, limit: int | None = None) -> bytes:
        if path not in data:
            raise FileNotFoundError(path)
        return data[path]

    start = time.perf_counter()
    tasks, rejects = load_tasks("/r", VERSION, sweeps, read_bytes)
    elapsed = time.perf_counter() - start
    if len(tasks) != n_key or rejects or any(len(t.sweeps) != sweeps for t in tasks):
        raise SystemExit(f"wrong result: {len(tasks)} tasks, {len(rejects)} rejects")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keyframes", type=int, default=20_000)
    ap.add_argument("--per", type=int, default=10, help="sample_data records per keyframe")
    ap.add_argument("--sweeps", type=int, default=2)
    args = ap.parse_args()
    small = _time(args.keyframes, args.per, args.sweeps)
    large = _time(4 * args.keyframes, args.per, args.sweeps)
    print(f"load_tasks {args.keyframes * args.per:,} records: {small:.2f} s")
    print(f"load_tasks {4 * args.keyframes * args.per:,} records: {large:.2f} s")
    print(f"ratio for 4x the records: {large / small:.2f} (4 = linear, 16 = quadratic)")


if __name__ == "__main__":
    main()
