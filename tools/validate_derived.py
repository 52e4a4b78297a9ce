"""``lidarshard validate``'s checks against the plan re-derived from the samples, one step group at a
time: each epoch planned again with the recorded strategy, seed and settings (G = 1: ``plan_samples``;
G > 1: each group alone, ``groups.plan_group``, and the interleave of the groups' step counts) must give
the plan files' plan and counts, and epochs 0 and 1 the recorded ``pair_repeat_rate`` (the build's sums,
``group_rows.pair_counts``). No group's plan outlives its checks. Pure numpy; appends
``"<where>: <what>"`` lines to ``problems``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools.validate_keys import append_split, load_raw
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.epochs import plan_samples
from lidarshard.transforms.core.group_rows import pair_counts
from lidarshard.transforms.core.groups import GroupSummary, epoch_stats, group_table, plan_group, step_labels
from lidarshard.transforms.io import storage
from lidarshard.transforms.io.scratch import pair_path, read_columns, write_columns

__all__ = [
    "PAIR_ROWS",
    "Derived",
    "check_replan",
    "check_derived_counts",
    "check_steps",
    "PairRepeat",
    "check_repeat_rate",
]

#: One group re-derived: (plan (S_g, W, M), its random reference (S'_g, W, B)), sample rows.
Planned = tuple[NDArray[np.int64], NDArray[np.int64]]


def _add(problems: list[str], where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


class Derived:
    """Epoch ``e`` planned again with the recorded settings ``cfg`` (None: not valid, nothing derived),
    one of its ``groups`` step groups at a time."""

    def __init__(self, problems: list[str], m: Manifest, cfg: PlanConfig | None, e: int, groups: int) -> None:
        self.problems, self.m, self.cfg, self.e, self.groups = problems, m, cfg, e, groups
        self.failed = cfg is None
        self.summaries: list[GroupSummary] = []
        self.stats: dict | None = None  # the epoch's stats, once every group is derived

    def group(self, g: int, samples: Any) -> Planned | None:
        """Group ``g`` planned alone from its ``samples`` (``SamplesView.group`` as the epoch is planned,
        ``epochs.as_planned``: the plan columns and ``row`` (n_g,), ascending), or None when it cannot be
        (a problem, once: no later group is derived)."""
        if self.failed or self.cfg is None:
            return None
        e, cfg = self.e, self.cfg
        try:
            if self.groups == 1:
                whole = plan_samples(samples, e, cfg)
                self.stats = whole.stats
                return whole.plan, whole.baseline
            rows = samples.column("row").to_numpy()
            part = plan_group(group_table(samples, np.arange(rows.size), cfg), rows, e, g, cfg)
        except (ValueError, TypeError, KeyError) as err:
            _add(
                self.problems,
                f"epoch {e}",
                f"the plan cannot be recomputed from strategy {short(self.m.strategy)}: {err}",
            )
            self.failed = True
            return None
        self.summaries.append(part.summary)
        if len(self.summaries) == self.groups:
            self.stats = epoch_stats(self.summaries, e, cfg)
        return part.plan, part.baseline

    def labels(self) -> NDArray[np.int32] | None:
        """(S,) the group of each step of the epoch (``step_labels``), once every group is derived."""
        if self.cfg is None or self.failed or len(self.summaries) != self.groups:
            return None
        return step_labels(self.summaries, self.e, self.cfg)


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
    samples: object,
    group: str = "",
) -> None:
    """One group's plan (S_g, W, M) as the files hold it (its steps in the epoch: ``steps`` (S_g,)) equals
    ``want``, the one the recorded strategy and seed re-derive: catches swapped ranks or steps and a
    forged strategy or seed, whatever the hashes say. ``group``: how messages name it (" step group g"
    when the epoch has several)."""
    want, plan = _trim(want), _trim(plan)
    if want.shape != plan.shape:
        _add(problems, f"epoch {e}{group}", f"plan shape {plan.shape} differs from {_how(m)} {want.shape}")
        return
    diff = np.argwhere(want != plan)
    if diff.size:
        s, r, k = (int(v) for v in diff[0])
        sid = samples.column("sample_id")  # type: ignore[attr-defined]
        _add(
            problems,
            f"{m.plan_file(e, r)}: epoch {e} rank {r} step {int(steps[s])} slot {k}",
            f"{sid[int(plan[s, r, k])]} differs from {_how(m)} ({sid[int(want[s, r, k])]}); {len(diff)} slots differ",
        )


def check_derived_counts(problems: list[str], m: Manifest, e: int, stats: dict) -> None:
    """Epoch ``e``'s planned/dropped/padded counts equal the re-derived epoch's ``stats``."""
    for key in ("planned", "dropped", "padded"):
        got = getattr(m.counts, key)[e]
        if got != stats[key]:
            _add(problems, f"epoch {e}", f"counts.{key} recorded {got}, re-derived {stats[key]}")


def check_steps(
    problems: list[str], m: Manifest, e: int, labels: NDArray[np.int32], owned: Sequence[NDArray[np.integer]]
) -> None:
    """Each group's steps in the epoch as the files hold them (``owned[g]``, ascending) are those the
    re-derived interleave of the groups' steps gives it (``labels`` (S,): the group of each step)."""
    for g, steps in enumerate(owned):
        want = np.flatnonzero(labels == g)
        if steps.shape == want.shape and (steps == want).all():
            continue
        n = min(steps.size, want.size)
        i = int(np.flatnonzero(steps[:n] != want[:n])[0]) if (steps[:n] != want[:n]).any() else n
        got = int(steps[i]) if i < steps.size else None
        at = int(want[i]) if i < want.size else None
        _add(
            problems,
            f"epoch {e} step group {g}",
            f"its step {i} is the epoch's step {got}; {_how(m)} step {at} (the interleave of the groups' steps)",
        )


def _entries(plan: NDArray[np.int64], group: int, groups: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(step ids ``local * G + group``, sample rows) of a group's plan (S_g, W, M), in step order."""
    steps = np.broadcast_to(np.arange(plan.shape[0], dtype=np.int64)[:, None, None], plan.shape)
    valid = plan >= 0
    return steps[valid] * groups + group, plan[valid]


#: Samples per partition of epoch 1's last step ids (``PairRepeat``): what one lookup holds (4 bytes each).
PAIR_ROWS = 1 << 20


class PairRepeat:
    """``pair_repeat_rate`` of epochs 0 and 1 as re-derived, one group at a time: epoch 0's (step id, sample
    row) entries of each group parked in ``work`` (``scratch.pair_path``), epoch 1's (sample row, step id)
    entries parked by row range (``PAIR_ROWS`` samples a partition), then each epoch-0 group's pairs
    counted (``group_rows.pair_counts``: the sums the build adds) against each sample's last epoch-1 step
    id, one partition at a time. Step ids are ``local * G + group``: the same pairs as the epoch's steps,
    whatever the interleave. Holds one group's entries and one partition, not the ``n`` samples."""

    KINDS = ("plan", "random")

    def __init__(self, work: str, n: int, part_rows: int | None = None) -> None:
        self.work, self.n = work, n
        self.part = PAIR_ROWS if part_rows is None else part_rows  # the module's, read now (tests set it)
        self.parts = max(1, -(-n // self.part))
        self.groups: int | None = None  # epoch 0's G
        self.missing = False
        self.second: set[str] = set()  # the kinds of epoch 1 parked

    def _last(self, kind: str, p: int, column: str) -> str:
        return os.path.join(storage.local_path(self.work), "pairs", f"{kind}-last-{p:05d}-{column}.bin")

    def add(self, e: int, g: int, groups: int, planned: Planned | None) -> None:
        """Group ``g`` of ``groups`` of epoch ``e`` as re-derived (None: not, the rates cannot be)."""
        if e > 1:
            return
        if planned is None:
            self.missing = True
            return
        for kind, plan in zip(self.KINDS, planned, strict=True):
            ids, rows = _entries(plan, g, groups)
            if e == 0:
                self.groups = groups
                write_columns(pair_path(self.work, kind, g), {"step": ids, "row": rows})
                continue
            os.makedirs(os.path.dirname(self._last(kind, 0, "row")), exist_ok=True)
            cols: dict[str, NDArray] = {
                "row": rows.astype(np.int64),
                "step": ids.astype(np.int32),
            }  # step order
            append_split(rows // self.part, self.parts, cols, functools.partial(self._last, kind))
            self.second.add(kind)

    def _partner(self, kind: str, rows: NDArray[np.int64]) -> NDArray[np.int64]:
        """(n,) each sample row's last step id in epoch 1 (-1: not planned), a partition at a time."""
        out = np.full(rows.size, -1, np.int64)
        part = rows // self.part
        for p in np.unique(part).tolist():
            start = p * self.part
            last = np.full(min(self.part, self.n - start), -1, np.int32)
            # a sample's copies in step order, so its last copy, its largest step id, wins
            last[load_raw(self._last(kind, p, "row"), np.dtype(np.int64)) - start] = load_raw(
                self._last(kind, p, "step"), np.dtype(np.int32)
            )
            at = np.flatnonzero(part == p)
            out[at] = last[rows[at] - start]
        return out

    def rates(self, strategy: str) -> dict[str, float] | None:
        """``epochs.repeat_rates`` of the two epochs, or None when either was not (wholly) derived."""
        if self.missing or self.groups is None or len(self.second) != len(self.KINDS):
            return None
        out: dict[str, float] = {}
        for kind in self.KINDS:
            pairs = shared = 0
            for g in range(self.groups):
                cols = read_columns(pair_path(self.work, kind, g))
                partner = self._partner(kind, cols["row"].astype(np.int64))
                p, s = pair_counts([np.stack([cols["step"].astype(np.int64), partner], axis=1)])
                pairs, shared = pairs + p, shared + s
            out[strategy if kind == "plan" else "random"] = round(float(shared / pairs), 6) if pairs else 0.0
        return out


def check_repeat_rate(problems: list[str], m: Manifest, again: dict[str, float] | None) -> None:
    """``pair_repeat_rate`` against ``again``, the rates of epochs 0 and 1 as re-derived (``PairRepeat``;
    None: not derived, reported), within 1e-6; null when the manifest has one epoch."""
    got = None if m.pair_repeat_rate is None else dict(m.pair_repeat_rate)
    if m.epochs < 2:
        if got is not None:
            _add(
                problems, "_manifest.json", f"pair_repeat_rate recorded {short(got)}, expected null (1 epoch)"
            )
        return
    if again is None:
        _add(
            problems,
            "_manifest.json",
            "pair_repeat_rate cannot be recomputed (epoch 0 or 1 was not re-derived)",
        )
        return
    same = (
        got is not None and set(got) == set(again) and all(abs(got[k] - v) <= 1e-6 for k, v in again.items())
    )
    if not same:
        _add(problems, "_manifest.json", f"pair_repeat_rate recorded {short(got)}, recomputed {again}")
