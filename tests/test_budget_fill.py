"""``budget``'s fill (transforms/plan/_budget_fill.py): vectorized rounds == the scalar heap."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard.transforms.plan._budget_fill import CapState, Packed, fill, lpt_capped
from lidarshard.transforms.plan.caps import Caps, PoolLimits
from lidarshard.transforms.plan.lpt import lpt_heap, lpt_rounds


def _heap(key0: np.ndarray, tie: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The scalar heap without caps on the same keys (the reference the rounds must match)."""
    items = np.arange(x.size)
    return lpt_heap(key0, tie, items, x, CapState(PoolLimits(Caps()), x, items[:0], key0.size))


@st.composite
def fills(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key0 (n,), tie (n,), x (K,)): integer keys and costs (many exact ties, the merge's lexsort
    branch) or continuous ones (its searchsorted branch); K up to 12 items per bin."""
    n = draw(st.integers(1, 300))
    k = draw(st.integers(0, 12 * n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        key0 = -rng.integers(0, 6, n).astype(np.float64)
        x = rng.integers(1, 4, k).astype(np.float64)
    else:
        key0 = -rng.lognormal(0.0, 1.0, n) * draw(st.sampled_from([0.0, 1.0, 50.0]))
        x = np.sort(rng.lognormal(0.0, draw(st.sampled_from([0.3, 1.0, 2.0])), k))[::-1].copy()
        x = x + rng.uniform(-0.1, 0.1, k) * x * draw(st.sampled_from([0.0, 1.0]))  # jittered order
    tie = rng.random(n) if draw(st.booleans()) else np.zeros(n)  # zeros: the bin id breaks ties
    return key0, tie, x


@settings(max_examples=150, deadline=None, derandomize=True)
@given(case=fills())
def test_rounds_give_the_heaps_assignment(case: tuple) -> None:
    key0, tie, x = case
    np.testing.assert_array_equal(lpt_rounds(key0, tie, x), _heap(key0, tie, x))


def test_rounds_on_a_large_heavy_tailed_fill_match_the_heap() -> None:
    rng = np.random.default_rng(3)
    x = np.sort(rng.lognormal(0.0, 1.5, 60_000))[::-1].copy()
    key0 = np.full(20_000, -x.sum() / 20_000)
    key0[:64] = -x[0]  # one high step: 64 bins target the heaviest item, filled by many small ones
    tie = rng.random(key0.size)
    np.testing.assert_array_equal(lpt_rounds(key0, tie, x), _heap(key0, tie, x))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=fills(), seed=st.integers(0, 2**32 - 1), zeros=st.integers(0, 20))
def test_fill_with_caps_that_never_bind_equals_the_uncapped_fill(case: tuple, seed: int, zeros: int) -> None:
    key0, tie, x = case
    costs = np.concatenate([x, np.zeros(zeros)])
    rest = np.random.default_rng(seed).permutation(costs.size)
    rest = rest[np.argsort(-costs[rest], kind="stable")]  # heaviest first, zeros interleaved last
    free = fill(rest[:0], rest, -key0, costs, tie, PoolLimits(Caps()))
    loose = fill(rest[:0], rest, -key0, costs, tie, PoolLimits(Caps(max_samples=costs.size + 1)))
    assert (free is None) == (loose is None)
    if free is not None:
        for a, b in ((free.members, loose.members), (free.counts, loose.counts), (free.loads, loose.loads)):
            np.testing.assert_array_equal(a, b)
        assert (free.counts >= 1).all()
        np.testing.assert_array_equal(np.sort(free.members), np.arange(costs.size))


def test_repair_moves_the_last_item_of_the_fullest_bin_into_each_empty_bin() -> None:
    costs = np.array([5.0, 1.0, 2.0, 3.0, 4.0])
    packed = Packed.of(4, np.array([0, 1, 2, 3, 4]), np.array([0, 0, 0, 1, 1]), costs)
    fixed = packed.repair_empty(costs)
    np.testing.assert_array_equal(fixed.counts, [1, 2, 1, 1])
    np.testing.assert_array_equal(fixed.loads, [5.0, 7.0, 2.0, 1.0])  # bin 0 gave 2, then 1
    layout = np.array([[0, 1], [2, 3]])
    np.testing.assert_array_equal(fixed.padded(layout), [[[0, -1], [3, 4]], [[2, -1], [1, -1]]])
    assert Packed.of(3, np.array([0, 1]), np.array([0, 1]), costs).repair_empty(costs) is None


def _naive_capped(key0: np.ndarray, tie: np.ndarray, items: np.ndarray, x: np.ndarray, state: CapState):
    """The definition: each item to the smallest ``(key, tie, bin)`` among the bins it fits (a scan)."""
    key, out = key0.tolist(), []
    for item, step in zip(items.tolist(), x.tolist(), strict=True):
        fit = [(key[b], tie[b], b) for b in range(key0.size) if state.blocked(b, item) < 0]
        if not fit:
            return None
        b = min(fit)[2]
        out.append(b)
        state.add(b, item)
        key[b] += step
    return np.asarray(out, dtype=np.int64)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    case=fills(), seed=st.integers(0, 2**32 - 1), which=st.sampled_from(["cost", "points", "samples", "all"])
)
def test_capped_fills_park_blocked_bins_and_match_the_definition(case: tuple, seed: int, which: str) -> None:
    key0, tie, x = case
    n, rng = key0.size, np.random.default_rng(seed)
    costs = np.maximum(x, 0.0)
    points = rng.integers(1, 100, x.size)
    per_bin = max(1, -(-x.size // n))
    caps = Caps(
        max_cost=float(max(costs.max(initial=0.0), 1e-9) * rng.uniform(1.0, 3.0))
        if which in ("cost", "all")
        else None,
        max_points=int(points.max(initial=1) * rng.uniform(1.0, 3.0)) if which in ("points", "all") else None,
        max_samples=int(per_bin + rng.integers(0, 3)) if which in ("samples", "all") else None,
    )
    limits = PoolLimits(caps, points)
    items = np.arange(x.size)
    want = _naive_capped(key0, tie, items, costs, CapState(limits, costs, items[:0], n))
    for fn in (lpt_heap, lpt_capped):
        got = fn(key0, tie, items, costs, CapState(limits, costs, items[:0], n))
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_array_equal(got, want)
