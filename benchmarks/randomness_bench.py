"""Randomness benchmark: linearity against pair repeat, per strategy and cost distribution.

    python benchmarks/randomness_bench.py [--n 16384] [--seeds 3] [--quick]

Balance and randomness pull against each other: a plan balances by putting samples of similar
cost (or of similar batch sums) into the same step, and the heavier the tail, the fewer such
neighbours a heavy sample has, so the same samples meet again epoch after epoch. This prints,
per cost distribution and (W, B), each strategy's predicted linearity (mean over the epochs
planned) and its pair repeat rate (``metrics.pair_repeat_rate`` of epochs 0 and 1: the share of
step-mates that share a step again) in % and as a multiple of ``random``'s (``random`` is the
floor, about ``(W*B - 1) / (P - 1)``). Both are averaged over ``--seeds`` run seeds (8x as many on the
400-sample pool, where one epoch pair repeats only a handful of pairs). A closing table gives one line per strategy over the heavy-tailed
cells: "mixed: linearity X at Y x random's pair repeat".

Distributions: ``light`` (lognormal sigma 0.3), ``logn0.6``, ``logn1.0`` (``--n`` samples each), and
``heavy400`` (400 samples, lognormal sigma 1.0: a small heavy-tailed set, W=4 B=2 and W=8 B=2).
"""

from __future__ import annotations

import argparse

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan import plan_epoch
from lidarshard.transforms.plan.metrics import greedy_reference_linearity, linearity, pair_repeat_rate

COMPARED = ("random", "stratified", "balanced", "megabatch", "mixed", "budget", "rebalance")
#: Cells whose closing summary line is printed (heavy tails: where balance costs randomness).
HEAVY = ("logn1.0", "heavy400")
#: Small pools repeat few pairs (random: ~7 of 400 at W=4 B=2), so they average this many times more seeds.
SMALL_SEEDS = 8


def cell(costs: NDArray[np.float64], w: int, b: int, seeds: int) -> dict[str, tuple[float, float]]:
    """Per strategy: (mean linearity of epochs 0 and 1, mean pair repeat rate) over ``seeds`` seeds."""
    out: dict[str, tuple[float, float]] = {}
    for name in COMPARED:
        lins, reps = [], []
        for seed in range(seeds):
            first = plan_epoch(name, costs, w, b, seed=seed, epoch=0)
            again = plan_epoch(name, costs, w, b, seed=seed, epoch=1)
            lins += [linearity(first, costs), linearity(again, costs)]
            reps.append(pair_repeat_rate(first, again))
        out[name] = (float(np.mean(lins)), float(np.mean(reps)))
    return out


def grid(n: int, quick: bool) -> list[tuple[str, NDArray[np.float64], int, int]]:
    """(name, costs, W, B) cells; pools are cut to a whole number of steps."""
    rng = np.random.default_rng(0)
    dists = {"light": rng.lognormal(0.0, 0.3, n), "logn0.6": rng.lognormal(0.0, 0.6, n)}
    dists["logn1.0"] = rng.lognormal(0.0, 1.0, n)
    dists["heavy400"] = rng.lognormal(0.0, 1.0, 400)
    wbs = [(4, 2), (16, 2)] if quick else [(4, 2), (16, 2), (64, 2), (16, 4)]
    cells = []
    for name, costs in dists.items():
        for w, b in [(4, 2), (8, 2)] if name == "heavy400" else wbs:
            cells.append((name, costs[: costs.size - costs.size % (w * b)], w, b))
    return cells


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=16_384, help="samples of light, logn0.6 and logn1.0")
    ap.add_argument("--seeds", type=int, default=3, help="run seeds averaged per cell")
    ap.add_argument("--quick", action="store_true", help="fewer (W, B) and 4,096 samples")
    args = ap.parse_args(argv)
    n = 4096 if args.quick else args.n
    print("per strategy: linearity (mean of epochs 0, 1) / pair repeat as a multiple of random's")
    print(
        f"{'dist':<9}{'W':>4}{'B':>3}{'P':>7}{'reference':>10}{'rnd pair%':>10}"
        + "".join(f"{s:>17}" for s in COMPARED)
    )
    summary: dict[str, list[tuple[float, float]]] = {s: [] for s in COMPARED}
    for name, costs, w, b in grid(n, args.quick):
        r = cell(costs, w, b, args.seeds * (SMALL_SEEDS if costs.size < 1000 else 1))
        rnd = r["random"][1]
        ref = greedy_reference_linearity(costs, w, b)
        cells = "".join(f"{lin:>9.4f} {rep / rnd:>6.2f}x" for lin, rep in r.values())
        print(f"{name:<9}{w:>4}{b:>3}{costs.size:>7}{ref:>10.4f}{100 * rnd:>10.4f}{cells}")
        if name in HEAVY:
            for s, (lin, rep) in r.items():
                summary[s].append((lin, rep / rnd))
    print(
        f"\nheavy tails ({', '.join(HEAVY)}; mean over their cells): linearity at a multiple of random's pair repeat"
    )
    for s, values in summary.items():
        lin, mult = np.mean(values, axis=0)
        print(f"  {s}: linearity {lin:.4f} at {mult:.2f}x random's pair repeat")


if __name__ == "__main__":
    main()
