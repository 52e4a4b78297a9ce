"""Each rank's relative speed learned from the training recorder's files, for ``--rank-speed @fit.json``. Pure.

With the cost model fitted to every rank's timings (``tools.timings.fit_cost``), each recorded rank-step
has a ratio ``measured ms / predicted ms``; a rank's *factor* is the median of its ratios weighted by the
predicted ms (a stalled step moves it no more than any other step; small steps, whose relative noise
is largest, weigh least), the factors scaled to mean 1. A slower rank takes longer than predicted at
every step, so its factor is above 1; its speed is ``1 / factor``, written with the fastest rank at 1 (the planner only
uses the ratios). The uncertainty is a 95% bootstrap interval: each rank's steps resampled
``BOOTSTRAP`` times (a fixed seed: the same files give the same numbers), the factors of each resample
scaled to mean 1 again (their interval) and its speeds to its fastest rank at 1 (theirs).

The timings tell the ranks apart only when every rank recorded at least ``MIN_STEPS`` steps, some rank's
interval excludes 1, and the fastest rank is at least ``MIN_SPREAD`` faster than the slowest; otherwise
``learn_speeds`` says why in one line and gives no speeds (calibrate then writes no ``rank_speed``, and
``--rank-speed @fit.json`` refuses the file with that line).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

__all__ = ["MIN_STEPS", "MIN_SPREAD", "BOOTSTRAP", "learn_speeds", "speed_lines"]

#: Fewest recorded steps per rank the speeds are learned from.
MIN_STEPS = 8
#: Smallest spread (fastest / slowest - 1) worth planning for: below, the ranks count as equal.
MIN_SPREAD = 0.02
#: Bootstrap resamples of the steps behind the 95% interval.
BOOTSTRAP = 200


Pairs = list[tuple[NDArray[np.float64], NDArray[np.float64]]]  # per rank: (measured, predicted) ms


def _weighted_median(ratio: NDArray[np.float64], weight: NDArray[np.float64]) -> float:
    """The ratio at which half the weight lies below (the lower one on a tie)."""
    order = np.argsort(ratio, kind="stable")
    cum = np.cumsum(weight[order])
    return float(ratio[order][np.searchsorted(cum, 0.5 * cum[-1])])


def _factors(pairs: Pairs) -> NDArray[np.float64]:
    """(W,) each rank's predicted-ms-weighted median of measured / predicted, scaled to mean 1."""
    ratios = np.array([_weighted_median(m / p, p) for m, p in pairs])
    return ratios / ratios.mean()


def _draws(pairs: Pairs) -> NDArray[np.float64]:
    """(BOOTSTRAP, W) the factors of each bootstrap resample of every rank's steps."""
    rng = np.random.default_rng(0)
    draws = np.empty((BOOTSTRAP, len(pairs)))
    for b in range(BOOTSTRAP):
        picks = [rng.integers(0, p.size, p.size) for _, p in pairs]
        draws[b] = _factors([(m[i], p[i]) for (m, p), i in zip(pairs, picks, strict=True)])
    return draws


def _interval(draws: NDArray[np.float64]) -> tuple[list[float], list[float]]:
    """(W,) low and high ends of the 95% interval of (B, W) bootstrap draws."""
    return np.percentile(draws, 2.5, axis=0).tolist(), np.percentile(draws, 97.5, axis=0).tolist()


def learn_speeds(obs: pa.Table, predicted: NDArray[np.float64]) -> dict:
    """Each rank's speed from recorded rank-steps.

    Args:
        obs: ``tools.fit.step_observations`` rows (``rank``, ``world_size``, ``ms``), n rows.
        predicted: (n,) ms the fitted cost model predicts for each row.

    Returns:
        ``{"world_size", "steps", "factor", "factor_low", "factor_high", "speed", "speed_low",
        "speed_high", "distinguished", "note"}``: per-rank lists (speeds fastest = 1; empty when the
        timings cannot tell), ``note`` the one line saying what was learned or why not.
    """
    rank = obs.column("rank").to_numpy()
    world = int(obs.column("world_size").to_numpy().max()) if obs.num_rows else 0
    ms = obs.column("ms").to_numpy()
    predicted = np.asarray(predicted, dtype=np.float64)
    empty: dict[str, list[float]] = {
        k: [] for k in ("factor", "factor_low", "factor_high", "speed", "speed_low", "speed_high")
    }
    if world > rank.size:  # more ranks than rows: some recorded nothing (nothing sized by the world size)
        present = np.unique(rank)
        gap = np.flatnonzero(present != np.arange(present.size))
        r = int(gap[0]) if gap.size else int(present.size)
        note = f"cannot tell the ranks' speeds apart: rank {r} recorded 0 steps, fewer than {MIN_STEPS}"
        return {"world_size": world, "steps": [], "distinguished": False} | empty | {"note": note}
    pairs = [
        (ms[(rank == r) & (predicted > 0)], predicted[(rank == r) & (predicted > 0)]) for r in range(world)
    ]
    steps = [int(p.size) for _, p in pairs]
    out: dict = {"world_size": world, "steps": steps, "distinguished": False}
    if world < 2:
        return out | empty | {"note": "cannot tell the ranks' speeds apart: the timings hold one rank"}
    if min(steps) < MIN_STEPS:
        r = int(np.argmin(steps))
        return (
            out
            | empty
            | {
                "note": f"cannot tell the ranks' speeds apart: rank {r} recorded {steps[r]} steps, "
                f"fewer than {MIN_STEPS}"
            }
        )
    factor, draws = _factors(pairs), _draws(pairs)
    low, high = _interval(draws)
    speed_low, speed_high = _interval(draws.min(axis=1, keepdims=True) / draws)  # each draw's fastest = 1
    fastest = factor.min()
    out |= {
        "factor": factor.tolist(),
        "factor_low": low,
        "factor_high": high,
        "speed": (fastest / factor).tolist(),
        "speed_low": speed_low,
        "speed_high": speed_high,
    }
    spread = float(factor.max() / fastest - 1)
    if all(lo <= 1 <= hi for lo, hi in zip(low, high, strict=True)):
        return out | {
            "note": "cannot tell the ranks' speeds apart: every rank's 95% interval includes the mean"
        }
    if spread < MIN_SPREAD:
        return out | {
            "note": f"cannot tell the ranks' speeds apart: they differ by {100 * spread:.1f}%, "
            f"less than {100 * MIN_SPREAD:g}%"
        }
    return out | {"distinguished": True, "note": f"the ranks' speeds differ by up to {100 * spread:.1f}%"}


def speed_lines(speeds: dict) -> list[str]:
    """The learned speeds as printed: one line per rank with its interval, then the note."""
    lines = [
        f"rank {r}: speed {s:.3f} (95% interval {lo:.3f}..{hi:.3f}) over {n} steps"
        for r, (s, lo, hi, n) in enumerate(
            zip(speeds["speed"], speeds["speed_low"], speeds["speed_high"], speeds["steps"], strict=False)
        )
    ]
    return lines + [
        speeds["note"] + ("; plan for them with --rank-speed @FILE" if speeds["distinguished"] else "")
    ]
