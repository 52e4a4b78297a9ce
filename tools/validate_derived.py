"""``lidarshard validate`` against the plan re-derived from the samples, one step group at a time: each epoch
planned again with the recorded strategy, seed and settings (G = 1: ``plan_samples``; G > 1: each group
alone, ``groups.plan_group``, and the interleave of the groups' steps) must give the plan files' plan and
counts; epochs 0 and 1 the recorded ``pair_repeat_rate`` (step-mate pair counts: a query; the rates:
``metrics.repeat_rates``). No group's plan outlives its checks. Each sample's cost and bucket as an epoch
is planned (``cost_history`` applied again) is the view ``planned`` (``planned_values``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_db import Engine
from lidarshard.tools.validate_samples import Samples
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.groups import GroupSummary, epoch_stats, plan_group, step_labels
from lidarshard.transforms.core.planner import as_planned, plan_samples
from lidarshard.transforms.plan.metrics import repeat_rates

__all__ = ["Derived", "planned_values", "check_replan", "check_steps", "PairRepeat", "check_repeat_rate"]

#: One group re-derived: (plan (S_g, W, M), its random reference (S'_g, W, B)), sample rows.
Planned = tuple[NDArray[np.int64], NDArray[np.int64]]


class Derived:
    """Epoch ``e`` planned again with ``cfg`` (None: not valid, nothing derived), a step group at a time."""

    def __init__(self, problems: list[str], m: Manifest, cfg: PlanConfig | None, e: int, groups: int) -> None:
        self.problems, self.m, self.cfg, self.e, self.groups = problems, m, cfg, e, groups
        self.failed = cfg is None
        self.summaries: list[GroupSummary] = []
        self.stats: dict | None = None  # the epoch's stats, once every group is derived

    def group(self, g: int, samples: Any) -> Planned | None:
        """Group ``g`` planned alone from its samples as planned (``row`` (n_g,) ascending), or None when it
        cannot be (a problem, once: no later group is derived)."""
        if self.failed or self.cfg is None:
            return None
        try:
            if self.groups == 1:
                whole = plan_samples(samples, self.e, self.cfg)
                self.stats = whole.stats
                return whole.plan, whole.baseline
            part = plan_group(samples, samples.column("row").to_numpy(), self.e, g, self.cfg)
        except (ValueError, TypeError, KeyError) as err:
            self.problems.append(
                f"epoch {self.e}: the plan cannot be recomputed from strategy {short(self.m.strategy)}: {err}"
            )
            self.failed = True
            return None
        self.summaries.append(part.summary)
        if len(self.summaries) == self.groups:
            self.stats = epoch_stats(self.summaries, self.e, self.cfg)
        return part.plan, part.baseline

    def labels(self) -> NDArray[np.int32] | None:
        """(S,) the group of each step of the epoch (``step_labels``), once every group is derived."""
        if self.cfg is None or self.failed or len(self.summaries) != self.groups:
            return None
        return step_labels(self.summaries, self.e, self.cfg)

    def check_counts(self) -> None:
        """The epoch's planned/dropped/padded counts equal the re-derived epoch's (when derived)."""
        stats = self.stats or {}
        for key in ("planned", "dropped", "padded") if stats else ():
            got, want = getattr(self.m.counts, key)[self.e], stats[key]
            if got != want:
                self.problems.append(f"epoch {self.e}: counts.{key} recorded {got}, re-derived {want}")


def planned_values(
    problems: list[str], samples: Samples, e: int, cfg: PlanConfig | None
) -> PlanConfig | None:
    """The view ``planned`` (rid, cost, bucket_id): each sample's as epoch ``e`` is planned (``as_planned`` a
    chunk at a time) -> ``cfg``, or None when those costs cannot be recomputed (a problem)."""
    db, own = samples.db, "CREATE OR REPLACE VIEW planned AS SELECT rid, cost, bucket_id FROM samples"
    if cfg is None or cfg.planned_with(e) is None:
        db.run(own)
        return cfg
    db.run(
        "CREATE OR REPLACE TABLE recosted (rid BIGINT, cost DOUBLE, bucket_id BIGINT); "
        "CREATE OR REPLACE VIEW planned AS SELECT * FROM recosted"
    )
    try:
        for start, chunk in samples.chunks():
            again = as_planned(chunk, e, cfg)
            cost = again.column("cost").to_numpy()
            bucket = again.column("bucket_id").to_numpy().astype(np.int64)
            part = pa.table({"rid": np.arange(start, start + len(cost)), "cost": cost, "bucket_id": bucket})
            db.run("INSERT INTO recosted SELECT * FROM part", part=part)
    except ValueError as err:
        problems.append(f"epoch {e}: the costs of cost_history cannot be recomputed: {err}")
        db.run(own)
        return None
    return cfg


def _trim(plan: NDArray[np.int64]) -> NDArray[np.int64]:
    """``plan`` (S, W, M) without trailing slot columns that are empty (-1) everywhere."""
    used = np.flatnonzero((plan >= 0).any(axis=(0, 1)))
    return plan[:, :, : int(used[-1]) + 1 if used.size else 0]


def _how(m: Manifest) -> str:
    return f"the plan strategy {m.strategy} with seed {m.seed} recomputes"


def check_replan(
    problems: list[str],
    m: Manifest,
    e: int,
    plan: NDArray[np.int64],
    want: NDArray[np.int64],
    steps: NDArray[np.integer],
    samples: Any,
    group: str = "",
) -> None:
    """One group's plan (S_g, W, M) as the files hold it (its steps in the epoch: ``steps`` (S_g,)) equals
    ``want``, the re-derived one: catches swapped ranks or steps, a forged strategy or seed, whatever the
    hashes say. ``group``: how messages name it (" step group g" when the epoch has several)."""
    want, plan = _trim(want), _trim(plan)
    if want.shape != plan.shape:
        problems.append(f"epoch {e}{group}: plan shape {plan.shape} differs from {_how(m)} {want.shape}")
        return
    diff = np.argwhere(want != plan)
    if diff.size:
        s, r, k = (int(v) for v in diff[0])
        sid = samples.column("sample_id")
        problems.append(
            f"{m.plan_file(e, r)}: epoch {e} rank {r} step {int(steps[s])} slot {k}: {sid[int(plan[s, r, k])]} "
            f"differs from {_how(m)} ({sid[int(want[s, r, k])]}); {len(diff)} slots differ"
        )


def check_steps(
    problems: list[str], m: Manifest, e: int, labels: NDArray[np.int32], owned: Sequence[NDArray[np.integer]]
) -> None:
    """Each group's steps in the epoch as the files hold them (``owned[g]``, ascending) are those the
    re-derived interleave gives it (``labels`` (S,): the group of each step)."""
    for g, steps in enumerate(owned):
        want = np.flatnonzero(labels == g)
        if steps.shape == want.shape and (steps == want).all():
            continue
        n = min(steps.size, want.size)
        i = int(np.flatnonzero(steps[:n] != want[:n])[0]) if (steps[:n] != want[:n]).any() else n
        got, at = (int(v[i]) if i < v.size else None for v in (steps, want))
        problems.append(
            f"epoch {e} step group {g}: its step {i} is the epoch's step {got}; {_how(m)} step {at} "
            "(the interleave of the groups' steps)"
        )


class PairRepeat:
    """``pair_repeat_rate`` of epochs 0 and 1 as re-derived: each group's (step id ``local * G + group``,
    sample row) entries of both plans go to the table ``pairs``; the step-mate pair counts are a query (each
    epoch-0 entry against its sample's last epoch-1 step id), the rates ``metrics.repeat_rates`` of them."""

    KINDS = ("plan", "random")

    def __init__(self, db: Engine) -> None:
        self.db, self.missing, self.seen = db, False, set[int]()
        db.run("CREATE OR REPLACE TABLE pairs (epoch TINYINT, kind TINYINT, rid BIGINT, step BIGINT)")

    def add(self, e: int, g: int, groups: int, planned: Planned | None) -> None:
        """Group ``g`` of ``groups`` of epoch ``e`` as re-derived (None: not, the rates cannot be)."""
        if e > 1:
            return
        self.missing |= planned is None
        for kind, plan in enumerate(planned or ()):
            steps = np.broadcast_to(np.arange(plan.shape[0], dtype=np.int64)[:, None, None], plan.shape)
            valid = plan >= 0
            part = pa.table(
                {
                    "epoch": np.full(valid.sum(), e, np.int8),
                    "kind": np.full(valid.sum(), kind, np.int8),
                    "rid": plan[valid],
                    "step": steps[valid] * groups + g,
                }
            )
            self.db.run("INSERT INTO pairs SELECT * FROM part", part=part)
        self.seen.add(e)

    def rates(self, strategy: str) -> dict[str, float] | None:
        """``metrics.repeat_rates`` of the two epochs, or None when either was not (wholly) derived."""
        if self.missing or self.seen != {0, 1}:
            return None
        counts = {kind: [0, 0] for kind in range(len(self.KINDS))}
        # each epoch-0 entry: its step, its sample's last in epoch 1
        for i, keys in enumerate(("s0", "s0, s1")):
            for kind, twice in self.db.rows(
                "WITH last AS (SELECT kind, rid, max(step) AS s1 FROM pairs WHERE epoch = 1 GROUP BY kind, rid), "
                "mates AS (SELECT p.kind, p.step AS s0, l.s1 FROM pairs p LEFT JOIN last l USING (kind, rid) "
                f"WHERE p.epoch = 0) SELECT kind, sum(n * (n - 1))::HUGEINT FROM (SELECT kind, count(*) AS n FROM "
                f"mates {'WHERE s1 IS NOT NULL ' * i}GROUP BY kind, {keys}) GROUP BY kind"
            ):
                counts[kind][i] = int(twice) // 2
        return repeat_rates({k: (counts[i][0], counts[i][1]) for i, k in enumerate(self.KINDS)}, strategy)


def check_repeat_rate(problems: list[str], m: Manifest, again: dict[str, float] | None) -> None:
    """``pair_repeat_rate`` against ``again`` (``PairRepeat.rates``; None: not derived) within 1e-6; null
    when the manifest has one epoch."""
    got = None if m.pair_repeat_rate is None else dict(m.pair_repeat_rate)
    if m.epochs < 2:
        if got is not None:
            problems.append(
                f"_manifest.json: pair_repeat_rate recorded {short(got)}, expected null (1 epoch)"
            )
    elif again is None:
        problems.append(
            "_manifest.json: pair_repeat_rate cannot be recomputed (epoch 0 or 1 was not re-derived)"
        )
    elif got is None or set(got) != set(again) or not all(abs(got[k] - v) <= 1e-6 for k, v in again.items()):
        problems.append(f"_manifest.json: pair_repeat_rate recorded {short(got)}, recomputed {again}")
