"""Balance metrics of an epoch plan: what DDP would wait for, and how random the plan stays.

Linearity is the predicted scaling efficiency of synchronous data parallelism when step time is
proportional to the slowest rank's cost: ``sum_s mean_r cost[s, r] / sum_s max_r cost[s, r]``
(1.0 = no rank ever waits). A rank-step's cost is its samples' costs plus, with a cost model calibrated on
rank-steps (``launch_ms``), the ``step_cost`` every rank pays once per rank-step whatever its samples. ``load_linearity`` is the one place that formula is written; plans,
the greedy reference, reports, calibration and elastic re-plans all reduce to it. Nothing here plans:
the random baseline of ``balance_summary`` is planned by the caller. ``plan_buys`` is the one place
the numbers are put in plain words (the build's summary and the report), ``COLUMNS`` the one glossary.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from lidarshard.schemas.balance_entry import BalanceEntry
from lidarshard.transforms.plan.lpt import lpt_assign

__all__ = [
    "load_linearity",
    "rank_costs",
    "linearity",
    "step_linearity",
    "step_loads",
    "speed_linearity",
    "equal_count_pool",
    "greedy_reference_linearity",
    "REFERENCE_KEY",
    "plan_buys",
    "LITTLE_TO_WIN",
    "COLUMNS",
    "spearman_step_cost",
    "pair_repeat_rate",
    "mate_cost_correlation",
    "balance_summary",
]


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
    cols = lpt_assign(step_costs, world_size, batch_size).reshape(s, -1)
    items = np.take_along_axis(step_costs, cols, axis=1)
    return items.reshape(s, world_size, batch_size).sum(-1)


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
    step_mean = rank_costs(plan, costs).mean(axis=1) if plan.size else np.empty(0)
    return _spearman(np.arange(step_mean.size, dtype=np.float64), step_mean)


def pair_repeat_rate(plan_a: NDArray[np.int64], plan_b: NDArray[np.int64]) -> float:
    """Fraction of the pairs that share a step in ``plan_a`` that share a step in ``plan_b`` too.

    Both plans index the same pool. A fully random planner gives about ``(W*B - 1) / (P - 1)``;
    compare a strategy against ``random``'s rate. 0.0 when steps hold a single sample.
    """
    s_a = plan_a.shape[0]
    if s_a == 0 or plan_b.size == 0:
        return 0.0
    flat_a, flat_b = plan_a.reshape(s_a, -1), plan_b.reshape(plan_b.shape[0], -1)
    n_a = (flat_a >= 0).sum(axis=1)
    pairs = int((n_a * (n_a - 1) // 2).sum())
    if pairs == 0:
        return 0.0
    size = int(max(plan_a.max(), plan_b.max())) + 1
    step_b = np.full(size + 1, -1, dtype=np.int64)  # index -1 (a pad) stays -1
    step_b[flat_b] = np.arange(plan_b.shape[0])[:, None]
    step_b[-1] = -1
    valid = flat_a >= 0
    sb = step_b[flat_a][valid]  # step in b of each entry of a, -1 if absent
    sa = np.broadcast_to(np.arange(s_a)[:, None], flat_a.shape)[valid]
    base = plan_b.shape[0] + 1
    key = np.sort(sa * base + sb + 1)
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    group = np.diff(np.r_[start, key.size])
    group = group[key[start] % base != 0]  # drop entries absent from plan_b
    shared = (group * (group - 1) // 2).sum()
    return float(shared / pairs)


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
    """The manifest's per-epoch ``balance`` object (floats rounded to 6 decimals); every rank-step's cost
    includes ``step_cost`` (``rank_costs``: a calibrated model's ``launch_ms``).

    ``baseline`` is the (S', W, B) plan to compare against, planned by the caller (the manifest
    uses the ``random`` strategy on the same pool, seed and epoch).

    Keys: ``epoch``, ``steps``, ``linearity``, ``greedy_reference`` (``greedy_reference_linearity``),
    ``random_linearity`` (linearity of ``baseline``),
    ``spearman_step_cost``, ``worst_step_linearity`` (min over steps of mean/max rank cost),
    ``rank_total_cv`` (coefficient of variation of per-rank epoch totals), ``mean_count`` and
    ``max_count`` (samples per rank-step); with rank ``speeds`` (W,) also ``speed_linearity``, the
    linearity of the ranks' times ``cost / speed``, and ``random_speed_linearity``, that of ``baseline``. With variable counts (``-1`` pads, any pool size) the
    equal-count ``greedy_reference`` and ``random_linearity`` use the pool's first ``P - P % (W*B)`` entries.
    """
    rc = rank_costs(plan, costs, step_cost)
    fitted = equal_count_pool(costs, world_size, batch_size)
    base = rank_costs(baseline, fitted, step_cost)
    step_max = rc.max(axis=1) if rc.size else np.empty(0)
    pos = step_max > 0
    worst = float((rc.mean(axis=1)[pos] / step_max[pos]).min()) if pos.any() else 1.0
    totals = rc.sum(axis=0) if rc.size else np.zeros(1)
    cv = float(totals.std() / totals.mean()) if totals.mean() > 0 else 0.0
    values = {
        "linearity": load_linearity(rc),
        REFERENCE_KEY: greedy_reference_linearity(fitted, world_size, batch_size, step_cost),
        "random_linearity": load_linearity(base),
        "spearman_step_cost": spearman_step_cost(plan, costs),
        "worst_step_linearity": worst,
        "rank_total_cv": cv,
    }
    if speeds is not None:
        inverse = 1.0 / np.asarray(speeds, dtype=np.float64)[None, :]
        values["speed_linearity"] = load_linearity(rc * inverse)
        values["random_speed_linearity"] = load_linearity(base * inverse)
    counts = (plan >= 0).sum(axis=-1)
    out: dict[str, float | int] = {"epoch": int(epoch), "steps": int(plan.shape[0])}
    out["max_count"] = int(counts.max(initial=0))
    values["mean_count"] = float(counts.mean()) if counts.size else 0.0
    out.update({k: round(float(v), 6) for k, v in values.items()})
    return out


def plan_buys(entry: BalanceEntry) -> str | None:
    """One manifest ``balance`` entry in plain words: the epoch's predicted training time against a
    random plan of the same samples, and the share of it the ranks wait (``1 - linearity``); None when
    the entry lacks a number.

    Time for the same work is proportional to ``1 / linearity``, so the ratio is
    ``random_linearity / linearity``: ``"epoch 0: predicted time 0.86x a random plan's (14% less time):
    ranks wait 4.2% of it instead of 17.7%"``. A plan of ``--rank-speed`` is worded on the measure it
    optimised, the ranks' times ``cost / speed`` (``speed_linearity`` against ``random_speed_linearity``),
    and says so ("at the ranks' speeds"). Where the random plan is itself at least ``LITTLE_TO_WIN``
    linear (a launch-bound model, whose per-rank-step constant dominates, or samples of one size) the line
    says there is little to win instead of promising a gain.
    """
    speeds = entry.speed_linearity is not None and entry.random_speed_linearity is not None
    keys = ("speed_linearity", "random_speed_linearity") if speeds else ("linearity", "random_linearity")
    lin, rnd = (entry.value(k) for k in keys)
    if lin is None or rnd is None or lin <= 0:
        return None
    ratio = rnd / lin
    change = round(100 * (1 - ratio))
    if change == 0:
        how = f"{ratio:.2f}x a random plan's (the same)"
    else:
        how = f"{ratio:.2f}x a random plan's ({abs(change)}% {'less' if change > 0 else 'more'} time)"
    wait, random_wait = 100 * (1 - lin), 100 * (1 - rnd)
    epoch = entry.epoch
    at = " at the ranks' speeds" if speeds else ""
    little = (
        "; step time hardly depends on size here: expect random's balance" if rnd >= LITTLE_TO_WIN else ""
    )
    return (
        f"epoch {epoch}: predicted time{at} {how}: ranks wait {wait:.1f}% of it instead of {random_wait:.1f}%"
        + little
    )


#: A random plan's predicted linearity at which the summary says there is little to win (``plan_buys``).
LITTLE_TO_WIN = 0.98


#: What each number of the build's summary (and the report) means: name as printed -> meaning.
COLUMNS: dict[str, str] = {
    "linearity": "the share of each step the ranks spend computing rather than waiting for the slowest "
    "one, predicted from the cost model: sum over steps of the mean rank's cost / sum of the slowest "
    "rank's cost. 1.0 = no rank ever waits; it is also the predicted scaling efficiency of synchronous "
    "data-parallel training (DDP)",
    "random": "the same linearity for a random plan of the same samples and seed (PyTorch "
    "DistributedSampler semantics): what the plan is compared with",
    "greedy_reference": "the linearity of a simple equal-count reference plan: sort all costs, cut them "
    "into consecutive steps of W*B, give each step's samples, largest first, to the least loaded rank "
    "with room (B each). A reference, not a bound: balanced and mixed (the default) plan within 0.005 "
    "of it and may beat it; budget (unequal counts) often does.",
    "spearman": "rank correlation, in [-1, 1], of a step's position in the epoch with its mean cost: "
    "near 0 = big and small scenes spread over the whole epoch; near +1 (-1) = the epoch runs from small "
    "to big scenes (big to small), a size curriculum you may not want",
    "samples/rank-step": "samples one rank gets at one step, mean and max over all rank-steps: B for "
    "the equal-count strategies, varying under budget",
    "pair repeat rate": "of the sample pairs that share a step in epoch 0, the share that share a step "
    "again in epoch 1; random's rate is the floor (about (W*B-1)/(N-1)), higher = batches repeat "
    "between epochs",
    "predicted time": "random linearity / linearity: the plan's predicted training time for the same "
    "work as a multiple of a random plan's; ranks wait 1 - linearity of it. With --rank-speed both "
    "linearities are of the ranks' times (cost / speed), the measure such a plan optimises",
}
