"""Balance metrics of an epoch plan: what DDP would wait for, and how random the plan stays.

Linearity is the predicted scaling efficiency of synchronous data parallelism when step time is
proportional to the slowest rank's cost: ``sum_s mean_r cost[s, r] / sum_s max_r cost[s, r]``
(1.0 = no rank ever waits). A rank-step's cost is its samples' costs plus, with a cost model calibrated on
rank-steps (``launch_ms``), the ``step_cost`` every rank pays once per rank-step whatever its samples.
``load_linearity`` is the one place that formula is written; plans,
the greedy reference, reports, calibration and elastic re-plans all reduce to it. Nothing here plans:
the random baseline of ``balance_summary`` is planned by the caller. ``explain`` puts the numbers
in plain words (``plan_buys``, the ``COLUMNS`` glossary).

One definition each, whoever does the table work before them: an epoch's ``balance`` entry is
``balance_entry`` of the ``balance_sums`` of (S, W) sums per (step, rank) of its parts (the whole epoch
or each step group; the one-pool build, the grouped build on Beam and ``validate`` all call it); the pair
repeat rate is ``repeat_rate`` of step-mate pair counts (``mate_counts``; numpy, Beam or a query count).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan.lpt import chunk_rows, lpt_assign

__all__ = [
    "load_linearity", "rank_costs", "linearity", "step_linearity", "step_loads", "speed_linearity",
    "equal_count_pool", "greedy_reference_linearity", "REFERENCE_KEY",
    "spearman_step_cost", "mate_counts", "repeat_rate", "pair_repeat_rate", "plan_mates", "repeat_rates",
    "mate_cost_correlation", "BalanceSums", "balance_sums", "plan_sums", "balance_entry", "balance_summary",
]  # fmt: skip


def rank_costs(
    plan: NDArray[np.int64], costs: NDArray[np.float64], step_cost: float = 0.0
) -> NDArray[np.float64]:
    """(S, W) cost each rank processes at each step: ``costs[plan].sum(-1)``, ``-1`` slots count 0, plus
    ``step_cost`` at every rank-step that holds a sample."""
    loads = np.append(np.asarray(costs, dtype=np.float64), 0.0)[plan].sum(axis=-1)
    if step_cost:
        loads = loads + step_cost * (plan >= 0).any(axis=-1)
    return loads


def load_linearity(loads: NDArray[np.float64]) -> float:
    """``sum_s mean_r loads[s, r] / sum_s max_r loads[s, r]`` of (S, W) per-step, per-rank loads
    (predicted costs or measured times), in [1/W, 1]; 1.0 when empty or all zero."""
    loads = np.asarray(loads, dtype=np.float64)
    top = loads.max(axis=1).sum() if loads.size else 0.0
    return float(loads.mean(axis=1).sum() / top) if top > 0 else 1.0


def linearity(plan: NDArray[np.int64], costs: NDArray[np.float64], step_cost: float = 0.0) -> float:
    """Predicted linearity of ``plan`` (S, W, B) in [1/W, 1] (``step_cost``: ``rank_costs``); 1.0 for empty
    or zero-cost plans."""
    return load_linearity(rank_costs(plan, costs, step_cost))


def speed_linearity(plan: NDArray[np.int64], costs: NDArray[np.float64], speeds: Sequence[float]) -> float:
    """Linearity of the ranks' predicted *times* ``load / speed`` (``--rank-speed``, (W,) > 0): 1.0 when
    every rank finishes every step together."""
    return load_linearity(rank_costs(plan, costs) / np.asarray(speeds, dtype=np.float64)[None, :])


def step_linearity(step_costs: NDArray[np.float64], world_size: int, batch_size: int) -> float:
    """Linearity of steps split across ranks by ``lpt_assign`` (equal counts).

    Args:
        step_costs: (S, W*B) item costs per step.
    """
    if step_costs.shape[0] == 0:
        return 1.0
    return load_linearity(step_loads(step_costs, world_size, batch_size))


def step_loads(step_costs: NDArray[np.float64], world_size: int, batch_size: int) -> NDArray[np.float64]:
    """(S, W) rank loads of (S, W*B) item costs per step split across ranks by ``lpt_assign``."""
    s = step_costs.shape[0]
    if s == 0:  # a pool smaller than one equal-count step (a step group of ``budget``): no step
        return np.zeros((0, world_size))
    loads = np.empty((s, world_size))
    rows = chunk_rows(step_costs.shape[1])
    for a in range(0, s, rows):  # LPT's columns held for a chunk of steps at a time
        part = step_costs[a : a + rows]
        cols = lpt_assign(part, world_size, batch_size).reshape(part.shape[0], -1)
        loads[a : a + rows] = (
            np.take_along_axis(part, cols, axis=1).reshape(-1, world_size, batch_size).sum(-1)
        )
    return loads


def equal_count_pool(costs: NDArray[np.float64], world_size: int, batch_size: int) -> NDArray[np.float64]:
    """The pool's first ``P - P % (W*B)`` costs: what the equal-count references (the greedy reference,
    the random baseline) plan when a variable-count strategy used a pool of any size."""
    costs = np.asarray(costs, dtype=np.float64)
    return costs[: costs.size - costs.size % (world_size * batch_size)]


def greedy_reference_linearity(
    costs: NDArray[np.float64], world_size: int, batch_size: int, step_cost: float = 0.0
) -> float:
    """Linearity of the greedy equal-count reference plan (the manifest's ``greedy_reference``).

    Sort all costs, cut into consecutive steps of ``W*B``, split each step with equal-count LPT
    (largest first, to the least loaded rank with room). A strong heuristic, not a bound: a planner
    may beat it (``mixed`` and ``balanced`` do, slightly, on some pools; ``budget``, with unequal
    counts, often does).

    Args:
        costs: (P,) pool costs with ``P % (W*B) == 0``.
        step_cost: what every rank-step adds (``rank_costs``).
    """
    costs = np.asarray(costs, dtype=np.float64)
    step = world_size * batch_size
    if costs.size % step:
        raise ValueError(f"pool size {costs.size} is not a multiple of W*B = {step}")
    if not step_cost:
        return step_linearity(np.sort(costs).reshape(-1, step), world_size, batch_size)
    return load_linearity(step_loads(np.sort(costs).reshape(-1, step), world_size, batch_size) + step_cost)


#: The ``balance`` key of ``greedy_reference_linearity``.
REFERENCE_KEY = "greedy_reference"


def _average_ranks(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """(N,) ranks 0..N-1 of ``x``, ties sharing their mean rank."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    start = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    end = np.r_[start[1:], xs.size]
    ranks = np.empty(x.size)
    ranks[order] = np.repeat((start + end - 1) / 2.0, end - start)
    return ranks


def spearman_step_cost(plan: NDArray[np.int64], costs: NDArray[np.float64]) -> float:
    """Spearman correlation of step index vs the step's mean cost, in [-1, 1].

    ~0 means no size curriculum across the epoch; 0.0 when undefined (< 2 steps or constant).
    """
    return _step_spearman(rank_costs(plan, costs) if plan.size else np.empty((0, 1)))


def _step_spearman(loads: NDArray[np.float64]) -> float:
    """``spearman_step_cost`` of (S, W) rank loads: step index vs the step's mean load."""
    step_mean = loads.mean(axis=1)
    return _spearman(np.arange(step_mean.size, dtype=np.float64), step_mean)


def mate_counts(first: NDArray[np.integer], second: NDArray[np.integer]) -> tuple[int, int]:
    """Step-mate pair counts of plan entries, each given by (n,) ``first`` its step in the first epoch and
    (n,) ``second`` the step of the same sample in the second (-1: not planned there): (pairs of entries
    sharing a first-epoch step, those of them sharing a second-epoch step too). Counts of disjoint sets of
    first-epoch steps add up."""
    a, b = np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64)
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    new_a = np.r_[True, a[1:] != a[:-1]]
    n_a = np.diff(np.r_[np.flatnonzero(new_a), a.size])
    new_ab = new_a | np.r_[True, b[1:] != b[:-1]]
    k = np.diff(np.r_[np.flatnonzero(new_ab), b.size])[b[new_ab] >= 0]
    return int((n_a * (n_a - 1) // 2).sum()), int((k * (k - 1) // 2).sum())


def repeat_rate(pairs: int, shared: int) -> float:
    """The pair repeat rate of ``mate_counts``: ``shared / pairs``, 0.0 when no pair shares a step."""
    return float(shared / pairs) if pairs else 0.0


def pair_repeat_rate(plan_a: NDArray[np.int64], plan_b: NDArray[np.int64]) -> float:
    """Fraction of the pairs that share a step in ``plan_a`` that share a step in ``plan_b`` too.

    Both plans index the same pool (a sample planned twice in ``plan_b`` counts at its last step). A fully
    random planner gives about ``(W*B - 1) / (P - 1)``; compare a strategy against ``random``'s rate. 0.0
    when steps hold a single sample.
    """
    return repeat_rate(*plan_mates(plan_a, plan_b))


def plan_mates(plan_a: NDArray[np.int64], plan_b: NDArray[np.int64]) -> tuple[int, int]:
    """``mate_counts`` of two plans (S, W, M) of one pool (``pair_repeat_rate``)."""
    if plan_a.shape[0] == 0 or plan_b.size == 0:
        return 0, 0
    flat_a, flat_b = plan_a.reshape(plan_a.shape[0], -1), plan_b.reshape(plan_b.shape[0], -1)
    size = int(max(plan_a.max(), plan_b.max())) + 1
    step_b = np.full(size + 1, -1, dtype=np.int64)  # index -1 (a pad) stays -1
    step_b[flat_b] = np.arange(plan_b.shape[0])[:, None]
    step_b[-1] = -1
    valid = flat_a >= 0
    steps_a = np.broadcast_to(np.arange(flat_a.shape[0])[:, None], flat_a.shape)[valid]
    return mate_counts(steps_a, step_b[flat_a][valid])


def repeat_rates(counts: Mapping[str, tuple[int, int]], strategy: str) -> dict[str, float]:
    """The manifest's ``pair_repeat_rate`` of epochs 0 and 1 (rounded to 6 decimals) from the ``mate_counts``
    of the strategy's plans (``"plan"``) and of their ``random`` baselines (``"random"``)."""
    return {
        strategy: round(repeat_rate(*counts["plan"]), 6),
        "random": round(repeat_rate(*counts["random"]), 6),
    }


def _spearman(x: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    """Spearman rank correlation of two (N,) arrays; 0.0 when undefined (N < 2 or constant)."""
    if x.size < 2:
        return 0.0
    a, b = _average_ranks(x), _average_ranks(y)
    a, b = a - a.mean(), b - b.mean()
    denom = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / denom) if denom > 0 else 0.0


def mate_cost_correlation(plan: NDArray[np.int64], costs: NDArray[np.float64]) -> float:
    """Spearman correlation of a sample's cost with the mean cost of its step-mates, in [-1, 1].

    How size-homogeneous the steps are: ~0 when steps are random draws of the pool (every
    gradient step sees the whole size mix), ~1 when each step holds only neighbours in cost (a
    step is all small or all large scenes, so gradient and normalization statistics swing with
    size from step to step). 0.0 when steps hold a single sample or costs are constant.
    """
    s = plan.shape[0]
    per_step = int(np.prod(plan.shape[1:]))
    if s == 0 or per_step < 2:
        return 0.0
    c = np.asarray(costs, dtype=np.float64)[plan.reshape(s, per_step)]
    mates = (c.sum(axis=1, keepdims=True) - c) / (per_step - 1)
    return _spearman(c.ravel(), mates.ravel())


@dataclass(frozen=True)
class BalanceSums:
    """The balance sums of a part of an epoch (a step group, or the whole epoch): a few numbers and W rank
    totals. ``loads``: (kind, sum of step means, sum of step maxes) of ``plan``, ``greedy`` (and ``random``,
    ``speed``, ``random_speed`` when known)."""

    steps: int
    loads: tuple[tuple[str, float, float], ...]
    worst: float  # min over steps of mean/max rank load (steps with a load), inf when none
    totals: tuple[float, ...]  # (W,) each rank's load over the part's steps
    counts: tuple[int, int, int]  # (samples, rank-steps, max samples of one rank-step)
    spearman: float


def _sums(loads: NDArray[np.float64]) -> tuple[float, float]:
    if not loads.size:
        return 0.0, 0.0
    return float(loads.mean(axis=1).sum()), float(loads.max(axis=1).sum())


def balance_sums(
    loads: NDArray[np.float64],
    counts: NDArray[np.integer],
    pool_costs: NDArray[np.float64],
    batch_size: int,
    *,
    random: NDArray[np.float64] | None = None,
    speeds: Sequence[float] | None = None,
    step_cost: float = 0.0,
) -> BalanceSums:
    """The ``BalanceSums`` of a part of an epoch from its sums per (step, rank): (S, W) ``loads`` (the cost
    of each rank at each step, in step order) and ``counts`` (its samples); ``pool_costs`` (P,) of the
    part's pool (the greedy reference plans its ``equal_count_pool``); ``random`` (S', W) the loads of the
    ``random`` baseline on that pool (None: not known); ``speeds`` (W,) rank speeds or None; ``step_cost``
    what every rank-step adds (in ``loads`` and ``random`` already; added here to the greedy reference's)."""
    w = loads.shape[1]
    fitted = equal_count_pool(pool_costs, w, batch_size)
    kinds = {
        "plan": loads,
        "greedy": step_loads(np.sort(fitted).reshape(-1, w * batch_size), w, batch_size) + step_cost,
    }
    if random is not None:
        kinds["random"] = random
    if speeds is not None:
        speed = np.asarray(speeds, dtype=np.float64)[None, :]
        kinds["speed"] = loads / speed
        if random is not None:
            kinds["random_speed"] = random / speed
    step_max = loads.max(axis=1) if loads.size else np.empty(0)
    pos = step_max > 0
    worst = float((loads.mean(axis=1)[pos] / step_max[pos]).min()) if pos.any() else float("inf")
    counts = np.asarray(counts)
    return BalanceSums(
        steps=int(loads.shape[0]),
        loads=tuple((k, *_sums(v)) for k, v in kinds.items()),
        worst=worst,
        totals=tuple(float(t) for t in (loads.sum(axis=0) if loads.size else np.zeros(w))),
        counts=(int(counts.sum()), int(counts.size), int(counts.max(initial=0))),
        spearman=_step_spearman(loads) if loads.size else 0.0,
    )


def plan_sums(
    plan: NDArray[np.int64],
    costs: NDArray[np.float64],
    batch_size: int,
    baseline: NDArray[np.int64] | None = None,
    speeds: Sequence[float] | None = None,
    step_cost: float = 0.0,
) -> BalanceSums:
    """``balance_sums`` of a plan (S, W, M) over its pool's costs (P,), with its ``random`` baseline
    (S', W, B) over the pool's equal-count part (None: not known); every rank-step holding a sample adds
    ``step_cost`` (``rank_costs``)."""
    random = None
    if baseline is not None:
        random = rank_costs(baseline, equal_count_pool(costs, plan.shape[1], batch_size), step_cost)
    counts = (plan >= 0).sum(axis=-1)
    loads = rank_costs(plan, costs, step_cost)
    return balance_sums(loads, counts, costs, batch_size, random=random, speeds=speeds, step_cost=step_cost)


_ENTRY_KEYS = {
    "plan": "linearity",
    "greedy": REFERENCE_KEY,
    "random": "random_linearity",
    "speed": "speed_linearity",
    "random_speed": "random_speed_linearity",
}


def balance_entry(parts: Sequence[BalanceSums], epoch: int) -> dict[str, float | int]:
    """The manifest's ``balance`` entry of an epoch (floats rounded to 6 decimals) from the ``BalanceSums``
    of its parts, in part order. Linearities: the sum over all steps of the mean rank load over the sum of
    the max (``load_linearity`` summed part by part; the greedy and random references of each part's own
    pool), one per kind all parts hold; ``worst_step_linearity``, ``max_count``: min / max over the parts;
    ``rank_total_cv``, ``mean_count`` from the summed totals and counts; ``spearman_step_cost``: the parts'
    values weighted by their steps (a step group keeps its step order, so a curriculum inside one shows)."""
    values: dict[str, float] = {}
    held = [k for k in _ENTRY_KEYS if parts and all(any(k == x for x, _, _ in p.loads) for p in parts)]
    for key in held:
        mean = sum(s for p in parts for k, s, _ in p.loads if k == key)
        top = sum(t for p in parts for k, _, t in p.loads if k == key)
        values[_ENTRY_KEYS[key]] = mean / top if top > 0 else 1.0
    steps = sum(p.steps for p in parts)
    worst = min((p.worst for p in parts), default=float("inf"))
    values["spearman_step_cost"] = sum(p.steps / steps * p.spearman for p in parts) if steps else 0.0
    values["worst_step_linearity"] = worst if np.isfinite(worst) else 1.0
    totals = np.sum([p.totals for p in parts], axis=0)
    values["rank_total_cv"] = float(totals.std() / totals.mean()) if totals.mean() > 0 else 0.0
    cells = sum(p.counts[1] for p in parts)
    values["mean_count"] = sum(p.counts[0] for p in parts) / cells if cells else 0.0
    out: dict[str, float | int] = {"epoch": int(epoch), "steps": int(steps)}
    out["max_count"] = max((p.counts[2] for p in parts), default=0)
    out.update({k: round(float(v), 6) for k, v in values.items()})
    return out


def balance_summary(
    plan: NDArray[np.int64],
    costs: NDArray[np.float64],
    world_size: int,
    batch_size: int,
    *,
    baseline: NDArray[np.int64],
    epoch: int,
    speeds: Sequence[float] | None = None,
    step_cost: float = 0.0,
) -> dict[str, float | int]:
    """The ``balance`` entry of a plan (S, W, M) of one pool of ``costs`` (P,): ``balance_entry`` of its
    ``plan_sums``. ``baseline``: the (S', W, B) ``random`` plan of the pool's equal-count part (planned by
    the caller). Keys: ``epoch``, ``steps``, ``linearity``, ``greedy_reference``
    (``greedy_reference_linearity``), ``random_linearity`` (of ``baseline``), ``spearman_step_cost``,
    ``worst_step_linearity`` (min over steps of mean/max rank cost), ``rank_total_cv`` (of the per-rank
    epoch totals), ``mean_count`` and ``max_count`` (samples per rank-step); with rank ``speeds`` (W,)
    ``speed_linearity`` and ``random_speed_linearity``, of the ranks' times ``cost / speed``. Every
    rank-step's cost includes ``step_cost`` (``rank_costs``: a calibrated model's ``launch_ms``)."""
    if plan.shape[1] != world_size:
        raise ValueError(f"a plan of {plan.shape[1]} ranks, not W = {world_size}")
    return balance_entry([plan_sums(plan, costs, batch_size, baseline, speeds, step_cost)], epoch)
