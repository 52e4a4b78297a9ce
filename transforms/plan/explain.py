"""The balance numbers in plain words: ``plan_buys`` (one epoch's predicted time against a random plan's, as
the build's summary and the report print it) and ``COLUMNS``, the one glossary of the summary's numbers
(``--help``, docs/CLI.md). The numbers themselves are ``metrics``'. Pure.
"""

from __future__ import annotations

from lidarshard.schemas.balance_entry import BalanceEntry

__all__ = ["plan_buys", "LITTLE_TO_WIN", "COLUMNS"]


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
