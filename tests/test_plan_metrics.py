"""Balance metrics (transforms/plan/metrics.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lidarshard.schemas.balance_entry import BALANCE_NUMBERS, BalanceEntry
from lidarshard.transforms.plan import plan_epoch
from lidarshard.transforms.plan.explain import COLUMNS, plan_buys
from lidarshard.transforms.plan.metrics import (
    REFERENCE_KEY,
    balance_summary,
    greedy_reference_linearity,
    linearity,
    load_linearity,
    mate_cost_correlation,
    pair_repeat_rate,
    rank_costs,
    spearman_step_cost,
    step_linearity,
)


def test_rank_costs_and_linearity_by_hand() -> None:
    costs = np.array([1.0, 2.0, 3.0, 4.0])
    plan = np.array([[[0, 1], [2, 3]]])  # one step: rank 0 = 3, rank 1 = 7
    np.testing.assert_array_equal(rank_costs(plan, costs), [[3.0, 7.0]])
    assert linearity(plan, costs) == pytest.approx(5.0 / 7.0)
    assert linearity(np.array([[[0, 3], [1, 2]]]), costs) == 1.0
    assert linearity(plan, np.zeros(4)) == 1.0
    assert linearity(np.empty((0, 2, 2), np.int64), costs) == 1.0


def test_load_linearity_by_hand() -> None:
    loads = np.array([[3.0, 7.0], [5.0, 5.0]])  # means 5, 5; maxima 7, 5
    assert load_linearity(loads) == pytest.approx(10.0 / 12.0)
    assert load_linearity(np.zeros((3, 4))) == 1.0 and load_linearity(np.empty((0, 4))) == 1.0
    assert load_linearity(np.array([[0.0, 0.0, 0.0, 8.0]])) == pytest.approx(0.25)  # 1/W: one rank works
    # a step split by LPT: {4, 1} vs {3, 2} -> loads 5, 5
    assert step_linearity(np.array([[1.0, 2.0, 3.0, 4.0]]), 2, 2) == 1.0


def test_greedy_reference_linearity() -> None:
    costs = np.random.default_rng(0).lognormal(0.0, 1.0, 4096)
    reference = greedy_reference_linearity(costs, 16, 2)
    rand = linearity(plan_epoch("random", costs, 16, 2, seed=0, epoch=0), costs)
    assert rand < reference <= 1.0
    assert greedy_reference_linearity(np.ones(64), 8, 2) == 1.0
    with pytest.raises(ValueError):
        greedy_reference_linearity(np.ones(10), 4, 2)


def _entry(**numbers: float) -> BalanceEntry:
    """A balance entry of ``numbers`` (the rest 0.5; epoch 0, 10 steps, 2 a rank-step)."""
    values = dict.fromkeys(BALANCE_NUMBERS, 0.5) | {"epoch": 0, "steps": 10, "max_count": 2} | numbers
    return BalanceEntry.parse(values, "balance[0]")


def test_balance_entries_are_typed_and_checked() -> None:
    e = _entry(greedy_reference=0.97, linearity=1)
    assert (
        e.value(REFERENCE_KEY) == 0.97 and e.value("linearity") == 1.0 and e.value("speed_linearity") is None
    )
    assert BalanceEntry.parse(e.to_json(), "again") == e
    with pytest.raises(ValueError, match="greedy_reference"):
        BalanceEntry.parse({k: v for k, v in e.to_json().items() if k != REFERENCE_KEY}, "balance[0]")
    with pytest.raises(ValueError, match="linearity"):
        _entry(linearity="high")  # a malformed manifest, refused where it is read


@pytest.mark.parametrize(
    ("linearity_", "random_", "words"),
    [
        (
            0.9580,
            0.8230,
            "epoch 0: predicted time 0.86x a random plan's (14% less time): ranks wait 4.2% of it "
            "instead of 17.7%",
        ),  # fmt: skip
        (
            0.9,
            0.9,
            "predicted time 1.00x a random plan's (the same): ranks wait 10.0% of it instead of 10.0%",
        ),
        (0.8, 0.9, "predicted time 1.12x a random plan's (12% more time)"),
    ],
)
def test_plan_buys_in_plain_words(linearity_: float, random_: float, words: str) -> None:
    line = plan_buys(_entry(linearity=linearity_, random_linearity=random_))
    assert line is not None and words in line
    assert plan_buys(_entry(linearity=0.0, random_linearity=0.8)) is None  # nothing to compare with


def test_every_printed_column_is_explained() -> None:
    assert {"linearity", "random", "greedy_reference", "spearman", "pair repeat rate"} <= set(COLUMNS)
    assert all(len(text) > 40 for text in COLUMNS.values())


def test_spearman_step_cost() -> None:
    costs = np.arange(64, dtype=np.float64)
    ascending = np.arange(64).reshape(16, 2, 2)
    assert spearman_step_cost(ascending, costs) == pytest.approx(1.0)
    assert spearman_step_cost(ascending[::-1], costs) == pytest.approx(-1.0)
    assert spearman_step_cost(ascending, np.ones(64)) == 0.0
    assert spearman_step_cost(ascending[:1], costs) == 0.0
    shuffled = plan_epoch("random", np.ones(4096), 8, 2, seed=0, epoch=0)
    assert abs(spearman_step_cost(shuffled, np.arange(4096.0))) < 0.1


def test_pair_repeat_rate() -> None:
    p, w, b = 8192, 8, 4
    a = plan_epoch("random", np.ones(p), w, b, seed=0, epoch=0)
    assert pair_repeat_rate(a, a) == 1.0
    regrouped = a[::-1, ::-1, ::-1]  # same steps, other order and slots
    assert pair_repeat_rate(a, regrouped) == 1.0
    c = plan_epoch("random", np.ones(p), w, b, seed=0, epoch=1)
    expected = (w * b - 1) / (p - 1)
    assert pair_repeat_rate(a, c) == pytest.approx(expected, rel=0.3)
    assert pair_repeat_rate(np.arange(4).reshape(4, 1, 1), np.arange(4).reshape(4, 1, 1)) == 0.0
    half = np.arange(8).reshape(2, 2, 2)
    other = np.array([0, 1, 4, 5, 2, 3, 6, 7]).reshape(2, 2, 2)  # 2 of 6 pairs per step kept
    assert pair_repeat_rate(half, other) == pytest.approx(2 / 6)


def test_mate_cost_correlation() -> None:
    costs = np.arange(32, dtype=np.float64)
    sorted_steps = np.arange(32).reshape(8, 2, 2)  # {0..3}, {4..7}, ...: mates share the size
    assert mate_cost_correlation(sorted_steps, costs) > 0.95
    mixed_steps = np.array([0, 7, 1, 6, 2, 5, 3, 4]).reshape(2, 2, 2)  # equal sums per step
    assert mate_cost_correlation(mixed_steps, costs[:8]) == pytest.approx(-1.0)
    assert mate_cost_correlation(sorted_steps, np.ones(32)) == 0.0
    assert mate_cost_correlation(np.arange(4).reshape(4, 1, 1), costs) == 0.0
    shuffled = plan_epoch("random", np.ones(4096), 8, 2, seed=0, epoch=0)
    assert abs(mate_cost_correlation(shuffled, np.arange(4096.0))) < 0.05


def test_balance_summary_is_json_and_rounded() -> None:
    costs = np.random.default_rng(1).lognormal(0.0, 0.6, 16 * 2 * 64)
    plan = plan_epoch("balanced", costs, 16, 2, seed=3, epoch=4)
    rand = plan_epoch("random", costs, 16, 2, seed=3, epoch=4)
    summary = balance_summary(plan, costs, 16, 2, baseline=rand, epoch=4)
    assert json.loads(json.dumps(summary)) == summary
    assert {"epoch", "linearity", REFERENCE_KEY, "random_linearity", "spearman_step_cost"} <= set(summary)
    assert "bound" not in summary
    assert summary["epoch"] == 4 and summary["steps"] == 64
    for key, value in summary.items():
        if isinstance(value, float):
            assert value == round(value, 6), key
    assert summary["random_linearity"] < summary["linearity"] <= 1.0
    assert summary["linearity"] == round(linearity(plan, costs), 6)
    assert summary["random_linearity"] == round(linearity(rand, costs), 6)
