"""The balance entry of an epoch planned in step groups (``transforms.core.groups``), from per-group sums. Pure.

Each group reports ``GroupSums`` (a few numbers and W rank totals, never its samples); ``combine``
turns the groups' sums, in group order, into the manifest's ``balance`` entry with the keys of
``metrics.balance_summary``:

- ``linearity``, ``random_linearity``, ``greedy_reference`` and the speed linearities: the sum over all
  steps of the mean rank load over the sum of the max rank load (the definition of
  ``metrics.load_linearity``, summed group by group); the greedy reference and the random baseline are
  those of each group's own pool (what a plan dealt into those groups can reach);
- ``worst_step_linearity``, ``max_count``: min / max over the groups; ``rank_total_cv`` from the summed
  (W,) rank totals; ``mean_count`` from the summed counts;
- ``spearman_step_cost``: the groups' values weighted by their steps (the interleave keeps each group's
  step order, so a size curriculum inside a group shows; the interleave itself is random).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan.metrics import (
    REFERENCE_KEY,
    equal_count_pool,
    rank_costs,
    spearman_step_cost,
    step_loads,
)

__all__ = ["GroupSums", "group_sums", "combine"]


@dataclass(frozen=True)
class GroupSums:
    """One group's balance sums. ``loads[k] = (sum of step means, sum of step maxes)`` for k in
    ``plan``, ``greedy``, ``random`` (and ``speed``, ``random_speed`` with rank speeds)."""

    steps: int
    loads: tuple[tuple[str, float, float], ...]
    worst: float  # min over steps of mean/max rank load (steps with a load), inf when none
    totals: tuple[float, ...]  # (W,) each rank's load over the group's steps
    counts: tuple[int, int, int]  # (samples, rank-steps, max samples of one rank-step)
    spearman: float


def _sums(loads: NDArray[np.float64]) -> tuple[float, float]:
    if not loads.size:
        return 0.0, 0.0
    return float(loads.mean(axis=1).sum()), float(loads.max(axis=1).sum())


def group_sums(
    plan: NDArray[np.int64],
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    baseline: NDArray[np.int64],
    speeds: Sequence[float] | None,
    step_cost: float = 0.0,
) -> GroupSums:
    """The sums of one group's plan (S, W, M) over its pool costs (P,), its ``random`` baseline (S', W, B)
    over the pool's equal-count part, with rank ``speeds`` (W,) or None; every rank-step holding a sample
    adds ``step_cost`` (``metrics.rank_costs``)."""
    w, b = world_size, batch_size
    fitted = equal_count_pool(costs, w, b)
    rc = rank_costs(plan, costs, step_cost)
    base = rank_costs(baseline, fitted, step_cost)
    loads = {
        "plan": rc,
        "greedy": step_loads(np.sort(fitted).reshape(-1, w * b), w, b) + step_cost,
        "random": base,
    }
    if speeds is not None:
        inv = 1.0 / np.asarray(speeds, dtype=np.float64)[None, :]
        loads |= {"speed": rc * inv, "random_speed": base * inv}
    step_max = rc.max(axis=1) if rc.size else np.empty(0)
    pos = step_max > 0
    worst = float((rc.mean(axis=1)[pos] / step_max[pos]).min()) if pos.any() else float("inf")
    counts = (plan >= 0).sum(axis=-1)
    return GroupSums(
        steps=int(plan.shape[0]),
        loads=tuple((k, *_sums(v)) for k, v in loads.items()),
        worst=worst,
        totals=tuple(float(t) for t in (rc.sum(axis=0) if rc.size else np.zeros(w))),
        counts=(int(counts.sum()), int(counts.size), int(counts.max(initial=0))),
        spearman=spearman_step_cost(plan, costs),
    )


_KEYS = {
    "plan": "linearity",
    "greedy": REFERENCE_KEY,
    "random": "random_linearity",
    "speed": "speed_linearity",
    "random_speed": "random_speed_linearity",
}


def combine(parts: Sequence[GroupSums], epoch: int, speeds: bool) -> dict[str, float | int]:
    """The epoch's ``balance`` entry (floats rounded to 6 decimals) from its groups' sums, in group order."""
    values: dict[str, float] = {}
    for key, name in _KEYS.items():
        if key.endswith("speed") and not speeds:
            continue
        mean = sum(s for p in parts for k, s, _ in p.loads if k == key)
        top = sum(t for p in parts for k, _, t in p.loads if k == key)
        values[name] = mean / top if top > 0 else 1.0
    steps = sum(p.steps for p in parts)
    worst = min(p.worst for p in parts)
    values["spearman_step_cost"] = sum(p.steps * p.spearman for p in parts) / steps if steps else 0.0
    values["worst_step_linearity"] = worst if np.isfinite(worst) else 1.0
    totals = np.sum([p.totals for p in parts], axis=0)
    values["rank_total_cv"] = float(totals.std() / totals.mean()) if totals.mean() > 0 else 0.0
    cells = sum(p.counts[1] for p in parts)
    values["mean_count"] = sum(p.counts[0] for p in parts) / cells if cells else 0.0
    out: dict[str, float | int] = {"epoch": int(epoch), "steps": int(steps)}
    out["max_count"] = max(p.counts[2] for p in parts)
    out.update({k: round(float(v), 6) for k, v in values.items()})
    return out
