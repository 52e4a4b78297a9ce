"""Balance benchmark: predicted DDP linearity of every strategy against the equal-count greedy reference.

    python benchmarks/balance_bench.py [--quick] [--costs costs.npy|samples.parquet] [--n 65536]
    python benchmarks/balance_bench.py --timing [--timing-n 1000000]   # only the planning times
    python benchmarks/balance_bench.py --caps-timing 10000,100000,1000000   # budget under a cap
    python benchmarks/balance_bench.py --small   # budget on pools of a few thousand samples

Prints one row per (cost distribution, W, B): the greedy reference and each strategy's linearity
(sum of mean rank cost / sum of max rank cost), and the pair-repeat rate (% of the pairs sharing
a step in epoch 0 that share one in epoch 1) of balanced and random. A second table puts
linearity and diversity side by side for every strategy: linearity minus the reference, the pair
repeat rate as a multiple of ``random``'s, and ``mate_cost_correlation`` (0 = every step holds the
whole size mix, 1 = steps of cost neighbours). Then the targets and the planning time of one
1M-sample epoch (W=64, B=2) as a ratio against ``random`` in the same process, and ``budget``'s
time as a ratio against ``balanced``'s on the same pool (``--timing``: only this part). ``budget`` (equal
cost per rank-step, variable counts) also prints its mean samples per rank-step as a multiple of
B, its targets, a small-pool table (4,096 samples: linearity, reference, pair repeat rates), a caps
table (a heavy-tailed pool, the most points any rank gets at one step per strategy against a
--max-points-per-rank-step cap) and ``budget``'s planning time under that cap for growing pools, with
the exponent of time against pool size between rows (1 linear, 2 quadratic).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.features.buckets import fit_pool
from lidarshard.transforms.plan import STRATEGIES, plan_epoch
from lidarshard.transforms.plan.caps import Caps, PoolLimits, rank_step_sums
from lidarshard.transforms.plan.metrics import (
    equal_count_pool,
    greedy_reference_linearity,
    linearity,
    mate_cost_correlation,
    pair_repeat_rate,
    speed_linearity,
)
from lidarshard.transforms.plan.speeds import normalized

COMPARED = ("random", "stratified", "megabatch", "balanced", "mixed", "budget", "rebalance")
SEED = 0


def synth_costs(n: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """(n,) modelled 10-sweep voxel costs: 2.5% single-frame (~25k) and multi-sweep scenes.

    Multi-sweep samples cost 4x-7x a single frame depending on the scene type (8 types with
    random shares), with ~10% spread within a type.
    """
    single = rng.random(n) < 0.025
    mult = np.linspace(4.0, 7.0, 8)[rng.choice(8, n, p=rng.dirichlet(np.full(8, 2.0)))]
    return 25_000.0 * np.where(single, 1.0, mult) * rng.lognormal(0.0, 0.1, n)


def load_costs(path: Path, column: str) -> NDArray[np.float64]:
    """(N,) costs from a .npy array or a Parquet column."""
    if path.suffix == ".npy":
        return np.load(path).astype(np.float64).ravel()
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=[column]).column(column).to_numpy().astype(np.float64)


def bench_cell(costs: NDArray[np.float64], w: int, b: int) -> dict[str, float]:
    """For one cell: the greedy reference and, per compared strategy, linearity (key = name), pair repeat
    rate in % (``pairs_<name>``) and mate cost correlation (``mates_<name>``)."""
    pool, _, _ = fit_pool(np.arange(costs.size), w * b, "drop_last", np.random.default_rng(SEED))
    c = costs[pool]
    row: dict[str, float] = {"P": c.size, "reference": greedy_reference_linearity(c, w, b)}
    for name in COMPARED:
        first = plan_epoch(name, c, w, b, seed=SEED, epoch=0)
        again = plan_epoch(name, c, w, b, seed=SEED, epoch=1)
        row[name] = linearity(first, c)
        row[f"pairs_{name}"] = 100.0 * pair_repeat_rate(first, again)
        row[f"mates_{name}"] = mate_cost_correlation(first, c)
        if name == "budget":  # counts per rank-step vary: their mean as a multiple of B
            row["count"] = float((first >= 0).sum(axis=-1).mean() / b)
    return row


def print_table(dists: dict[str, NDArray[np.float64]], worlds: list[int], batches: list[int]) -> list:
    head = f"{'dist':<10}{'W':>5}{'B':>3}{'P':>8}{'reference':>10}" + "".join(
        f"{n[:10]:>11}" for n in COMPARED
    )
    print(head + f"{'bud-cnt/B':>10}{'bal-ref':>11}{'pair%bal':>10}{'pair%bud':>10}{'pair%rnd':>10}")
    rows = []
    for dname, costs in dists.items():
        for w in worlds:
            for b in batches:
                if costs.size < w * b:
                    continue
                r = bench_cell(costs, w, b)
                rows.append((dname, w, b, r))
                cells = "".join(f"{r[n]:>11.4f}" for n in COMPARED)
                print(
                    f"{dname:<10}{w:>5}{b:>3}{r['P']:>8}{r['reference']:>10.4f}{cells}{r['count']:>10.3f}"
                    f"{r['balanced'] - r['reference']:>+11.4f}"
                    f"{r['pairs_balanced']:>10.3f}{r['pairs_budget']:>10.3f}{r['pairs_random']:>10.3f}"
                )
    return rows


def print_diversity(rows: list) -> None:
    """Second table: per strategy, linearity - reference / pair repeat x random / mate correlation."""
    print(
        "\nlinearity - greedy reference / pair repeat rate as a multiple of random's / mate cost correlation"
    )
    print(f"{'dist':<10}{'W':>5}{'B':>3}{'pair%rnd':>10}" + "".join(f"{n[:10]:>24}" for n in COMPARED))
    for dname, w, b, r in rows:
        rnd = r["pairs_random"]
        cells = "".join(
            f"{r[n] - r['reference']:>+9.4f} {r[f'pairs_{n}'] / rnd if rnd else float('nan'):>6.2f}x"
            f"{r[f'mates_{n}']:>+7.2f}"
            for n in COMPARED
        )
        print(f"{dname:<10}{w:>5}{b:>3}{rnd:>10.3f}{cells}")


def check_targets(rows: list) -> None:
    synth = [r for d, w, b, r in rows if d == "synth" and (w, b) == (16, 2)]
    if synth:
        lin = synth[0]["balanced"]
        print(f"target balanced >= 0.99 at synth W=16 B=2: {lin:.4f} {'OK' if lin >= 0.99 else 'MISS'}")
    misses = [(d, w, b) for d, w, b, r in rows if w <= 64 and r["balanced"] < r["reference"] - 0.01]
    print(
        f"target balanced within 0.01 of the reference (W <= 64): {'OK' if not misses else f'MISS {misses}'}"
    )
    for name in ("balanced", "mixed"):
        far = [(d, w, b) for d, w, b, r in rows if r[name] < r["reference"] - 0.005 - 1e-9]
        print(f"target {name} within 0.005 of the reference: {'OK' if not far else f'MISS {far}'}")
        many = [(d, w, b) for d, w, b, r in rows if b >= 2 and r[f"pairs_{name}"] > 1.5 * r["pairs_random"]]
        print(f"target {name} pair repeat <= 1.5x random (B >= 2): {'OK' if not many else f'MISS {many}'}")
    low = [(d, w, b, round(r["budget"], 4)) for d, w, b, r in rows if r["budget"] < 0.99]
    hard = sum(r["reference"] < 0.95 for *_, r in rows)
    print(
        f"target budget >= 0.99 in all {len(rows)} cells ({hard} with reference < 0.95): "
        f"{'OK' if not low else f'MISS in {len(low)}: {low}'}"
    )
    off = [(d, w, b, round(r["count"], 3)) for d, w, b, r in rows if abs(r["count"] - 1) > 0.05]
    print(f"target budget mean count per rank-step within 5% of B: {'OK' if not off else f'MISS {off}'}")


def caps_pool(n: int, w: int, b: int) -> tuple[NDArray[np.float64], PoolLimits]:
    """Heavy-tailed pool (points ~ lognormal sigma 1.0, cost = points) of about ``n`` samples with a
    --max-points-per-rank-step cap of three median rank-steps: (costs (P,), limits)."""
    rng = np.random.default_rng(SEED + 1)
    points = np.round(rng.lognormal(np.log(30_000), 1.0, n - n % (w * b))).astype(np.int64)
    cap = int(3 * b * np.median(points))  # three times a median rank-step
    points = points[points <= cap]  # a sample alone above the cap would be rejected as over_cap
    points = points[: points.size - points.size % (w * b)]
    return points.astype(np.float64), PoolLimits(Caps(max_points=cap), points)


def caps_table(n: int, w: int = 16, b: int = 2) -> None:
    """Heavy-tailed pool (points ~ lognormal sigma 1.0): the most points one rank gets at one step."""
    costs, limits = caps_pool(n, w, b)
    points, cap = limits.points, limits.caps.max_points
    assert points is not None and cap is not None
    print(
        f"\ncaps: heavy-tailed pool, {points.size:,} samples, W={w} B={b}, --max-points-per-rank-step {cap:,}"
    )
    print(f"{'strategy':<12}{'max points/rank-step':>22}{'x cap':>8}{'rank-steps over':>17}{'linearity':>11}")
    for name in COMPARED:
        plan = plan_epoch(name, costs, w, b, seed=SEED, epoch=0, limits=limits if name == "budget" else None)
        sums = rank_step_sums(plan, points)
        print(
            f"{name:<12}{int(sums.max()):>22,}{sums.max() / cap:>8.2f}{int((sums > cap).sum()):>17}"
            f"{linearity(plan, costs):>11.4f}"
        )


def time_caps(sizes: list[int], w: int = 16, b: int = 2) -> None:
    """``budget``'s planning time under a points cap (``caps_pool``) for growing pools: the time
    ratio against the pool ratio shows the scaling (exponent 1 = linear, 2 = quadratic)."""
    print(f"\nbudget planning time with a points cap (caps_pool, W={w} B={b}):")
    print(f"{'samples':>10}{'seconds':>10}{'x time':>9}{'x samples':>11}{'exponent':>10}{'linearity':>11}")
    last: tuple[int, float] | None = None
    for n in sizes:
        costs, limits = caps_pool(n, w, b)
        t = time.perf_counter()
        plan = plan_epoch("budget", costs, w, b, seed=SEED, epoch=0, limits=limits)
        took = time.perf_counter() - t
        grow = ""
        if last is not None:
            rt, rn = took / last[1], costs.size / last[0]
            grow = f"{rt:>9.2f}{rn:>11.2f}{np.log(rt) / np.log(rn):>10.2f}"
        print(f"{costs.size:>10,}{took:>10.2f}{grow:<30}{linearity(plan, costs):>11.4f}")
        last = (costs.size, took)


def small_pools(n: int = 4096) -> None:
    """``budget`` on pools of a few thousand samples: linearity against the equal-count reference,
    and pair repeat rates (%) of budget and random; the target holds where every rank gets at least
    256 samples per epoch (with fewer, one heavy-tailed sample can be a large share of a rank's
    epoch)."""
    rng = np.random.default_rng(SEED + 2)
    dists = {f"logn{s}": rng.lognormal(0.0, s, n) for s in (0.3, 0.6, 1.0)}
    dists["synth"] = synth_costs(n, rng)
    print(f"\nbudget on small pools ({n:,} samples):")
    print(
        f"{'dist':<10}{'W':>5}{'B':>3}{'P/W':>6}{'reference':>10}{'budget':>9}{'pair%bud':>10}{'pair%rnd':>10}"
    )
    low = []
    for dname, costs in dists.items():
        for w in (4, 16, 64):
            for b in (1, 2, 4):
                c = costs[: costs.size - costs.size % (w * b)]
                plans = [
                    plan_epoch(name, c, w, b, seed=SEED, epoch=e)
                    for name in ("budget", "random")
                    for e in (0, 1)
                ]
                lin, ref = linearity(plans[0], c), greedy_reference_linearity(c, w, b)
                if c.size // w >= 256 and lin < 0.99:
                    low.append((dname, w, b, round(lin, 4)))
                pairs = [100 * pair_repeat_rate(plans[i], plans[i + 1]) for i in (0, 2)]
                print(
                    f"{dname:<10}{w:>5}{b:>3}{c.size // w:>6}{ref:>10.4f}{lin:>9.4f}"
                    f"{pairs[0]:>10.3f}{pairs[1]:>10.3f}"
                )
    print(f"target budget >= 0.99 on small pools (P/W >= 256): {'OK' if not low else f'MISS {low}'}")


def time_plans(n: int) -> None:
    """Wall time of one epoch per strategy on the same pool, as ratios against random and balanced."""
    costs = np.random.default_rng(SEED).lognormal(0.0, 1.0, n - n % 128)
    print(f"\nplan_epoch time, {costs.size:,} samples, W=64 B=2 (lognormal sigma=1.0):")
    took = {}
    for name in STRATEGIES:
        t = time.perf_counter()
        plan_epoch(name, costs, 64, 2, seed=SEED, epoch=0)
        took[name] = time.perf_counter() - t
        print(f"  {name:<11}{took[name]:8.3f} s   x{took[name] / took['random']:6.1f} random")
    print(f"  budget / balanced: x{took['budget'] / took['balanced']:.1f} on the same pool")


#: Rank speed profiles of the mixed-hardware table (``--rank-speed``), tiled over W ranks.
SPEED_PROFILES = {
    "2 gens 1/0.6": (1.0, 1.0, 0.6, 0.6),
    "one fast 2x": (2.0, 1.0, 1.0, 1.0),
    "4 gens": (1.0, 0.5, 0.75, 1.0),
}


def speeds_table(n: int) -> list[float]:
    """Mixed hardware: linearity of the ranks' times (cost / speed) for budget planned for the speeds,
    budget planned without them, and mixed (each step's heaviest batch to the fastest rank); returns
    budget's values."""
    print(f"\nmixed hardware: time linearity (cost / speed), n = {n}, seed {SEED}")
    print(f"{'dist':<10}{'W':>4}{'B':>3}  {'speeds':<14}{'budget':>9}{'no speeds':>11}{'mixed':>8}")
    rng = np.random.default_rng(SEED)
    dists = {"synth": synth_costs(n, rng), **{f"logn{s}": rng.lognormal(0.0, s, n) for s in (0.3, 0.6, 1.0)}}
    got = []
    for dname, costs in dists.items():
        for w, b in ((16, 2), (16, 4), (64, 4)):
            for pname, profile in SPEED_PROFILES.items():
                speeds = normalized(np.resize(np.asarray(profile), w))
                pool = equal_count_pool(costs, w, b)
                mine = plan_epoch("budget", costs, w, b, seed=SEED, epoch=0, speeds=speeds)
                plain = plan_epoch("budget", costs, w, b, seed=SEED, epoch=0)
                mixed = plan_epoch("mixed", pool, w, b, seed=SEED, epoch=0, speeds=speeds)
                row = [
                    speed_linearity(p, c, speeds) for p, c in ((mine, costs), (plain, costs), (mixed, pool))
                ]
                got.append(row[0])
                print(f"{dname:<10}{w:>4}{b:>3}  {pname:<14}{row[0]:>9.4f}{row[1]:>11.4f}{row[2]:>8.4f}")
    print(f"budget with speeds: min {min(got):.4f}, median {float(np.median(got)):.4f} over {len(got)} cells")
    return got


def smoke(n: int = 2048) -> None:
    """Every table and timing of a full run on pools of ``n`` samples, W in {4, 16}: what the test
    suite runs to keep this script working (its figures mean little at this size)."""
    rng = np.random.default_rng(SEED)
    dists = {f"logn{s}": rng.lognormal(0.0, s, n) for s in (0.3, 0.6, 1.0)}
    dists["synth"] = synth_costs(n, rng)
    rows = print_table(dists, [4, 16], [1, 2])
    print_diversity(rows)
    check_targets(rows)
    small_pools(n)
    speeds_table(n)
    caps_table(n)
    time_caps([1_000, 2_000])
    time_plans(n)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller pools and grid (~seconds)")
    ap.add_argument("--smoke", action="store_true", help="every table on tiny pools (the test suite's run)")
    ap.add_argument("--costs", type=Path, help="real costs: .npy, or Parquet with --column")
    ap.add_argument("--column", default="cost")
    ap.add_argument("--n", type=int, default=65_536, help="samples per synthetic distribution")
    ap.add_argument("--timing", action="store_true", help="only the planning times (no tables)")
    ap.add_argument("--timing-n", type=int, help="pool size of the planning times (default 1M, --quick 200k)")
    ap.add_argument(
        "--caps-timing",
        help="only budget's planning time with a points cap for these pool sizes (e.g. 10000,100000,1000000)",
    )
    ap.add_argument("--small", action="store_true", help="only the small-pool table")
    ap.add_argument("--speeds", action="store_true", help="only the mixed-hardware (--rank-speed) table")
    args = ap.parse_args(argv)
    if args.smoke:
        smoke()
        return
    if args.speeds:
        speeds_table(16_384 if args.quick else args.n)
        return
    if args.caps_timing:
        time_caps([int(v) for v in args.caps_timing.split(",")])
        return
    if args.small:
        small_pools()
        return
    timing_n = args.timing_n or (200_000 if args.quick else 1_000_000)
    if args.timing:
        time_plans(timing_n)
        return
    n = 16_384 if args.quick else args.n
    rng = np.random.default_rng(SEED)
    dists = {f"logn{s}": rng.lognormal(0.0, s, n) for s in (0.3, 0.6, 1.0)}
    dists["synth"] = load_costs(args.costs, args.column) if args.costs else synth_costs(n, rng)
    worlds = [4, 16, 64] if args.quick else [4, 16, 64, 256]
    rows = print_table(dists, worlds, [1, 2, 4])
    print_diversity(rows)
    check_targets(rows)
    small_pools()
    speeds_table(n)
    caps_table(n)
    time_caps([10_000, 20_000, 40_000] if args.quick else [10_000, 100_000, 1_000_000])
    time_plans(timing_n)


if __name__ == "__main__":
    main()
