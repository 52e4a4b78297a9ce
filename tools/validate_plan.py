"""Epoch checks of ``lidarshard validate``: each plan row's sample, the counts, caps, the step order
(``--heaviest-first``), coverage and balance, checked one step group at a time (``validate_epoch`` drives
them; the plan re-derived from the samples is checked by ``validate_derived``). One plan file's own
structure: ``validate_files.check_plan``.

Pure pyarrow/numpy. Each check appends ``"<where>: <what>"`` lines to ``problems``; where names the
file, epoch, rank, step and slot as precisely as the problem allows. A group's plan is (S_g, W, M)
sample rows with its steps in order; ``steps`` (S_g,) are their steps in the epoch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_repeat import check_realized
from lidarshard.tools.validate_samples import Samples
from lidarshard.transforms.features.repeat import repeat_counts
from lidarshard.transforms.plan.caps import Breach, Caps, cap_breaches, rank_step_sums
from lidarshard.transforms.plan.memory import MemoryModel
from lidarshard.transforms.plan.metrics import BalanceSums, balance_entry, plan_sums
from lidarshard.transforms.plan.order import step_peaks

__all__ = [
    "local_rows", "cap_values", "group_breaches",
    "report_breaches", "heaviest_values", "Heaviest", "Coverage", "file_sums",
    "check_balance",
]  # fmt: skip


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def local_rows(members: NDArray[np.integer], rows: NDArray[np.integer]) -> NDArray[np.int64]:
    """(n,) the position of each samples row of ``rows`` among a group's ``members`` (ascending, holding
    them); the rows themselves when the group is every sample (G = 1)."""
    if members.size and members[0] == 0 and members[-1] == members.size - 1:
        return np.asarray(rows, dtype=np.int64)
    return np.searchsorted(members, rows)


#: (costs (n,), points (n,) or None, predicted bytes (n,) or None) of one group's samples: what the caps
#: are checked on.
CapValues = tuple[NDArray, NDArray | None, NDArray | None]


def cap_values(problems: list[str], e: int, caps: Caps, samples: pa.Table) -> CapValues:
    """What epoch ``e``'s caps are checked on, of each of ``samples`` (a group's; its predicted bytes only
    under a memory cap)."""
    costs, points = samples.column("cost").to_numpy(), samples.column("num_points").to_numpy()
    memory = None
    if caps.memory is not None:
        try:
            memory = caps.memory.model.sample_bytes(samples)
        except (ValueError, KeyError) as err:
            _add(problems, f"epoch {e}", f"the memory cap cannot be checked: {err}")
    return costs, points, memory


def group_breaches(
    plan: NDArray[np.int64], steps: NDArray[np.integer], caps: Caps, values: CapValues
) -> list[Breach]:
    """``cap_breaches`` of one group's plan (S_g, W, M), their steps those of the epoch (``steps``)."""
    return [dataclasses.replace(b, step=int(steps[b.step])) for b in cap_breaches(plan, caps, *values)]


def report_breaches(
    problems: list[str], e: int, breaches: Sequence[Breach], file_of: Callable[[int, int], str]
) -> None:
    """One line per cap over which any group's rank-step is (``group_breaches``): its first (step, rank)
    in the epoch and how many rank-steps of the epoch are over."""
    for name in ("samples", "cost", "points", "memory"):
        found = [b for b in breaches if b.name == name]
        if found:
            b = min(found, key=lambda x: (x.step, x.rank))
            b = dataclasses.replace(b, count=sum(x.count for x in found))
            _add(
                problems,
                f"{file_of(e, b.rank)}: epoch {e} step {b.step} rank {b.rank}",
                f"{b.detail()} ({b.count} rank-steps over)",
            )


def heaviest_values(mode: str, samples: pa.Table, model: MemoryModel | None) -> NDArray | None:
    """(n,) what ``--heaviest-first`` ``mode`` (the manifest's) weighs each of ``samples`` by, or None when there
    is nothing to check (``off``; ``memory`` without the manifest's memory ``model``: PlanConfig refuses
    it)."""
    if mode == "memory":
        return None if model is None else model.sample_bytes(samples)
    if mode in ("points", "cost"):
        return samples.column("num_points" if mode == "points" else "cost").to_numpy()
    return None


class Heaviest:
    """``--heaviest-first`` ``mode`` over an epoch's groups: step 0 holds the epoch's heaviest rank-step by
    each group's ``heaviest_values`` (``order.step_peaks``; cost and memory sums within a relative 1e-9,
    as summation order may round them)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.top: tuple[float, int, int] | None = None  # (peak, its step in the epoch, its rank)
        self.first: float | None = None  # step 0's peak

    def add(self, plan: NDArray[np.int64], steps: NDArray[np.integer], values: NDArray | None) -> None:
        """One group's plan (S_g, W, M) over its samples' ``values`` (n_g,; None: nothing to check), its
        steps in the epoch ``steps`` (S_g,)."""
        if values is None or plan.shape[0] == 0:
            return
        peaks = step_peaks(plan, values)
        k = int(np.argmax(peaks))
        top, step = float(peaks[k]), int(steps[k])
        if self.top is None or top > self.top[0] or (top == self.top[0] and step < self.top[1]):
            self.top = (top, step, int(np.argmax(rank_step_sums(plan[k : k + 1], values)[0])))
        at = np.flatnonzero(steps == 0)
        if at.size:
            self.first = float(peaks[int(at[0])])

    def check(self, problems: list[str], e: int, steps: int, file_of: Callable[[int, int], str]) -> None:
        """After every group of epoch ``e`` (``steps`` S): a problem when a later step is heavier."""
        if steps < 2 or self.top is None or self.first is None:
            return
        (top, k, r), first = self.top, self.first
        if top - first > (0 if self.mode == "points" else 1e-9 * max(abs(top), 1.0)):
            _add(
                problems,
                f"{file_of(e, r)}: epoch {e} step {k} rank {r}",
                f"{top:.6g} {self.mode} is more than step 0's heaviest rank-step ({first:.6g}), but the "
                f"manifest records heaviest_first {self.mode}: step 0 must hold the epoch's heaviest rank-step",
            )


class Coverage:
    """Coverage of one epoch over its groups, from how often each sample is planned (``seen``).

    Weights all 1: drop_last plans each sample at most once and planned = accepted - dropped; pad plans
    each at least once and planned = accepted + padded. Other weights: no sample beyond
    ceil(bucket weight x sample weight) copies (+1 under pad). With ``held``
    (``validate_repeat.check_sample_weights``) the copies per class are summed for ``repeat.realized``.
    Whether every weight is 1 is known after the last group, so both are followed.
    """

    def __init__(self, m: Manifest, held: tuple | None) -> None:
        per_bucket = np.asarray(m.buckets.weights, dtype=np.float64)
        self.bucket = None if (per_bucket == 1).all() else per_bucket
        self.ones = True  # every sample's weight (x its bucket's) is 1
        self.pad, self.held = m.policy == "pad", held
        self.entries = 0
        self.most = (0, -1)  # (copies, the first sample planned that often)
        self.never = (0, -1)  # (samples never planned, the first of them)
        self.over: tuple[int, int, float] | None = None  # (first sample over its weight, copies, weight)
        self.realized: dict[str, float] = {}

    def add(self, group: pa.Table, entries: NDArray[np.integer]) -> None:
        """One group: its samples ``group`` (``Samples.group`` as planned: ``weight``, ``bucket_id``
        and ``row`` (n_g,), ascending), the sample rows of its plan rows ``entries``."""
        members = group.column("row").to_numpy()
        weights = group.column("weight").to_numpy()  # x bucket weights, all 1 in a re-plan's earlier epochs
        if self.bucket is not None:
            weights = self.bucket[group.column("bucket_id").to_numpy()] * weights
        self.ones &= bool((weights == 1).all())
        self.entries += entries.size
        seen = np.bincount(local_rows(members, entries), minlength=members.size)
        if self.held is not None:
            (presence,) = self.held
            part = repeat_counts(None if presence is None else presence[members], seen)
            for k, v in part.items():
                self.realized[k] = self.realized.get(k, 0.0) + v
        i = int(np.argmax(seen)) if seen.size else 0
        if seen.size and (seen[i], -members[i]) > (self.most[0], -self.most[1]):
            self.most = (int(seen[i]), int(members[i]))
        zero = np.flatnonzero(seen == 0)
        if zero.size:
            first = int(members[zero[0]]) if self.never[1] < 0 else min(self.never[1], int(members[zero[0]]))
            self.never = (self.never[0] + zero.size, first)
        bad = np.flatnonzero(seen > np.ceil(weights) + self.pad)
        if bad.size and (self.over is None or members[bad[0]] < self.over[0]):
            i = int(bad[0])
            self.over = (int(members[i]), int(seen[i]), float(weights[i]))

    def check(self, problems: list[str], m: Manifest, e: int, samples: Samples) -> None:
        """After every group of epoch ``e``: the counts and copies against manifest ``m``."""
        n, where = samples.num_rows, f"epoch {e}"
        planned, dropped, padded = m.counts.planned[e], m.counts.dropped[e], m.counts.padded[e]
        if planned != self.entries:
            _add(problems, where, f"counts.planned {planned} != {self.entries} plan rows")
        sid = samples.column("sample_id")
        if self.ones and m.policy == "drop_last":
            if self.most[0] > 1:
                _add(
                    problems,
                    where,
                    f"sample {sid[self.most[1]]} planned {self.most[0]} times under drop_last",
                )
            if planned != n - dropped or padded:
                _add(
                    problems,
                    where,
                    f"planned {planned} != accepted {n} - dropped {dropped} (padded {padded})",
                )
        elif self.ones:
            if self.never[0]:
                _add(
                    problems,
                    where,
                    f"{self.never[0]} samples never planned under pad, first {sid[self.never[1]]}",
                )
            if planned != n + padded or dropped:
                _add(
                    problems,
                    where,
                    f"planned {planned} != accepted {n} + padded {padded} (dropped {dropped})",
                )
        elif self.over is not None:
            i, seen, weight = self.over
            _add(
                problems,
                where,
                f"sample {sid[i]} planned {seen} times, more than bucket weight x sample weight {weight:.6g} allows",
            )
        if self.held is not None:
            check_realized(problems, m, e, {k: round(v, 6) for k, v in self.realized.items()})


def file_sums(
    plan: NDArray[np.int64],
    costs: NDArray[np.float64],
    batch_size: int,
    speeds: Sequence[float] | None,
    step_cost: float = 0.0,
) -> BalanceSums:
    """One group's balance sums (``metrics.plan_sums``) of its plan (S_g, W, M) as the plan files
    hold it, over its samples' ``costs`` (n_g,; the plan's entries index them): its pool is its entries by
    sample row (as the build pools a group); no random reference (the files hold none); every rank-step
    adds ``step_cost`` (the cost model's ``launch_ms``)."""
    pool = np.sort(plan[plan >= 0])
    in_pool = np.searchsorted(pool, plan)
    in_pool[plan < 0] = -1
    return plan_sums(in_pool, costs[pool], batch_size, None, speeds, step_cost)


def check_balance(
    problems: list[str], m: Manifest, e: int, sums: Sequence[BalanceSums], derived: dict | None
) -> None:
    """Every ``balance`` number of epoch ``e`` recomputed from its groups' ``file_sums`` (``balance_entry``,
    within 1e-6), but ``random_linearity`` and ``random_speed_linearity``: the files hold no random plan,
    so they are the re-derived epoch's stats (``derived``; not checked when None)."""
    again: dict = balance_entry(sums, e)
    recorded = m.balance[e]
    for key in ("random_linearity", "random_speed_linearity"):
        again.pop(key, None)
        known = key != "random_speed_linearity" or recorded.value(key) is not None
        if derived is not None and key in derived and known:
            again[key] = derived[key]  # absent from manifests written before it was
    for key, value in again.items():
        got = recorded.value(key) if key not in ("epoch", "steps", "max_count") else getattr(recorded, key)
        if got is None or not abs(got - value) <= 1e-6:
            _add(problems, f"epoch {e}", f"balance.{key} recorded {got}, recomputed {value:.6f}")
