"""Caps (transforms/plan/caps.py): per-rank-step limits, single samples over a cap, the plan check."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lidarshard.schemas.records import CapsRecord
from lidarshard.tools.validate_epoch import cap_values, group_breaches, report_breaches
from lidarshard.transforms.plan import STRATEGIES, VARIABLE_COUNT, plan_epoch
from lidarshard.transforms.plan.caps import (
    Caps,
    PoolLimits,
    cap_breaches,
    check_caps,
    over_cap,
    rank_step_sums,
)


def test_caps_validate_and_round_trip() -> None:
    caps = Caps(max_points=100, max_cost=2.5, max_samples=3)
    assert caps.active and not Caps().active
    assert Caps.from_record(*caps.to_record()) == caps
    assert caps.to_record("points")[0] == CapsRecord(100, 2.5, 3, "points")
    assert Caps.from_record(None) == Caps()
    for bad in (dict(max_points=0), dict(max_samples=1.5), dict(max_cost=-1.0), dict(max_cost=float("inf"))):
        with pytest.raises(ValueError, match="per-rank-step"):
            Caps(**bad)


def test_over_cap_names_each_sample_above_a_cap() -> None:
    reasons = over_cap(np.array([1.0, 9.0, 2.0]), np.array([10, 10, 500]), Caps(max_points=100, max_cost=5.0))
    assert reasons[0] == ""
    assert "cost 9 > --max-cost-per-rank-step 5" in reasons[1]
    assert "500 points > --max-points-per-rank-step 100" in reasons[2]


def test_rank_step_sums_ignore_pads() -> None:
    plan = np.array([[[0, 1], [2, -1]]])
    np.testing.assert_array_equal(rank_step_sums(plan, np.array([1, 2, 4])), [[3, 4]])


def test_check_caps_names_step_rank_and_value() -> None:
    plan = np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    points = np.array([1, 1, 1, 1, 1, 1, 50, 60])
    with pytest.raises(
        ValueError, match=r"epoch 3 step 1 rank 1: 110 points > --max-points-per-rank-step 100"
    ):
        check_caps(plan, PoolLimits(Caps(max_points=100), points), np.ones(8), epoch=3)
    check_caps(plan, PoolLimits(Caps(max_points=110), points), np.ones(8), epoch=3)
    with pytest.raises(ValueError, match="step 0 rank 0: 2 samples"):
        check_caps(plan, PoolLimits(Caps(max_samples=1)), np.ones(8), epoch=0)


def test_planner_and_validate_share_one_check_and_report_every_cap() -> None:
    plan = np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    costs, points = np.arange(8, dtype=np.float64), np.array([1, 1, 1, 1, 1, 1, 50, 60])
    caps = Caps(max_points=100, max_cost=8.0, max_samples=1)
    got = [(b.name, b.step, b.rank, b.value, b.count) for b in cap_breaches(plan, caps, costs, points)]
    assert got == [("samples", 0, 0, 2.0, 4), ("cost", 1, 0, 9.0, 2), ("points", 1, 1, 110.0, 1)]
    assert [b.name for b in cap_breaches(plan, caps, costs, None)] == ["samples", "cost"]
    problems: list[str] = []
    samples = pa.table({"cost": costs, "num_points": points})
    values = cap_values(problems, 2, caps, samples)  # validate's path: one group holding every step
    breaches = group_breaches(plan, np.arange(plan.shape[0]), caps, values)
    report_breaches(problems, 2, breaches, lambda e, r: f"plan/epoch-{e}/rank-{r}")
    assert len(problems) == 3 and "plan/epoch-2/rank-1: epoch 2 step 1 rank 1" in problems[2]
    assert "110 points > --max-points-per-rank-step 100 (1 rank-steps over)" in problems[2]
    with pytest.raises(
        ValueError, match=r"step 0 rank 0: 2 samples > --max-samples-per-rank-step 1 \(4 rank-steps"
    ):
        check_caps(plan, PoolLimits(caps, points), costs, epoch=2)


def test_every_strategy_is_checked_against_the_caps() -> None:
    rng = np.random.default_rng(0)
    costs = rng.lognormal(0.0, 1.0, 64 * 16)
    points = np.round(costs * 1000).astype(np.int64)
    cap = int(np.sort(points)[-2] + np.sort(points)[-1]) // 2 + 1  # the two heaviest must not share a rank
    limits = PoolLimits(Caps(max_points=max(cap, int(points.max()))), points)
    exceeded = 0
    for name in sorted(STRATEGIES):
        try:
            plan = plan_epoch(name, costs, 8, 2, seed=1, epoch=0, limits=limits)
        except ValueError as e:
            assert name not in VARIABLE_COUNT and "--max-points-per-rank-step" in str(e)
            exceeded += 1
            continue
        assert rank_step_sums(plan, points).max() <= limits.caps.max_points
    assert exceeded >= 1  # an equal-count strategy put too many points on one rank-step
