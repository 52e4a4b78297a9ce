"""Hierarchical planning (issue 38): the balance of a plan of G step groups against the single pool's.

    python benchmarks/groups_bench.py [--n 4194304] [--groups 1,2,4] [--strategies mixed,balanced]
        [--world-size 64] [--batch-size 2] [--group-size 1048576]

On one set of N modelled 10-sweep costs (``balance_bench.synth_costs``) plans epochs 0 and 1 with every
strategy and G (``--plan-groups``; samples dealt by the stable hash of their sample_id, seed and epoch)
and prints, per (strategy, G): the predicted linearity, the random baseline's, the greedy reference, the
pair repeat rate of epochs 0 -> 1 and each one's difference to G = 1 on the same costs, with the issue's
target (|linearity and pair repeat difference| <= 0.002). Then the cost of planning one group of
``--group-size`` samples (the unit a worker plans): seconds and peak traced memory (``tracemalloc``:
numpy's arrays), from which docs/RUNNERS.md projects 10^8 and 10^9 samples. Consistency lines: every
plan holds exactly the samples its pools drew (``check ... True``).
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from balance_bench import synth_costs  # noqa: E402

from lidarshard.transforms.core import groups  # noqa: E402
from lidarshard.transforms.core.config import PlanConfig  # noqa: E402
from lidarshard.transforms.core.planner import bucket_costs, plan_samples  # noqa: E402
from lidarshard.transforms.plan.metrics import pair_repeat_rate  # noqa: E402

TARGET = 0.002


def scored(n: int, seed: int = 0) -> pa.Table:
    """(n rows) of the plan columns: ids, modelled costs, their quantile buckets, points, weight 1."""
    rng = np.random.default_rng(seed)
    costs = synth_costs(n, rng)
    ids, _ = bucket_costs(costs, PlanConfig(1, 1))
    return pa.table(
        {
            "sample_id": pa.array([f"scene-{i:010d}" for i in range(n)]),
            "cost": costs,
            "bucket_id": pa.array(ids, pa.int32()),
            "num_points": (costs * 1.4).astype(np.int64),
            "weight": np.ones(n),
        }
    )


def _row(table: pa.Table, cfg: PlanConfig) -> dict[str, float]:
    """Linearities and the pair repeat rate of epochs 0 and 1, checking each plan's coverage."""
    first, second = (plan_samples(table, e, cfg) for e in (0, 1))
    for e, p in enumerate((first, second)):
        got = np.sort(p.plan[p.plan >= 0])
        ok = got.size == p.stats["planned"] and (np.diff(got) > 0).all()  # weights 1, drop_last: once each
        print(
            f"check {cfg.strategy} G={cfg.plan_groups} epoch {e}: every sample at most once, as planned: {ok}"
        )
    s = first.stats
    return {
        "linearity": s["linearity"],
        "random": s["random_linearity"],
        "reference": s["greedy_reference"],
        "pair": pair_repeat_rate(first.plan, second.plan),
        "dropped": s["dropped"],
    }


def group_cost(size: int, strategy: str, w: int, b: int) -> tuple[float, float]:
    """(seconds, peak traced MiB) of planning one group of ``size`` samples (``groups.plan_group``)."""
    table = scored(size, seed=1)
    rows = np.arange(size, dtype=np.int64)
    plain = table.drop(["sample_id"])
    cfg = PlanConfig(w, b, strategy=strategy, plan_groups=2)
    tracemalloc.start()
    t = time.perf_counter()
    groups.plan_group(plain, rows, 0, 0, cfg)
    secs = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return secs, peak / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1 << 22, help="samples")
    ap.add_argument("--groups", default="1,2,4", help="comma-separated G (the first is the reference)")
    ap.add_argument("--strategies", default="mixed,balanced")
    ap.add_argument("--world-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument(
        "--group-size", type=int, default=1 << 20, help="samples of the one-group cost run (0: none)"
    )
    args = ap.parse_args(argv)
    gs = [int(g) for g in args.groups.split(",")]
    w, b = args.world_size, args.batch_size
    table = scored(args.n)
    print(
        f"groups_bench: N={args.n:,} W={w} B={b}, epochs 0 and 1; differences to G={gs[0]} on the same costs"
    )
    print(f"{'strategy':>9} {'G':>4} {'per group':>10} {'linearity':>9} {'random':>7} {'reference':>9} "
          f"{'pair rep':>8} {'d lin':>8} {'d pair':>8} {'dropped':>7}")  # fmt: skip
    worst = 0.0
    for strategy in args.strategies.split(","):
        base = None
        for g in gs:
            r = _row(table, PlanConfig(w, b, epochs=2, strategy=strategy, plan_groups=g))
            base = base or r
            dl, dp = r["linearity"] - base["linearity"], r["pair"] - base["pair"]
            worst = max(worst, abs(dl), abs(dp))
            print(f"{strategy:>9} {g:>4} {args.n // g:>10,} {r['linearity']:>9.4f} {r['random']:>7.4f} "
                  f"{r['reference']:>9.4f} {r['pair']:>8.5f} {dl:>+8.4f} {dp:>+8.5f} {r['dropped']:>7}")  # fmt: skip
    print(
        f"target |d linearity|, |d pair repeat| <= {TARGET}: worst {worst:.4f} {'MET' if worst <= TARGET else 'MISSED'}"
    )
    if args.group_size:
        for strategy in args.strategies.split(","):
            secs, mib = group_cost(args.group_size, strategy, w, b)
            print(f"one group of {args.group_size:,} samples ({strategy}): {secs:.2f} s, peak traced {mib:.0f} MiB, "
                  f"{mib * 2**20 / args.group_size:.0f} bytes a sample")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
