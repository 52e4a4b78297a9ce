"""Cost buckets, weights and pool fitting (transforms/buckets.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard.transforms.features.buckets import (
    POLICIES,
    assign_buckets,
    bucket_counts,
    default_num_buckets,
    fit_pool,
    quantile_edges,
    resolve_weights,
    sorted_values,
    streamed_quantile_edges,
    weighted_pool,
)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


@st.composite
def cost_arrays(draw: st.DrawFn, max_n: int = 500) -> np.ndarray:
    """Lognormal, uniform, heavily tied or all-equal costs (seeded numpy draws)."""
    n = draw(st.integers(0, max_n))
    kind = draw(st.sampled_from(["lognormal", "uniform", "ties", "equal"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "lognormal":
        return rng.lognormal(10.0, draw(st.sampled_from([0.3, 1.0, 2.0])), n)
    if kind == "uniform":
        return rng.uniform(0.0, 100.0, n)
    if kind == "ties":
        return rng.choice([0.0, 1.0, 2.5, 7.0], n)
    return np.full(n, 3.0)


@SETTINGS
@given(costs=cost_arrays(), k=st.integers(1, 80))
def test_quantile_edges_invariants(costs: np.ndarray, k: int) -> None:
    edges = quantile_edges(costs, k)
    assert edges.dtype == np.float64 and edges.ndim == 1 and edges.size <= k - 1
    assert (np.diff(edges) > 0).all()
    if costs.size:
        assert set(edges.tolist()) <= set(costs.tolist())  # exact data values, no interpolation
        assert (edges > costs.min()).all()
        counts = bucket_counts(assign_buckets(costs, edges), edges.size + 1)
        assert (counts > 0).all()  # every bucket non-empty
        assert counts.sum() == costs.size


@SETTINGS
@given(n=st.integers(1, 2000), k=st.integers(1, 64), seed=st.integers(0, 2**32 - 1))
def test_quantile_edges_exact_on_distinct_values(n: int, k: int, seed: int) -> None:
    costs = np.random.default_rng(seed).permutation(n).astype(np.float64) * 1.5
    edges = quantile_edges(costs, k)
    s = np.sort(costs)
    expected = np.unique(s[(np.arange(1, k) * n) // k])
    np.testing.assert_array_equal(edges, expected[expected > s[0]])
    counts = bucket_counts(assign_buckets(costs, edges), edges.size + 1)
    if k <= n:  # equal-count buckets: sizes differ by at most one
        assert edges.size == k - 1
        assert counts.max() - counts.min() <= 1


def test_quantile_edges_ties_give_fewer_buckets() -> None:
    costs = np.array([1.0] * 90 + [2.0] * 10)
    np.testing.assert_array_equal(quantile_edges(costs, 10), [2.0])
    assert quantile_edges(np.full(50, 4.0), 8).size == 0
    assert quantile_edges(np.empty(0), 4).size == 0


def test_quantile_edges_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        quantile_edges(np.array([1.0, np.nan]), 2)
    with pytest.raises(ValueError):
        quantile_edges(np.ones(3), 0)


def test_default_num_buckets() -> None:
    ns = [0, 1, 3, 10, 100, 1000, 10_000, 65_536, 10**6, 10**9]
    ks = [default_num_buckets(n) for n in ns]
    assert ks == sorted(ks)
    assert ks[:3] == [1, 1, 3]
    assert all(4 <= k <= 64 for n, k in zip(ns, ks, strict=True) if n >= 4)
    assert default_num_buckets(10_000) == 25 and default_num_buckets(10**6) == 64


def test_assign_buckets_searchsorted_right() -> None:
    edges = np.array([1.0, 2.0, 5.0])
    costs = np.array([0.0, 1.0, 1.5, 2.0, 4.9, 5.0, 9.0])
    ids = assign_buckets(costs, edges)
    assert ids.dtype == np.int32
    np.testing.assert_array_equal(ids, [0, 1, 1, 2, 2, 3, 3])
    with pytest.raises(ValueError):
        assign_buckets(costs, np.array([2.0, 1.0]))


def test_resolve_weights() -> None:
    np.testing.assert_array_equal(resolve_weights(None, 3), [1, 1, 1])
    np.testing.assert_array_equal(resolve_weights([2.0], 3), [2, 2, 2])
    np.testing.assert_array_equal(resolve_weights([0, 1, 0.5], 3), [0, 1, 0.5])
    for bad in ([1.0, 2.0], [-1.0], [np.inf]):
        with pytest.raises(ValueError):
            resolve_weights(bad, 3)


@SETTINGS
@given(
    n=st.integers(0, 300),
    weights=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_weighted_pool_invariants(n: int, weights: list[float], seed: int) -> None:
    w = np.array(weights)
    ids = np.random.default_rng(seed).integers(0, w.size, n).astype(np.int32)
    pool = weighted_pool(ids, w, np.random.default_rng(seed))
    again = weighted_pool(ids, w, np.random.default_rng(seed))
    np.testing.assert_array_equal(pool, again)  # deterministic
    assert pool.dtype == np.int64 and (np.diff(pool) >= 0).all()  # sorted ascending
    copies = np.bincount(pool, minlength=n)
    per = w[ids]
    assert (copies >= np.floor(per)).all() and (copies <= np.floor(per) + 1).all()
    assert (copies[per == np.floor(per)] == per[per == np.floor(per)]).all()  # whole weights exact


def test_weighted_pool_expected_counts() -> None:
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 3, 200_000).astype(np.int32)
    w = np.array([0.25, 1.0, 2.6])
    copies = np.bincount(weighted_pool(ids, w, rng), minlength=ids.size)
    for k in range(3):
        mean = copies[ids == k].mean()
        assert abs(mean - w[k]) < 0.01, (k, mean)
    with pytest.raises(ValueError):
        weighted_pool(np.array([0, 3], dtype=np.int32), w, rng)
    with pytest.raises(ValueError):
        weighted_pool(ids, np.array([1.0, -1.0, 1.0]), rng)


@SETTINGS
@given(
    n=st.integers(0, 400),
    step=st.integers(1, 64),
    policy=st.sampled_from(POLICIES),
    seed=st.integers(0, 2**32 - 1),
)
def test_fit_pool_invariants(n: int, step: int, policy: str, seed: int) -> None:
    pool = np.sort(np.random.default_rng(seed).integers(0, max(n // 2, 1), n))
    fitted, dropped, padded = fit_pool(pool, step, policy, np.random.default_rng(seed))
    again = fit_pool(pool, step, policy, np.random.default_rng(seed))
    np.testing.assert_array_equal(fitted, again[0])
    assert fitted.dtype == np.int64 and (np.diff(fitted) >= 0).all()
    assert fitted.size % step == 0 and fitted.size == n - dropped + padded
    have = np.bincount(fitted, minlength=pool.max(initial=0) + 1)
    orig = np.bincount(pool, minlength=have.size)
    if policy == "drop_last":
        assert padded == 0 and dropped == (n % step if n >= step else n)
        assert (have <= orig).all()  # only removals
    else:
        assert dropped == 0 and padded == (-n % step if n else 0)
        assert (have >= orig).all() and set(fitted.tolist()) == set(pool.tolist())
        if padded <= n:  # padding picks distinct pool entries where it can
            assert (have - orig <= orig).all()


def test_fit_pool_small_and_bad_policy() -> None:
    rng = np.random.default_rng(0)
    fitted, dropped, padded = fit_pool(np.arange(5), 8, "drop_last", rng)
    assert fitted.size == 0 and (dropped, padded) == (5, 0)
    fitted, dropped, padded = fit_pool(np.arange(5), 8, "pad", rng)
    assert fitted.size == 8 and (dropped, padded) == (0, 3)
    with pytest.raises(ValueError):
        fit_pool(np.arange(5), 8, "truncate", rng)


@SETTINGS
@given(costs=cost_arrays(), k=st.integers(1, 80), cuts=st.lists(st.integers(0, 400), max_size=4))
def test_streamed_quantile_edges_are_quantile_edges_byte_for_byte(
    costs: np.ndarray, k: int, cuts: list
) -> None:
    """The costs in pieces (empty ones too), never joined: the same edges, bit for bit, and the same
    values at any sorted positions."""
    pieces = np.split(costs, sorted(c for c in cuts if c <= costs.size))
    edges = streamed_quantile_edges(lambda: iter(pieces), costs.size, k)
    assert edges.tobytes() == quantile_edges(costs, k).tobytes()
    if costs.size:
        at = np.arange(0, costs.size, max(1, costs.size // 7))
        np.testing.assert_array_equal(sorted_values(lambda: iter(pieces), at), np.sort(costs)[at])


def test_streamed_quantile_edges_order_every_sign_and_magnitude() -> None:
    rng = np.random.default_rng(3)
    costs = np.concatenate(
        [-np.exp(rng.normal(0, 30, 500)), np.exp(rng.normal(0, 30, 500)), [0.0, -0.0, 5e-324]]
    )
    costs = rng.permutation(costs)
    pieces = np.array_split(costs, 5)
    at = np.arange(costs.size)
    np.testing.assert_array_equal(sorted_values(lambda: iter(pieces), at), np.sort(costs))
    with pytest.raises(ValueError, match="finite"):
        streamed_quantile_edges(lambda: iter([np.array([1.0, np.inf])]), 2, 2)
