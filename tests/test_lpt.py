"""The one LPT (transforms/plan/lpt.py): its three runs give the scalar rule's assignment."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard.transforms.plan.lpt import CountRoom, lpt_assign, lpt_free, lpt_heap, lpt_rounds


def _rule(key0: np.ndarray, tie: np.ndarray, x: np.ndarray, size: list[int] | None = None) -> list[int]:
    """The rule in plain Python: each item to the smallest (key, tie, bin) with a free place."""
    key, count, out = key0.tolist(), [0] * key0.size, []
    for step in x.tolist():
        free = [b for b in range(key0.size) if size is None or count[b] < size[b]]
        b = min(free, key=lambda b: (key[b], tie[b], b))
        key[b] += step
        count[b] += 1
        out.append(b)
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key0 (n,), tie (n,), x (K,) heaviest first): small integers, so exact ties are common."""
    n = draw(st.integers(1, 9))
    k = draw(st.integers(0, 5 * n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    key0 = -rng.integers(0, 4, n).astype(np.float64) * draw(st.sampled_from([0.0, 1.0]))
    x = np.sort(rng.integers(0, 5, k).astype(np.float64))[::-1].copy()
    tie = rng.integers(0, 2, n).astype(np.float64) if draw(st.booleans()) else np.zeros(n)
    return key0, tie, x


@settings(max_examples=200, deadline=None, derandomize=True)
@given(case=cases())
def test_rounds_and_heap_follow_the_rule(case: tuple) -> None:
    key0, tie, x = case
    items = np.arange(x.size)
    assert lpt_rounds(key0, tie, x).tolist() == _rule(key0, tie, x)
    room = CountRoom(key0.size, max(x.size, 1))
    assert lpt_heap(key0, tie, items, x, room).tolist() == _rule(key0, tie, x)  # type: ignore[union-attr]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(w=st.integers(1, 5), b=st.integers(1, 4), steps=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_equal_count_assign_follows_the_rule(w: int, b: int, steps: int, seed: int) -> None:
    _follows_the_rule(np.random.default_rng(seed).integers(0, 4, (steps, w * b)).astype(np.float64), w, b)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(w=st.integers(1, 64), steps=st.integers(1, 6), low=st.integers(0, 1), seed=st.integers(0, 2**32 - 1))
def test_two_each_follows_the_rule(w: int, steps: int, low: int, seed: int) -> None:
    """B = 2 up to W = 64: steps whose W heaviest items are all > 0 (``low`` 1: every step) take a closed
    form, the others the loop; ties are common (costs 0..3)."""
    _follows_the_rule(np.random.default_rng(seed).integers(low, 4, (steps, 2 * w)).astype(np.float64), w, 2)


def _follows_the_rule(costs: np.ndarray, w: int, b: int) -> None:
    """``lpt_assign`` of ``costs`` (S, W*B) is the rule's and the heap's assignment, slots in item order."""
    steps, got = costs.shape[0], lpt_assign(costs, w, b)
    for s in range(steps):
        order = np.argsort(-costs[s], kind="stable")
        to = _rule(np.zeros(w), np.zeros(w), costs[s][order], [b] * w)
        heap = lpt_heap(np.zeros(w), np.zeros(w), order, costs[s][order], CountRoom(w, b))
        assert heap is not None and heap.tolist() == to
        for r in range(w):
            assert got[s, r].tolist() == order[np.asarray(to) == r].tolist()  # slot order = item order


def test_count_room_gives_the_extra_places_to_the_first_bins_to_fill() -> None:
    room = CountRoom(3, 1, 1)  # 4 items on 3 bins: one bin takes 2
    assert [room.add(0, 0), room.add(1, 1), room.add(0, 2)] == [False, False, True]
    assert room.blocked(1, 3) == 2 and room.blocked(2, 3) == -1  # extras used up: bin 1 is full


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    w=st.integers(1, 6), n_extra=st.integers(0, 12), steps=st.integers(1, 4), seed=st.integers(0, 2**32 - 1)
)
def test_free_count_split_follows_the_rule(w: int, n_extra: int, steps: int, seed: int) -> None:
    """Positive costs, equal speeds, no caps: the rule itself (the W heaviest fill the W empty ranks)."""
    rng = np.random.default_rng(seed)
    costs = rng.integers(1, 5, (steps, w + n_extra)).astype(np.float64)
    got = lpt_free(costs, w)
    for s in range(steps):
        order = np.argsort(-costs[s], kind="stable")
        assert got[s][order].tolist() == _rule(np.zeros(w), np.zeros(w), costs[s][order])
    speeds = rng.uniform(0.5, 2.0, w)  # with speeds: the heaviest to the fastest, each rank at least one
    fast = lpt_free(costs, w, speeds)
    assert all(set(row.tolist()) == set(range(w)) for row in fast)
    assert (fast[np.arange(steps), np.argmax(costs, axis=1)] == np.argmax(speeds)).all()
    ones = np.ones((steps, costs.shape[1], 1))  # a samples cap of 2 a rank-step: never more where it fits
    capped = lpt_free(costs, w, None, ones, np.array([2.0]))
    if costs.shape[1] <= 2 * w:
        assert all(np.bincount(row, minlength=w).max() <= 2 for row in capped)
