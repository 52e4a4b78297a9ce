"""Epoch planners (transforms/plan): one invariant checker applied to every registered strategy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard.transforms.features.buckets import assign_buckets, quantile_edges
from lidarshard.transforms.plan import STRATEGIES, VARIABLE_COUNT, balanced, mixed, plan_epoch, seeds
from lidarshard.transforms.plan.balanced import TOLERANCE
from lidarshard.transforms.plan.megabatch import MEGABATCH_MULT, megabatch_steps
from lidarshard.transforms.plan.metrics import (
    greedy_reference_linearity,
    linearity,
    mate_cost_correlation,
    pair_repeat_rate,
    rank_costs,
    spearman_step_cost,
)

NAMES = sorted(STRATEGIES)


@st.composite
def pools(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    """(costs (P,), W, B) with P a whole number of steps; lognormal/uniform/ties/all-equal costs."""
    w = draw(st.integers(1, 64))
    b = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 24))
    kind = draw(st.sampled_from(["lognormal", "uniform", "ties", "equal"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p = steps * w * b
    if kind == "lognormal":
        costs = rng.lognormal(10.0, draw(st.sampled_from([0.3, 0.6, 1.0, 2.0])), p)
    elif kind == "uniform":
        costs = rng.uniform(0.0, 50.0, p)
    elif kind == "ties":
        costs = rng.choice([0.0, 1.0, 3.0, 40.0], p)
    else:
        costs = np.full(p, 2.0)
    return costs, w, b


def check_plan(name: str, costs: np.ndarray, w: int, b: int, seed: int) -> np.ndarray:
    """The invariants every registered strategy must satisfy; returns the epoch-0 plan.

    Equal-count strategies: shape (P / (W*B), W, B). Variable-count ones: W ranks, every rank-step
    non-empty (-1 pads only after its samples), mean count per rank-step within 5% of B.
    """
    p = costs.size
    plan = plan_epoch(name, costs, w, b, seed=seed, epoch=0)
    assert plan.dtype == np.int64 and plan.ndim == 3 and plan.shape[1] == w
    if name in VARIABLE_COUNT:
        counts = (plan >= 0).sum(axis=-1)
        assert (counts >= 1).all()
        assert ((plan >= 0) == (np.arange(plan.shape[2]) < counts[..., None])).all()  # pads last
        assert counts.mean() <= 1.05 * b + 1e-9 and plan.shape[0] <= p // w
        if p >= 20 * w * b:
            assert counts.mean() >= 0.95 * b
    else:
        assert plan.shape == (p // (w * b), w, b)
    entries = plan[plan >= 0]
    np.testing.assert_array_equal(np.sort(entries), np.arange(p))  # each entry exactly once
    np.testing.assert_array_equal(plan, plan_epoch(name, costs.copy(), w, b, seed=seed, epoch=0))
    if plan.shape[0] >= 8 and p >= 64:
        assert not np.array_equal(plan, plan_epoch(name, costs, w, b, seed=seed, epoch=1))
    return plan


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=80, deadline=None, derandomize=True)
@given(pool=pools(), seed=st.integers(0, 2**31 - 1))
def test_every_strategy_satisfies_invariants(name: str, pool: tuple, seed: int) -> None:
    check_plan(name, *pool, seed)


def test_budget_satisfies_invariants_on_a_large_heavy_tailed_pool() -> None:
    """At this size each fill runs tens of vectorized rounds (long ones and the short
    water-filling ones of the high steps), unlike the small hypothesis pools."""
    costs = np.random.default_rng(2).lognormal(0.0, 1.0, 64 * 2 * 1024 + 77)  # not a whole step
    plan = check_plan("budget", costs, 64, 2, seed=9)
    assert linearity(plan, costs) >= 0.99


@pytest.mark.parametrize("name", ["balanced", "mixed"])
@settings(max_examples=40, deadline=None, derandomize=True)
@given(pool=pools(), seed=st.integers(0, 2**31 - 1))
def test_balance_strategies_reach_bound(name: str, pool: tuple, seed: int) -> None:
    costs, w, b = pool
    plan = plan_epoch(name, costs, w, b, seed=seed, epoch=3)
    assert linearity(plan, costs) >= greedy_reference_linearity(costs, w, b) - TOLERANCE - 1e-9


def test_balanced_beats_random_in_aggregate() -> None:
    rng = np.random.default_rng(11)
    lin = {"balanced": [], "random": []}
    for sigma in (0.3, 0.6, 1.0):
        for w, b in [(1, 1), (4, 1), (16, 2), (64, 1), (8, 4)]:
            costs = rng.lognormal(0.0, sigma, 32 * w * b)
            for name, values in lin.items():
                values.append(linearity(plan_epoch(name, costs, w, b, seed=5, epoch=0), costs))
    bal, rnd = np.array(lin["balanced"]), np.array(lin["random"])
    assert bal.mean() > rnd.mean() + 0.2
    assert (bal >= rnd - 1e-9).all()


def test_balanced_is_random_where_it_can_be() -> None:
    costs = np.random.default_rng(0).lognormal(0.0, 0.6, 16 * 2 * 512)
    plans = [plan_epoch("balanced", costs, 16, 2, seed=1, epoch=e) for e in range(2)]
    for plan in plans:
        assert linearity(plan, costs) > 0.99
        assert abs(spearman_step_cost(plan, costs)) < 0.2  # no size curriculum
        totals = rank_costs(plan, costs).sum(axis=0)
        assert totals.max() / totals.mean() < 1.02  # no systematically heavy rank
    assert pair_repeat_rate(plans[0], plans[1]) < 0.15  # steps are regrouped between epochs


def test_mixed_regroups_steps_like_random() -> None:
    costs = np.random.default_rng(4).lognormal(0.0, 0.6, 16 * 2 * 512)
    names = ("random", "balanced", "mixed")
    plans = {n: [plan_epoch(n, costs, 16, 2, seed=1, epoch=e) for e in range(2)] for n in names}
    repeat = {n: pair_repeat_rate(*p) for n, p in plans.items()}
    assert repeat["mixed"] <= 1.5 * repeat["random"] < repeat["balanced"]
    mates = {n: mate_cost_correlation(p[0], costs) for n, p in plans.items()}
    assert abs(mates["random"]) < 0.05 < mates["mixed"] < mates["balanced"]
    for plan in plans["mixed"]:
        assert abs(spearman_step_cost(plan, costs)) < 0.2
        totals = rank_costs(plan, costs).sum(axis=0)
        assert totals.max() / totals.mean() < 1.02


def test_mixed_plans_heavy_tails_like_the_bound() -> None:
    costs = np.random.default_rng(1).lognormal(0.0, 1.5, 16 * 2 * 64)  # 1% of samples hold 20% of cost
    k, steps = mixed.choose_steps(costs, 16, 2, np.random.default_rng(0))
    assert 0 < k < 64  # the heaviest k steps are planned like the bound, the rest as random batches
    assert linearity(steps, costs) >= greedy_reference_linearity(costs, 16, 2) - TOLERANCE
    giants = np.argsort(costs)[-16:]
    assert np.isin(giants, steps[-k:]).all()


def test_mixed_is_balanced_when_batches_are_single_samples() -> None:
    costs = np.random.default_rng(6).lognormal(0.0, 1.0, 8 * 40)
    same = [s.plan(costs, 8, 1, np.random.default_rng(9), None) for s in (mixed, balanced)]
    np.testing.assert_array_equal(*same)


def test_random_is_distributed_sampler() -> None:
    costs = np.arange(96, dtype=np.float64)
    w, b, seed, epoch = 4, 3, 7, 2
    plan = plan_epoch("random", costs, w, b, seed=seed, epoch=epoch)
    perm = np.random.default_rng([seed, epoch, seeds.salt("random")]).permutation(96)
    for r in range(w):
        np.testing.assert_array_equal(plan[:, r, :].ravel(), perm[r::w])


def test_stratified_draws_every_bucket_in_proportion() -> None:
    rng = np.random.default_rng(3)
    costs = rng.lognormal(0.0, 1.0, 64 * 200)
    ids = assign_buckets(costs, quantile_edges(costs, 8))
    plan = plan_epoch("stratified", costs, 16, 4, seed=0, epoch=0, bucket_ids=ids)
    per_step = np.stack([np.bincount(ids[s.ravel()], minlength=8) for s in plan])
    assert np.abs(per_step - 8).max() <= 2  # 64 per step / 8 equal buckets
    default = plan_epoch("stratified", costs, 16, 4, seed=0, epoch=0)
    assert default.shape == plan.shape


def test_megabatch_sorts_each_megabatch() -> None:
    w, b = 4, 2
    assert [megabatch_steps(s) for s in (1, 7, 8, 400, 10**6)] == [1, 1, 2, MEGABATCH_MULT, MEGABATCH_MULT]
    costs = np.random.default_rng(2).uniform(1, 2, w * b * (MEGABATCH_MULT * 4 + 3))
    plan = plan_epoch("megabatch", costs, w, b, seed=0, epoch=0)
    flat = costs[plan.reshape(-1)]
    mega = w * b * MEGABATCH_MULT
    assert not (np.diff(flat[: 2 * mega]) <= 0).all()
    for start in range(0, flat.size, mega):
        assert (np.diff(flat[start : start + mega]) <= 0).all()


def test_plan_epoch_validates() -> None:
    costs = np.ones(8)
    with pytest.raises(ValueError, match="unknown strategy"):
        plan_epoch("fastest", costs, 2, 2, seed=0, epoch=0)
    with pytest.raises(ValueError, match="multiple"):
        plan_epoch("balanced", np.ones(7), 2, 2, seed=0, epoch=0)
    for bad in (np.array([1.0, -1.0]), np.array([1.0, np.nan])):
        with pytest.raises(ValueError):
            plan_epoch("random", bad, 1, 1, seed=0, epoch=0)
    with pytest.raises(ValueError):
        plan_epoch("stratified", costs, 2, 2, seed=0, epoch=0, bucket_ids=np.zeros(3, np.int32))
    with pytest.raises(ValueError):
        plan_epoch("random", costs, 0, 2, seed=0, epoch=0)
    for name in NAMES:
        assert plan_epoch(name, np.empty(0), 4, 2, seed=0, epoch=0).shape == (0, 4, 2)
    with pytest.raises(ValueError, match="smaller than world_size"):
        plan_epoch("budget", np.ones(3), 4, 1, seed=0, epoch=0)


def test_strategies_use_distinct_streams() -> None:
    assert len({seeds.salt(n) for n in NAMES}) == len(NAMES)
    assert seeds.salt("balanced") == 3262407112  # stable across processes and versions


def test_mixed_plans_the_same_when_its_steps_are_split_in_chunks(monkeypatch) -> None:
    costs = np.random.default_rng(4).lognormal(0.0, 1.0, 8 * 2 * 40)
    whole = mixed.plan(costs, 8, 2, np.random.default_rng(1), None)
    monkeypatch.setattr(mixed, "_CHUNK_STEPS", 3)  # 40 steps re-split 3 at a time
    np.testing.assert_array_equal(mixed.plan(costs, 8, 2, np.random.default_rng(1), None), whole)


def test_auto_keeps_whole_steps_and_a_cap_it_cannot_hold_is_the_caps_line() -> None:
    """``auto`` plans the pool's whole steps: under a points cap budget would need more steps than W*B allows,
    so it is not a candidate, and a cap that mixed breaches is refused by the caps' one line (an internal
    AssertionError on the plan's shape before; found by tests/test_one_path at W=1, B=2)."""
    from lidarshard.transforms.plan.caps import Caps, PoolLimits

    rng = np.random.default_rng(0)
    costs, points = rng.uniform(1, 100, 18), rng.integers(4_000, 12_000, 18)
    limits = PoolLimits(Caps(max_points=15_000), points)
    with pytest.raises(ValueError, match="--max-points-per-rank-step 15000"):
        plan_epoch("auto", costs, 1, 2, seed=0, epoch=0, limits=limits)
    roomy = PoolLimits(Caps(max_points=60_000), points)
    plan = plan_epoch("auto", costs, 1, 2, seed=0, epoch=0, limits=roomy)
    assert len(plan) <= 18 // 2 and sorted(plan[plan >= 0].tolist()) == list(range(18))
