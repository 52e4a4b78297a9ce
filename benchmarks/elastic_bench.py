"""Elastic re-planning at scale: switch a 1M-sample epoch from 16x4 ranks to other shapes mid-epoch.

    python benchmarks/elastic_bench.py [--samples 1048576]

Plans one ``balanced`` epoch of lognormal costs on 16 ranks x 4, then re-plans the remaining steps
after a third of the epoch for 12x4 and 8x4. Prints each re-plan's time as a ratio to the original plan's time
(same process, same costs) and its linearity against the equal-count greedy reference.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lidarshard.loaders.elastic import ElasticPlan
from lidarshard.transforms.plan import plan_epoch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1 << 20)
    args = ap.parse_args()
    costs = np.exp(np.random.default_rng(0).normal(10.0, 0.6, args.samples))
    t = time.perf_counter()
    rows = plan_epoch("balanced", costs, 16, 4, seed=0, epoch=0)
    base_s = time.perf_counter() - t
    base = ElasticPlan.of(rows, costs, strategy="balanced")
    print(f"plan {args.samples:,} samples on 16x4: {base_s:.2f} s")
    consumed = base.steps // 3
    for w, b in [(12, 4), (8, None)]:
        t = time.perf_counter()
        p = base.switch(consumed, w, b)
        dt = time.perf_counter() - t
        bal = p.balance()
        print(
            f"re-plan after {consumed} steps -> {p.world_size}x{p.batch_size}: {dt:.2f} s "
            f"({dt / base_s:.2f}x the original plan), linearity {bal['linearity']:.4f}, "
            f"greedy reference {bal['greedy_reference']:.4f}"
        )


if __name__ == "__main__":
    main()
