"""Repeat factors and sample weights (transforms/features/repeat.py) and their stochastic rounding."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import plan_samples
from lidarshard.transforms.core.pool import epoch_pool
from lidarshard.transforms.core.score import repeat_info
from lidarshard.transforms.features.buckets import weighted_pool
from lidarshard.transforms.features.repeat import (
    Weights,
    WeightSpec,
    check_weights,
    class_counts,
    column_weights,
    label_presence,
    lvis_factors,
    parse_repeat_factors,
    repeat_counts,
)
from lidarshard.transforms.plan import ANY_POOL, STRATEGIES


def test_lvis_factors_by_hand() -> None:
    # 4 labelled samples: class 0 everywhere (f=1), class 1 in one (f=0.25), class 2 in two (f=0.5)
    labels = [bytes([0, 0, 1]), bytes([0, 2]), bytes([0, 2, 2]), bytes([0]), None]
    presence, has = label_presence(labels)
    assert has.tolist() == [True, True, True, True, False]
    r = lvis_factors(presence, has, t=0.5)
    np.testing.assert_allclose(r, [np.sqrt(0.5 / 0.25), 1.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(lvis_factors(presence, has, t=1.0), [2.0, np.sqrt(2), np.sqrt(2), 1.0, 1.0])
    assert class_counts(presence, r) == {
        "0": round(float(r[:4].sum()), 6),
        "1": round(float(r[0]), 6),
        "2": 2.0,
    }
    assert lvis_factors(np.zeros((2, 256), bool), np.zeros(2, bool), 0.1).tolist() == [1.0, 1.0]


def test_specs_and_columns_validate() -> None:
    assert parse_repeat_factors("lidarseg:t=0.1") == 0.1
    for bad in ("lidarseg:t=0", "lidarseg:t=2", "lidarseg", "cbgs:t=0.1", "lidarseg:t=x"):
        with pytest.raises(ValueError, match="lidarseg:t=T"):
            parse_repeat_factors(bad)
    assert WeightSpec(0.1).mode == "lidarseg:t=0.1" and WeightSpec(column="w").mode == "column:w"
    assert WeightSpec().mode is None
    with pytest.raises(ValueError, match="not both"):
        WeightSpec(0.1, "w")
    t = pa.table({"w": [1.0, 2.5], "s": ["a", "b"], "neg": [1.0, -1.0]})
    assert column_weights(t, "w").tolist() == [1.0, 2.5]
    for col, match in (("missing", "no such column"), ("s", "numeric"), ("neg", ">= 0")):
        with pytest.raises(ValueError, match=match):
            column_weights(t, col)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    weights=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=40),
    seed=st.integers(0, 2**31 - 1),
    epoch=st.integers(0, 100),
)
def test_stochastic_rounding_is_deterministic_and_within_one_copy(
    weights: list, seed: int, epoch: int
) -> None:
    w = np.asarray(weights)
    ids = np.zeros(w.size, np.int32)
    pool = weighted_pool(ids, np.ones(1), np.random.default_rng([seed, epoch]), w)
    again = weighted_pool(ids, np.ones(1), np.random.default_rng([seed, epoch]), w)
    np.testing.assert_array_equal(pool, again)
    copies = np.bincount(pool, minlength=w.size)
    assert ((copies == np.floor(w)) | (copies == np.ceil(w))).all()


def test_stochastic_rounding_realizes_the_expected_count() -> None:
    w = np.full(20_000, 1.3)
    counts = [
        weighted_pool(np.zeros(w.size, np.int32), np.ones(1), np.random.default_rng([0, e]), w).size
        for e in range(5)
    ]
    assert all(abs(c / w.sum() - 1) < 0.01 for c in counts)


def test_lvis_factors_from_label_bytes() -> None:
    labels = [bytes([0, 0, 1]), bytes([0, 2]), bytes([0, 2, 2]), bytes([0]), None]
    presence, has = label_presence(labels)
    assert has.tolist() == [True, True, True, True, False] and presence.shape == (5, 256)
    np.testing.assert_allclose(lvis_factors(presence, has, 0.5), [np.sqrt(2), 1.0, 1.0, 1.0, 1.0])


def test_check_weights_refuses_what_would_plan_nothing_or_too_much() -> None:
    t = pa.table({"zero": [0.0, 0.0], "big": [1.0, 500.0], "nan": [1.0, float("nan")], "w": [0.0, 3]})
    assert check_weights(t, "w", 100.0).tolist() == [0.0, 3.0]
    for col, match in (
        ("zero", "every weight is 0"),
        ("big", "mean weight 250.5 exceeds"),
        ("nan", "finite"),
    ):
        with pytest.raises(ValueError, match=match):
            check_weights(t, col, 100.0)


def _scored(n: int, weights: NDArray[np.float64], seed: int = 0) -> pa.Table:
    """A scored-like table: lognormal costs, 4 buckets, the given per-sample weights."""
    costs = np.exp(np.random.default_rng(seed).normal(0, 1, n))
    ids = np.searchsorted(np.quantile(costs, [0.25, 0.5, 0.75]), costs, side="right").astype(np.int32)
    return pa.table(
        {
            "sample_id": [f"{i:05d}" for i in range(n)],
            "cost": costs,
            "bucket_id": ids,
            "num_points": (costs * 1000).astype(np.int64),
            "weight": weights,
        }
    )


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_plans_each_sample_as_often_as_its_rounded_weight(strategy: str) -> None:
    n = 97
    w = np.random.default_rng(1).choice([0.0, 0.5, 1.0, 1.7, 3.0], size=n)
    scored = _scored(n, w)
    cfg = PlanConfig(world_size=3, batch_size=2, epochs=2, seed=5, strategy=strategy, policy="pad")
    for epoch in range(2):
        planned = plan_samples(scored, epoch, cfg)
        plan, stats = planned.plan, planned.stats
        again = plan_samples(scored, epoch, cfg).plan
        np.testing.assert_array_equal(plan, again)  # deterministic per (seed, epoch)
        np.testing.assert_array_equal(
            plan_samples(scored, epoch, cfg, baseline=False).plan, plan
        )  # validate's
        pool = epoch_pool(scored.column("bucket_id").to_numpy(), w, epoch, cfg)[0]
        seen = np.bincount(plan[plan >= 0], minlength=n)
        np.testing.assert_array_equal(seen, np.bincount(pool, minlength=n))  # the plan holds the pool
        assert (seen[w == 0] == 0).all()  # weight 0 never planned, not even as padding
        assert (seen <= np.ceil(w) + (strategy not in ANY_POOL)).all()  # pad adds at most one
        if strategy in ANY_POOL:  # nothing fitted: exactly floor or ceil of the weight
            assert ((seen == np.floor(w)) | (seen == np.ceil(w))).all() and stats["padded"] == 0


def test_repeat_info_counts_expected_and_realized_copies_per_class() -> None:
    presence = np.zeros((4, 256), bool)
    presence[:, 0] = True
    presence[0, 7] = presence[2, 7] = True
    w = np.array([2.5, 1.0, 0.5, 1.0])
    scored = _scored(4, w)
    cfg = PlanConfig(world_size=1, batch_size=1, epochs=3, seed=2, strategy="budget", weights=(1, 1, 1, 2))
    info = repeat_info(scored, Weights(w, presence), cfg)
    bucket = np.array([1, 1, 1, 2.0])[scored.column("bucket_id").to_numpy()]
    assert info["expected"] == {
        "0": float((w * bucket).sum()),
        "7": float(w[0] * bucket[0] + w[2] * bucket[2]),
    }
    for e, realized in enumerate(info["realized"]):
        plan = plan_samples(scored, e, cfg).plan
        seen = np.bincount(plan[plan >= 0], minlength=4)
        assert realized == {"0": float(seen.sum()), "7": float(seen[0] + seen[2])}
    assert repeat_info(scored, None, cfg) is None
    column = repeat_info(scored, Weights(w), PlanConfig(1, 1, repeat=WeightSpec(column="c")))
    assert column["mode"] == "column:c" and list(column["expected"]) == ["all"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    rows=st.lists(st.lists(st.integers(0, 5), max_size=6) | st.none(), min_size=1, max_size=12),
    t=st.floats(1e-3, 1.0),
)
def test_lvis_factors_match_the_definition_loop_by_loop(rows: list, t: float) -> None:
    labels = [None if r is None else bytes(r) for r in rows]
    presence, has = label_presence(labels)
    r = lvis_factors(presence, has, t)
    labelled = [set(x) for x in rows if x is not None]
    for i, row in enumerate(rows):
        want = 1.0
        for c in set(row or []):
            f = sum(c in s for s in labelled) / len(labelled)
            want = max(want, max(1.0, np.sqrt(t / f)))
        assert r[i] == pytest.approx(want, rel=1e-12)


def test_an_epoch_pool_too_large_for_the_machine_is_one_line(monkeypatch) -> None:
    """A scan's row count is known only in the pipeline: the planner refuses a pool that cannot fit."""
    from lidarshard.transforms.core import pool

    ids = np.zeros(1000, dtype=np.int32)
    cfg = PlanConfig(world_size=2, batch_size=2, weights=(500.0,), max_plan_factor=1000)
    monkeypatch.setattr(pool, "memory_bytes", lambda: 64 << 20)  # 500k entries x 256 B > 64 MiB
    with pytest.raises(
        ValueError, match=r"epoch 0 would plan ~5e\+05 entries from 1,000 samples.*lower --bucket-weights"
    ):
        epoch_pool(ids, None, 0, cfg)
    monkeypatch.setattr(pool, "memory_bytes", lambda: 1 << 30)
    assert epoch_pool(ids, None, 0, cfg)[0].size == 500_000


def test_repeat_counts_per_class_or_under_all() -> None:
    presence = np.array([[1, 0, 1], [0, 0, 1], [0, 0, 0]], dtype=bool)
    copies = np.array([2.0, 0.5, 3.0])
    assert repeat_counts(presence, copies) == {"0": 2.0, "2": 2.5}
    assert repeat_counts(None, copies) == {"all": 5.5}
    assert repeat_counts(None, np.empty(0)) == {"all": 0.0}
